"""Adagrad on the CPU: :class:`CPUAdagrad` (torch.optim.Optimizer, built on
first access; needs torch) and :func:`adagrad_step` (numpy, no torch).
torch.optim.Adagrad semantics with lr_decay = 0 (the only value supported)."""
from __future__ import annotations

from .._requires import require_torch as _require_torch
from . import _kernels

__all__ = ["CPUAdagrad", "DeepSpeedCPUAdagrad", "adagrad_step"]


def adagrad_step(param, grad, state_sum, *, lr=1e-2, weight_decay=0.0,
                 eps=1e-10, lr_decay=0.0, grad_scale=1.0, out=None,
                 num_threads=None):
    """One Adagrad step in place: ``g = grad*grad_scale + weight_decay*p;
    state_sum += g*g; p -= lr * g / (sqrt(state_sum) + eps)``.

    param float32/float16/bf16 (uint16 bits); grad the same types; state_sum
    float32 or bf16 (fill it with initial_accumulator_value before the first
    step); out: optional float16/bf16 copy of the new weights.
    ``num_threads``: None = the default pool (all cores)."""
    _kernels.adagrad(param, grad, state_sum, lr=lr, lr_decay=lr_decay,
                     weight_decay=weight_decay, eps=eps, grad_scale=grad_scale,
                     out=out, num_threads=num_threads)


def __getattr__(name):
    if name == "CPUAdagrad":
        _require_torch(f"zspeed.ops.adagrad.{name}")
        from ._torch_optim import CPUAdagrad
        return CPUAdagrad
    if name == "DeepSpeedCPUAdagrad":
        _require_torch(f"zspeed.ops.adagrad.{name}")
        from ._ds_optim import DeepSpeedCPUAdagrad
        return DeepSpeedCPUAdagrad
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
