"""fp16 loss scaling: the scaler's rules (DynamicLossScaler, LossScaler) and the engine's
use of them (an overflow skips the step, lowers the scale and holds the lr schedule)."""
import os

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch (pip install zspeed[torch])")

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
    # hysteresis 2: 1st overflow spends hysteresis, 2nd and 3rd halve; the window of 4 good
    # steps after the last overflow doubles it; good steps before the overflow did not reach the window.
    assert scales == [1024, 1024, 1024, 512, 256, 256, 256, 256, 512, 512, 512, 512]
    assert e.skipped_steps == 3 and e.global_steps == 12
    # The scheduler does not advance on skipped steps: 9 scheduler steps after 12 optimizer steps.
    assert lrs[-1] == pytest.approx(1e-3 + 9e-3 * 8 / 10)  # 9 scheduler steps: t = 8
    assert all(torch.isfinite(p).all() for p in e.module.parameters())


def test_dynamic_loss_scaler_rules():
    s = DynamicLossScaler(init_scale=8, scale_window=3, min_scale=1, delayed_shift=1)
    seq = [False, False, True, False, False, False, True, True, True]
    got = []
    for o in seq:
        s.update_scale(o)
        got.append(s.loss_scale)
    # Independent trace: iter 0,1 good (no window hit: (it - (-1)) % 3 -> 1,2), iter 2 overflow -> 4,
    # iters 3,4,5 good -> (5-2)%3 == 0 at iter 5 -> 8, then three overflows -> 4, 2, 1.
    assert got == [8, 8, 4, 4, 4, 8, 4, 2, 1]
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
