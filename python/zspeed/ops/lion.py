"""Lion on the CPU: :class:`CPULion` (torch.optim.Optimizer, built on first
access; needs torch) and :func:`lion_step` (numpy, no torch).

DeepSpeed's names ``DeepSpeedCPULion`` (CPULion with DeepSpeed's defaults) and
``FusedLion`` (DeepSpeed's device Lion, in plain torch) are built on first access
too; see zspeed.ops._ds_optim."""
from __future__ import annotations

from .._requires import require_torch as _require_torch
from . import _kernels

__all__ = ["CPULion", "DeepSpeedCPULion", "FusedLion", "lion_step"]


def lion_step(param, grad, exp_avg, *, lr=1e-4, betas=(0.9, 0.99),
              weight_decay=0.0, grad_scale=1.0, out=None, num_threads=None):
    """One Lion step in place (Chen et al. 2023): with g = grad*grad_scale,
    ``p = p*(1 - lr*wd) - lr*sign(b1*m + (1-b1)*g)``, then
    ``m = b2*m + (1-b2)*g``. exp_avg float32 or bf16. ``out``: optional
    float16/bf16 copy of the new weights. ``num_threads``: None = all cores."""
    _kernels.lion(param, grad, exp_avg, lr=lr, beta1=betas[0], beta2=betas[1],
                  weight_decay=weight_decay, grad_scale=grad_scale, out=out,
                  num_threads=num_threads)


def __getattr__(name):
    if name == "CPULion":
        _require_torch(f"zspeed.ops.lion.{name}")
        from ._torch_optim import CPULion
        return CPULion
    if name in ("DeepSpeedCPULion", "FusedLion"):
        _require_torch(f"zspeed.ops.lion.{name}")
        from . import _ds_optim
        return getattr(_ds_optim, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
