"""AdamW / Adam on the CPU: :class:`CPUAdam` (a torch.optim.Optimizer, built
on first access; needs torch) and :func:`adam_step` (numpy, no torch).

DeepSpeed's names are here too (built on first access, need torch):
``DeepSpeedCPUAdam`` (CPUAdam with DeepSpeed's attributes and sub-group calls)
and ``FusedAdam`` (DeepSpeed's device Adam, in plain torch); see
zspeed.ops._ds_optim.

Semantics are torch.optim.AdamW (``adamw_mode=True``) / torch.optim.Adam
(``adamw_mode=False``), amsgrad off, with DeepSpeed's ``bias_correction``
switch. Arithmetic is fp32; see include/zspeed/optim.h for the formulas,
rounding (nearest even) and the 8-bit state format.
"""
from __future__ import annotations

from .._requires import require_torch as _require_torch
from . import _kernels

__all__ = ["CPUAdam", "DeepSpeedCPUAdam", "FusedAdam", "adam_step", "q8_quantize", "q8_dequantize"]

# Conversions between fp32 Adam states and the 8-bit format (int8 exp_avg,
# uint8 exp_avg_sq, fp32 scales per 256 elements; zspeed.ops.qblocks(n)):
# q8_quantize(m, v, exp_avg, exp_avg_scale, exp_avg_sq, exp_avg_sq_scale)
# q8_dequantize(exp_avg, exp_avg_scale, exp_avg_sq, exp_avg_sq_scale, m, v)
q8_quantize = _kernels.q8_quantize
q8_dequantize = _kernels.q8_dequantize


def adam_step(param, grad, exp_avg, exp_avg_sq, *, step, lr=1e-3,
              betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, adamw_mode=True,
              bias_correction=True, grad_scale=1.0, out=None,
              exp_avg_scale=None, exp_avg_sq_scale=None, num_threads=None):
    """One AdamW/Adam step, in place, over 1-element-per-param buffers.

    param: float32 (master weights), float16 or bf16 (uint16 bits) array,
      updated in place. grad: float32/float16/bf16, same length; multiplied by
      ``grad_scale`` first. exp_avg / exp_avg_sq: float32 or bf16 states, or
      8-bit states (int8 exp_avg, uint8 exp_avg_sq, plus ``exp_avg_scale`` and
      ``exp_avg_sq_scale``: float32 arrays of ``qblocks(n)``; all zeros is the
      initial state). ``step``: this update's number, from 1. ``out``:
      optional float16/bf16 array receiving the updated weights in the same
      pass. ``num_threads``: None = the default pool (all cores).
    Raises NativeError (nothing modified) for bad input; amsgrad is not
    offered."""
    _kernels.adam(param, grad, exp_avg, exp_avg_sq, step=step, lr=lr,
                  beta1=betas[0], beta2=betas[1], eps=eps,
                  weight_decay=weight_decay, adamw_mode=adamw_mode,
                  bias_correction=bias_correction, grad_scale=grad_scale,
                  out=out, exp_avg_scale=exp_avg_scale,
                  exp_avg_sq_scale=exp_avg_sq_scale, num_threads=num_threads)


def __getattr__(name):
    if name == "CPUAdam":
        _require_torch(f"zspeed.ops.adam.{name}")
        from ._torch_optim import CPUAdam
        return CPUAdam
    if name in ("DeepSpeedCPUAdam", "FusedAdam"):
        _require_torch(f"zspeed.ops.adam.{name}")
        from . import _ds_optim
        return getattr(_ds_optim, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
