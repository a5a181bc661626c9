"""fp16 loss scaling with DeepSpeed's rules.

Dynamic scaling (fp16.loss_scale = 0) starts at 2**initial_scale_power. On a
step whose gradients overflow (inf/nan), the step is skipped and, once the
hysteresis budget is spent, the scale is divided by 2 (never below
min_loss_scale). The scale is doubled on the good step that follows
loss_scale_window good steps since the last overflow (or the start): the
(window + 1)-th consecutive good step, as DeepSpeed >= 0.17.1 counts. With
consecutive_hysteresis the budget is refilled on every good step; otherwise only
when the scale grows. A static scale never changes, but overflowing steps are
still skipped.

ZeRO stage 0 follows DeepSpeed's fp16 optimizers (FP16_Optimizer and its unfused
variant), which differ from its ZeRO-1/2 scaler: every overflow halves the scale
(hysteresis is not used), and an overflow at min_loss_scale keeps the scale at the
minimum instead of stopping training. ZeRO stages 1-2 apply hysteresis and raise
:class:`LossScaleError` for an overflow at the minimum, as DeepSpeed's ZeRO does.

Resuming from a checkpoint: only a dynamic scaler has training state. A
dynamic scaler restores a dynamic scaler's state and starts fresh from a
static or unit one (an fp32, bf16 or static-fp16 checkpoint); a static or unit
scaler (static fp16, bf16, fp32) keeps its configured scale whatever the
checkpoint holds, because its scale is configuration, not state: an fp16
checkpoint's scale of 32768 must never divide the gradients of a bf16 run.
"""
from __future__ import annotations

import math

from .._native import ZSpeedError

__all__ = ["LossScaler", "DynamicLossScaler", "LossScaleError", "build_loss_scaler", "check_state_dict"]


class LossScaleError(ZSpeedError, RuntimeError):
    """The dynamic loss scale cannot go lower: training has diverged."""


class LossScaler:
    """Static (or unit) scale: the loss is multiplied by a constant."""

    dynamic = False

    def __init__(self, scale: float = 1.0):
        self.cur_scale = float(scale)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update_scale(self, overflow: bool) -> None:
        del overflow  # a static scale does not react

    def state_dict(self) -> dict:
        return {"dynamic": False, "cur_scale": self.cur_scale}

    def load_state_dict(self, sd: dict) -> None:
        """Checks ``sd`` (ValueError naming the field); the configured scale stays (see the
        module docstring)."""
        check_state_dict(sd)


class DynamicLossScaler(LossScaler):
    dynamic = True

    def __init__(self, init_scale: float = 2.0 ** 16, scale_factor: float = 2.0, scale_window: int = 1000,
                 min_scale: float = 1.0, delayed_shift: int = 2, consecutive_hysteresis: bool = False,
                 raise_error_at_min_scale: bool = True):
        super().__init__(init_scale)
        self.scale_factor = float(scale_factor)
        self.scale_window = int(scale_window)
        self.min_scale = float(min_scale)
        self.delayed_shift = int(delayed_shift)
        self.cur_hysteresis = int(delayed_shift)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale and self.raise_error_at_min_scale:
                    raise LossScaleError(
                        f"gradients overflowed with the loss scale already at its minimum "
                        f"({self.min_scale:g}): training has diverged (inf/nan in the gradients at any "
                        f"scale). Lower the learning rate, enable gradient_clipping, or use bf16.")
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable = self.cur_iter - self.last_overflow_iter - 1  # good steps before this one
            if stable > 0 and stable % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def state_dict(self) -> dict:
        return {"dynamic": True, "cur_scale": self.cur_scale, "cur_iter": self.cur_iter,
                "last_overflow_iter": self.last_overflow_iter, "cur_hysteresis": self.cur_hysteresis}

    def load_state_dict(self, sd: dict) -> None:
        """Restores a dynamic scaler's state; the state of a static or unit scaler leaves this
        one as it is (see the module docstring). Checks everything before changing anything
        (ValueError naming the field)."""
        sd = check_state_dict(sd)
        if not sd["dynamic"]:
            return
        self.cur_scale = sd["cur_scale"]
        self.cur_iter = sd["cur_iter"]
        self.last_overflow_iter = sd["last_overflow_iter"]
        self.cur_hysteresis = sd["cur_hysteresis"]


def _int(sd: dict, key: str, lo: int) -> int:
    v = sd.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v < 2 ** 63:
        raise ValueError(f"'{key}' = {v!r} must be an integer >= {lo}")
    return v


def check_state_dict(sd) -> dict:
    """A scaler state (from :meth:`LossScaler.state_dict`) checked and normalized, with
    ``dynamic`` set; ValueError naming the field otherwise. A state without the ``dynamic``
    flag is dynamic when it has ``cur_iter``."""
    if not isinstance(sd, dict):
        raise ValueError(f"the loss scaler state must be an object, not {type(sd).__name__}")
    scale = sd.get("cur_scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"'cur_scale' = {scale!r} must be a finite number > 0")
    dynamic = sd.get("dynamic", "cur_iter" in sd)
    if not isinstance(dynamic, bool):
        raise ValueError(f"'dynamic' = {dynamic!r} must be true or false")
    out = {"dynamic": dynamic, "cur_scale": float(scale)}
    if dynamic:
        out.update(cur_iter=_int(sd, "cur_iter", 0), last_overflow_iter=_int(sd, "last_overflow_iter", -1),
                   cur_hysteresis=_int(sd, "cur_hysteresis", 0))
    return out


def build_loss_scaler(fp16: dict, zero_stage: int = 1) -> LossScaler:
    """The scaler for a validated fp16 config section (unit scale when fp16 is off); stage 0
    gets DeepSpeed's stage-0 rule (no hysteresis, no error at the minimum, see above)."""
    if not fp16["enabled"]:
        return LossScaler(1.0)
    if float(fp16["loss_scale"]) != 0.0:
        return LossScaler(float(fp16["loss_scale"]))
    stage0 = zero_stage == 0
    return DynamicLossScaler(init_scale=2.0 ** fp16["initial_scale_power"],
                             scale_window=fp16["loss_scale_window"],
                             min_scale=float(fp16["min_loss_scale"]),
                             delayed_shift=1 if stage0 else fp16["hysteresis"],
                             consecutive_hysteresis=fp16["consecutive_hysteresis"],
                             raise_error_at_min_scale=not stage0)
