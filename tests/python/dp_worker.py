"""One rank of a data-parallel test job (test_dp.py starts it through distrun.py, or runs
it as a single process for the reference): trains a small model on its share of every
global batch and saves what the test compares.

Arguments (JSON in ZS_DP_ARGS): config, steps, global_batch, out (a path prefix), model
("mlp" or "lm"), groups (two parameter groups), inf_at (micro-steps whose loss is made
inf on rank 0: an fp16 overflow on one rank only), slow_step (seconds added to each chunk
of the CPU optimizer step, so that with overlap_forward the next forward runs ahead of it)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402

import zspeed  # noqa: E402


def main():
    a = json.loads(os.environ["ZS_DP_ARGS"])
    zspeed.init_distributed()
    rank, ws = zspeed.comm.get_rank(), zspeed.comm.get_world_size()
    if a.get("model", "mlp") == "lm":
        model = eh.TinyLM()
        data = [torch.cat([b, b.flip(0)]) for b in eh.token_data(a["steps"])]  # 8 sequences each
        loss_fn = eh.lm_loss
    else:
        model = eh.mlp(13, 37, 5)
        data = eh.regression_data(a["steps"], bs=a["global_batch"])
        loss_fn = eh.mse_loss
    params = model.parameters()
    if a.get("groups"):
        ps = list(model.parameters())
        params = [{"params": ps[:2], "weight_decay": 0.0}, {"params": ps[2:]}]
    engine, *_ = zspeed.initialize(model=model, model_parameters=params, config=a["config"])
    if a.get("slow_step"):
        import time
        path = engine.optimizer_path
        host = (path.cpu if getattr(path, "cpu", None) is not None else path).host  # a split's CPU half

        class Slow(type(host)):  # the background step's shallow copy keeps the class
            def step(self, *args, **kw):
                time.sleep(a["slow_step"])
                return super().step(*args, **kw)
        host.__class__ = Slow
    norms, applied = [], []
    for i, batch in enumerate(data):
        if isinstance(batch, (tuple, list)):
            mine = [t.chunk(ws)[rank].to(engine.device) for t in batch]
        else:
            mine = batch.chunk(ws)[rank].to(engine.device)
        loss = loss_fn(engine, mine)
        if i in a.get("inf_at", []) and rank == 0:
            loss = loss * float("inf")
        engine.backward(loss)
        engine.step()
        norms.append(engine.get_global_grad_norm())
        applied.append(engine.was_step_applied())
    # every rank: the last step completes (overlap_forward) and ZeRO-3's persistent parameters hold
    # its weights, as after a synchronous step
    engine.finish_step()
    state = {k: v.detach().float().cpu() for k, v in engine.module.state_dict().items()}
    torch.save({"state": state, "norms": norms, "applied": applied, "skipped": engine.skipped_steps,
                "loss_scale": engine.loss_scale, "ranks": (engine.global_rank, engine.local_rank,
                                                           engine.world_size)},
               f"{a['out']}.{rank}.pt")
    engine.close()


if __name__ == "__main__":
    main()
