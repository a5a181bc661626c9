"""fp16 loss scaling: the scaler's rules (DynamicLossScaler, LossScaler) and the engine's
use of them (an overflow skips the step, lowers the scale and holds the lr schedule)."""
import copy
import os

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch (pip install torch)")

import zspeed

# These tests compare against CPU references: keep the engine on the CPU on GPU machines too.
os.environ["ZSPEED_DEVICE"] = "cpu"
from zspeed.runtime.loss_scaler import DynamicLossScaler, LossScaleError, LossScaler
from engine_helpers import OFFLOAD, config as cfg, mlp, native_ops_available, regression_data as batches, \
    train

F = torch.nn.functional


class InfAt(torch.nn.Module):
    """Multiplies its input by inf on chosen calls, producing inf gradients."""

    def __init__(self, inner, bad_calls):
        super().__init__()
        self.inner, self.bad, self.calls = inner, set(bad_calls), 0

    def forward(self, x):
        out = self.inner(x)
        self.calls += 1
        if self.calls in self.bad:
            out = out * torch.tensor(float("inf"), dtype=out.dtype)
        return out


# DeepSpeed's rules (loss_scaler.py): the scale grows on the (window + 1)-th good step after the
# last overflow; stage 0 halves on every overflow, ZeRO stages 1-2 spend the hysteresis first.
@pytest.mark.parametrize("offload", [False, True, "native"])
def test_fp16_overflow_skips_step_and_lowers_scale(offload):
    if offload == "native" and not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available")
    model = InfAt(mlp(), bad_calls={3, 4, 5})
    c = cfg(fp16={"enabled": True, "initial_scale_power": 10, "hysteresis": 2, "loss_scale_window": 4},
            scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_min_lr": 1e-3,
                                                      "warmup_max_lr": 1e-2, "warmup_type": "linear"}})
    if offload:
        c["zero_optimization"] = OFFLOAD
        c["optimizer"]["params"]["torch_adam"] = offload != "native"
    e, *_ = zspeed.initialize(model=model, config=c)
    assert e.module.inner[0].weight.dtype == torch.float16
    data = batches(12, seed=3)
    scales, applied, lrs = [], [], []
    for i in range(12):
        before = [p.detach().clone() for p in e.module.parameters()]
        x, y = data[i]
        e.backward(F.mse_loss(e(x.half()).float(), y))
        e.step()
        scales.append(e.loss_scale)
        applied.append(e.was_step_applied())
        lrs.append(e.get_lr()[0])
        changed = any(not torch.equal(b, p) for b, p in zip(before, e.module.parameters()))
        assert changed == e.was_step_applied()
    assert applied == [True, True, False, False, False] + [True] * 7
    if offload:
        # ZeRO-2, hysteresis 2: the 1st overflow spends hysteresis, the 2nd and 3rd halve; the 5th
        # good step after the last overflow (window 4, + 1) doubles it; the good steps before the
        # overflows did not reach the window.
        assert scales == [1024, 1024, 1024, 512, 256, 256, 256, 256, 256, 512, 512, 512]
    else:
        # Stage 0: every overflow halves (no hysteresis); doubled on the 5th good step after.
        assert scales == [1024, 1024, 512, 256, 128, 128, 128, 128, 128, 256, 256, 256]
    assert e.skipped_steps == 3 and e.global_steps == 12
    # The scheduler does not advance on skipped steps: 9 scheduler steps after 12 optimizer steps.
    assert lrs[-1] == pytest.approx(1e-3 + 9e-3 * 8 / 10)  # 9 scheduler steps: t = 8
    assert all(torch.isfinite(p).all() for p in e.module.parameters())


def test_dynamic_loss_scaler_rules():
    s = DynamicLossScaler(init_scale=8, scale_window=3, min_scale=1, delayed_shift=1)
    seq = [False, False, False, True, False, False, False, False, True, True, True]
    got = []
    for o in seq:
        s.update_scale(o)
        got.append(s.loss_scale)
    # Independent trace of DeepSpeed's rule (grow when it - last_overflow - 1 is a positive multiple
    # of the window): iters 0-2 good (0, 1, 2 good steps before them: none is > 0 and % 3 == 0),
    # iter 3 overflow -> 4, iters 4-7 good: iter 7 has 3 good steps before it -> 8, then three
    # overflows -> 4, 2, 1.
    assert got == [8, 8, 8, 4, 4, 4, 4, 8, 4, 2, 1]
    with pytest.raises(LossScaleError, match="minimum"):
        s.update_scale(True)
    c = DynamicLossScaler(init_scale=4, scale_window=100, delayed_shift=2, consecutive_hysteresis=True)
    for o in [True, False, True, True]:
        c.update_scale(o)
    # consecutive hysteresis refills on the good step, so only the 2nd of the last two overflows halves.
    assert c.loss_scale == 2
    st = LossScaler(128.0)
    st.update_scale(True)
    assert st.loss_scale == 128.0


def test_static_loss_scale_still_skips_overflow():
    model = InfAt(mlp(), bad_calls={2})
    e, *_ = zspeed.initialize(model=model, config=cfg(fp16={"enabled": True, "loss_scale": 128}))
    train(e, batches(4), 4)
    assert e.skipped_steps == 1 and e.loss_scale == 128


# -- resuming across precisions -------------------------------------------------------------------
def _engine(precision: dict, offload: bool):
    c = cfg(**precision)
    if offload:
        c["zero_optimization"] = OFFLOAD
        c["optimizer"]["params"]["torch_adam"] = True
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    return e


FP16_DYNAMIC = {"fp16": {"enabled": True, "initial_scale_power": 15}}


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("target", [{"bf16": {"enabled": True}}, {}, {"fp16": {"enabled": True, "loss_scale": 64}}])
def test_fp16_scale_never_reaches_an_engine_with_another_scaler(tmp_path, target, offload):
    # A dynamic fp16 checkpoint (scale 32768) resumed under bf16, fp32 or static fp16: the engine
    # keeps its own scale, so the gradients are not divided by 32768 (which would shrink every
    # update and read as a tiny grad norm).
    data = batches(6)
    a = _engine(FP16_DYNAMIC, offload)
    train(a, data[:3])
    # A dynamic scale of thousands (stage 0 halves on each overflow of the first steps).
    assert a.loss_scale >= 2.0 ** 13 and a.loss_scaler.dynamic
    a.save_checkpoint(tmp_path)
    b = _engine(target, offload)
    own_scale = b.loss_scale
    b.load_checkpoint(tmp_path)
    assert b.loss_scale == own_scale  # 1 for bf16/fp32, the configured 64 for static fp16
    # The true gradient norm: plain autograd on a copy of the model, the loss scaled by the
    # engine's own scale (an offloaded engine takes the gradients out of .grad during backward).
    twin = copy.deepcopy(b.module)
    (F.mse_loss(twin(data[3][0].to(b.dtype)).float(), data[3][1]) * own_scale).backward()
    ref = torch.sqrt(sum(p.grad.float().square().sum() for p in twin.parameters())).item() / own_scale
    loss = F.mse_loss(b(data[3][0].to(b.dtype)).float(), data[3][1])
    b.backward(loss)
    b.step()
    assert b.get_global_grad_norm() == pytest.approx(ref, rel=1e-3)  # fp32 sums of the same grads


@pytest.mark.parametrize("source", [{"bf16": {"enabled": True}}, {}, {"fp16": {"enabled": True, "loss_scale": 64}}])
def test_dynamic_fp16_engine_resumes_from_another_precision(tmp_path, source):
    # bf16, fp32 or static-fp16 checkpoints hold no dynamic scaler state: a dynamic fp16 engine
    # starts its scaler fresh (2**initial_scale_power) and trains on.
    data = batches(6)
    a = _engine(source, False)
    train(a, data[:3])
    a.save_checkpoint(tmp_path)
    b = _engine(FP16_DYNAMIC, False)
    path, _ = b.load_checkpoint(tmp_path)
    assert path is not None and b.global_steps == 3 and b.loss_scale == 2.0 ** 15
    train(b, data[3:])
    assert b.global_steps == 6 and b.skipped_steps == 0
    assert all(torch.isfinite(p).all() for p in b.module.parameters())


def test_scaler_state_is_checked_before_it_changes():
    s = DynamicLossScaler(init_scale=8)
    for bad in ({"cur_scale": float("nan"), "cur_iter": 1, "last_overflow_iter": 0, "cur_hysteresis": 2},
                {"cur_scale": 4.0, "cur_iter": "x", "last_overflow_iter": 0, "cur_hysteresis": 2},
                {"cur_scale": 4.0, "cur_iter": 3, "last_overflow_iter": -2, "cur_hysteresis": 2},
                {"cur_scale": 4.0, "dynamic": True}, [4.0], {"cur_scale": True}):
        with pytest.raises(ValueError):
            s.load_state_dict(bad)
        assert s.state_dict() == {"dynamic": True, "cur_scale": 8.0, "cur_iter": 0, "last_overflow_iter": -1,
                                  "cur_hysteresis": 2}
    s.load_state_dict({"cur_scale": 4.0, "cur_iter": 3, "last_overflow_iter": 1, "cur_hysteresis": 1})
    assert (s.loss_scale, s.cur_iter, s.last_overflow_iter, s.cur_hysteresis) == (4.0, 3, 1, 1)
    st = LossScaler(64.0)
    st.load_state_dict({"cur_scale": 32768.0, "cur_iter": 3, "last_overflow_iter": 1, "cur_hysteresis": 1})
    assert st.loss_scale == 64.0
