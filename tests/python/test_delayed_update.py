"""offload_optimizer.delayed_update (cpu.py): the CPU step of boundary t runs in the background
during forward and backward of boundary t+1, which see the weights of t-1.

The reference is the same arithmetic written out in torch: gradients taken at the weights
before the previous update, applied by AdamW to the newest masters. fp32 on the CPU:
zspeed's AdamW kernel against torch's AdamW agree to rounding (1e-6 relative)."""
from __future__ import annotations

import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError  # noqa: E402


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """CPU-only by design (the references are plain torch on the CPU; the GPU's delayed step is measured by bench/gpu_host.sh split-bench): ZSPEED_DEVICE=cpu for each test."""
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")

LR, WD = 2e-2, 0.01


def _cfg(stage=2, delayed=True, **off):
    return eh.config(zero_optimization={"stage": stage, "offload_optimizer": {
        "device": "cpu", "delayed_update": delayed, **off}}, gradient_clipping=0)  # _reference does not clip


def _reference(data, steps):
    """Delayed AdamW by hand: forward/backward at ``visible`` (the weights before the last
    update), the update applied to the masters ``m``."""
    model = eh.mlp()
    masters = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(masters, lr=LR, weight_decay=WD)
    visible = [m.clone() for m in masters]
    for i in range(steps):
        with torch.no_grad():
            for p, v in zip(model.parameters(), visible):
                p.copy_(v)
        x, y = data[i % len(data)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()
        before = [m.clone() for m in masters]
        for m, p in zip(masters, model.parameters()):
            m.grad = p.grad.clone()
        opt.step()
        visible = before  # the next forward sees the weights the update started from
    return masters


@pytest.mark.parametrize("stage", [2, 3])
def test_delayed_update_is_adamw_one_step_stale(stage):
    data = eh.regression_data(6)
    steps = 7
    e, *_ = zspeed.initialize(model=eh.mlp(), config=_cfg(stage))
    eh.train(e, data, steps)
    e.optimizer_path.flush()
    want = _reference(data, steps)
    with zspeed.zero.GatheredParameters(list(e.module.parameters())):
        got = [p.detach().clone() for p in e.module.parameters()]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    # and it is not the exact run
    exact, *_ = zspeed.initialize(model=eh.mlp(), config=_cfg(stage, delayed=False))
    eh.train(exact, data, steps)
    with zspeed.zero.GatheredParameters(list(exact.module.parameters())):
        assert not all(torch.allclose(g, p) for g, p in zip(got, exact.module.parameters()))


def test_the_scheduler_step_after_apply_does_not_change_the_step_in_flight():
    data = eh.regression_data(6)
    cfg = _cfg()
    cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": LR,
                                                       "warmup_num_steps": 3, "warmup_type": "linear"}}
    runs = []
    for delayed in (True, False):
        c = _cfg(delayed=delayed)
        c["scheduler"] = cfg["scheduler"]
        e, *_ = zspeed.initialize(model=eh.mlp(), config=c)
        eh.train(e, data, 1)
        e.optimizer_path.flush()
        runs.append([p.detach().clone() for p in e.module.parameters()])
    # One step: the delayed run applies the same update (at the lr of step 0) as the exact run.
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_checkpoints_flush_and_resume_exactly(tmp_path):
    data = eh.regression_data(6)
    e, *_ = zspeed.initialize(model=eh.mlp(), config=_cfg())
    eh.train(e, data, 3)
    e.save_checkpoint(tmp_path, tag="t")
    eh.train(e, data, 3, start=3)
    after = [p.detach().clone() for p in e.module.parameters()]
    r, *_ = zspeed.initialize(model=eh.mlp(), config=_cfg())
    r.load_checkpoint(tmp_path, tag="t")
    eh.train(r, data, 3, start=3)
    for a, b in zip(after, r.module.parameters()):
        assert torch.equal(a, b)


def test_eval_sees_the_newest_weights():
    data = eh.regression_data(6)
    e, *_ = zspeed.initialize(model=eh.mlp(), config=_cfg())
    eh.train(e, data, 2)
    with torch.no_grad():
        e(data[0][0])
    want = [m.detach().reshape(p.shape) for m, p in zip(e.optimizer_path.masters()[0], e.module.parameters())]
    for p, w in zip(e.module.parameters(), want):
        assert torch.equal(p, w)


def test_delayed_update_needs_cpu_offload(tmp_path):
    with pytest.raises(ConfigError, match="delayed_update needs"):
        zspeed.initialize(model=eh.mlp(), config=eh.config(zero_optimization={"stage": 2, "offload_optimizer": {
            "device": "nvme", "nvme_path": str(tmp_path), "delayed_update": True}}))


def test_a_script_that_exits_with_a_delayed_step_in_flight_exits_cleanly(tmp_path):
    # The step of the last boundary still runs when the script ends without engine.close():
    # the interpreter waits for it (it must not tear the runtime down under the C kernels).
    r = eh.run_script(tmp_path, "exit_early.py",
                      "import torch, zspeed, engine_helpers as eh\n"
                      "import test_delayed_update as T\n"
                      "e, *_ = zspeed.initialize(model=eh.mlp(), config=T._cfg(2))\n"
                      "eh.train(e, eh.regression_data(3), 3)\n"
                      "print('trained', flush=True)\n")
    assert r.returncode == 0 and "trained" in r.stdout, r.stderr[-2000:]
