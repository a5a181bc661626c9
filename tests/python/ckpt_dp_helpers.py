"""What test_checkpoint_dp.py's ranks and the test process share: the engines under test,
their training loop (each rank takes its share of the same global batches), a dump of an
engine's state by piece, and the merge of several ranks' dumps into whole parameters.

The model puts a small parameter first in its group, so the partition splits the large
weight after it at offsets that are not multiples of 256 (the 8-bit block): re-partitioned
8-bit states are really requantized."""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402
from checkpoint_helpers import same  # noqa: E402  (also used by the tests as h.same)

import zspeed  # noqa: E402

BEFORE, AFTER = 3, 2   # optimizer steps before the save, and after it (the continuation)
GLOBAL_BATCH = 6       # split into 1, 2 or 3 ranks' micro-batches
DATA = eh.regression_data(BEFORE + AFTER, bs=GLOBAL_BATCH)

# name -> (offload device, model precision, optimizer state dtype, ZeRO stage, reduce_bucket_size)
KINDS = {
    "none-fp32": ("none", "fp32", "fp32", 1, None),
    "none-bf16": ("none", "bf16", "fp32", 2, 300),
    "cpu-fp32": ("cpu", "fp32", "fp32", 2, None),
    "cpu-bf16": ("cpu", "bf16", "fp32", 1, 300),
    "nvme-fp32": ("nvme", "fp32", "fp32", 2, 300),
    "nvme-bf16": ("nvme", "bf16", "fp32", 2, None),
    "cpu-int8": ("cpu", "fp32", "int8", 2, None),
    "nvme-int8": ("nvme", "bf16", "int8", 2, None),
    "stage0-fp32": ("none", "fp32", "fp32", 0, None),  # every rank holds everything: a world-size-1 layout
}


def config(kind: str, nvme_dir: str) -> dict:
    device, precision, state_dtype, stage, bucket = KINDS[kind]
    c = {"train_batch_size": GLOBAL_BATCH, "gradient_clipping": 0.5,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
         "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}},
         "zero_optimization": {"stage": stage}}
    if bucket is not None:
        c["zero_optimization"]["reduce_bucket_size"] = bucket
    if device != "none":
        c["zero_optimization"]["offload_optimizer"] = {"device": device}
        if device == "nvme":
            c["zero_optimization"]["offload_optimizer"]["nvme_path"] = nvme_dir
    if state_dtype != "fp32":
        c["optimizer"]["params"]["state_dtype"] = state_dtype
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    return c


def make(kind: str, nvme_dir: str):
    model = eh.mlp(13, 37, 5)
    w0, b0, w1, b1 = model.parameters()
    groups = [{"params": [b0, w0, w1]}, {"params": [b1], "weight_decay": 0.0}]
    os.makedirs(nvme_dir, exist_ok=True)
    engine, *_ = zspeed.initialize(model=model, model_parameters=groups, config=config(kind, nvme_dir))
    return engine


def train(engine, steps: int) -> None:
    """``steps`` optimizer steps from engine.global_steps on, each on this rank's share of
    that step's global batch."""
    ws, rank = engine.world_size, engine.global_rank
    for _ in range(steps):
        x, y = DATA[engine.global_steps]
        mine = (x.chunk(ws)[rank], y.chunk(ws)[rank])
        engine.backward(eh.mse_loss(engine, mine))
        engine.step()


def _plain(v):
    if torch.is_tensor(v):
        return v.detach().cpu().reshape(-1).clone() if v.dim() else float(v)
    return v


def dump(engine) -> dict:
    """The engine's state: the model, counters, and per piece ("name", offset) its fp32 master
    and optimizer state (flat copies; a world size of 1 has one piece per parameter)."""
    out = {"model": {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()},
           "counters": (engine.global_steps, engine.global_samples, engine.micro_steps, engine.skipped_steps),
           "lr": engine.get_lr(), "pieces": {}}
    path = engine.optimizer_path
    sm = path.sharded
    names = engine._names
    if sm is None:
        states = path.param_states()
        for gi, (row, ms) in enumerate(zip(names, path.masters())):
            for pi, (n, m) in enumerate(zip(row, ms)):
                st = states[gi][pi] or {}
                out["pieces"][(n, 0)] = {"master": m.detach().cpu().reshape(-1).clone(),
                                         "state": {k: _plain(v) for k, v in st.items()}}
    else:
        states = path.param_states()
        for gi, (entries, ms) in enumerate(zip(sm.pieces, path.masters())):
            for (pc, _at, _n), m, st in zip(entries, ms, states[gi]):
                if pc is not None:
                    out["pieces"][(names[gi][pc.param], pc.offset)] = {
                        "master": m.detach().cpu().reshape(-1).clone(),
                        "state": {k: _plain(v) for k, v in (st or {}).items()}}
    return out


def _dequantized(st: dict) -> dict:
    from zspeed.ops.adam import q8_dequantize
    n = st["exp_avg"].numel()
    m, v = torch.empty(n), torch.empty(n)
    q8_dequantize(st["exp_avg"], st["exp_avg_scale"], st["exp_avg_sq"], st["exp_avg_sq_scale"], m, v)
    return {**{k: x for k, x in st.items() if "scale" not in k}, "exp_avg": m, "exp_avg_sq": v}


def merge(dumps: list) -> dict:
    """Whole parameters from the dumps of every rank of one engine: per name the fp32 master
    and the optimizer state (8-bit states dequantized per piece, as the optimizer sees them;
    per-element states joined in offset order, other values checked to agree)."""
    by_name: dict = {}
    seen: dict = {}
    for d in dumps:
        for (name, off), piece in d["pieces"].items():
            if (name, off) in seen:  # ZeRO stage 0: every rank holds every parameter, identically
                assert same(piece, seen[(name, off)]), (name, off)
                continue
            seen[(name, off)] = piece
            by_name.setdefault(name, []).append((off, piece))
    out = {}
    for name, pieces in by_name.items():
        pieces.sort(key=lambda t: t[0])
        at = 0
        for off, p in pieces:
            assert off == at, (name, off, at)
            at += p["master"].numel()
        states = [_dequantized(p["state"]) if "exp_avg_scale" in p["state"] else p["state"] for _, p in pieces]
        state = {}
        for k in states[0]:
            vals = [s[k] for s in states]
            if torch.is_tensor(vals[0]):
                state[k] = torch.cat(vals)
            else:
                assert all(v == vals[0] for v in vals), (name, k, vals)
                state[k] = vals[0]
        out[name] = {"master": torch.cat([p["master"] for _, p in pieces]), "state": state}
    return out


# -- the phases the ranks run (test_checkpoint_dp.py starts them through distrun) ------------------
def phase_two(root: str, kinds: list, out: str) -> None:
    """Two ranks: load the one-process checkpoint and continue; train, save and continue (the
    reference); load that checkpoint into a fresh engine and continue."""
    zspeed.init_distributed()
    rank = zspeed.comm.get_rank()
    res = {}
    for kind in kinds:
        base = os.path.join(root, kind)
        nv = os.path.join(base, "nvme")  # the swap files have names of their own per engine
        r = res[kind] = {}
        e = make(kind, nv)
        path, client = e.load_checkpoint(os.path.join(base, "one"))
        r["load1"], r["client1"] = dump(e), client
        train(e, AFTER)
        r["load1_after"] = dump(e)
        e.close()

        e = make(kind, nv)
        train(e, BEFORE)
        e.save_checkpoint(os.path.join(base, "two"), client_state={"kind": kind, "t": torch.arange(3) + rank})
        r["saved"] = dump(e)
        train(e, AFTER)
        r["saved_after"] = dump(e)
        e.close()

        e = make(kind, nv)
        path, client = e.load_checkpoint(os.path.join(base, "two"))
        r["load2"], r["client2"], r["path2"] = dump(e), client, path
        train(e, AFTER)
        r["load2_after"] = dump(e)
        e.close()
    torch.save(res, f"{out}.{rank}.pt")


def phase_three(root: str, kinds: list, out: str) -> None:
    """Three ranks: load the two-rank checkpoint, save it again at three ranks, continue."""
    zspeed.init_distributed()
    rank = zspeed.comm.get_rank()
    res = {}
    for kind in kinds:
        base = os.path.join(root, kind)
        r = res[kind] = {}
        e = make(kind, os.path.join(base, "nvme"))
        _, r["client2"] = e.load_checkpoint(os.path.join(base, "two"))
        r["load2"] = dump(e)
        e.save_checkpoint(os.path.join(base, "three"))
        train(e, AFTER)
        r["load2_after"] = dump(e)
        e.close()
        if kind == "cpu-bf16":  # the weights only: the masters follow the (bf16) weights
            e = make(kind, os.path.join(base, "nvme"))
            r["weights_only_path"], _ = e.load_checkpoint(os.path.join(base, "two"), load_optimizer_states=False)
            r["weights_only"] = dump(e)
            r["nothing"] = e.load_checkpoint(os.path.join(base, "no such folder"))
            e.close()
    torch.save(res, f"{out}.{rank}.pt")


def run_phase() -> None:
    """Entry point of a rank: ZS_CKPT_PHASE holds [phase name, root, kinds, out]."""
    name, root, kinds, out = json.loads(os.environ["ZS_CKPT_PHASE"])
    {"two": phase_two, "three": phase_three}[name](root, kinds, out)
