"""DeepSpeed's ``deepspeed.runtime.zero.utils`` names: the exception ZeRO raises for a misuse and
the optimizer classes ZeRO accepts from a script without ``zero_allow_untested_optimizer``."""
from __future__ import annotations

from ..errors import ZeRORuntimeException

__all__ = ["ZeRORuntimeException", "ZERO_SUPPORTED_OPTIMIZERS", "is_zero_supported_optimizer"]


def _supported() -> list:
    import torch
    out = [torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad]
    try:
        from ...ops import _ds_optim, _torch_optim
    except ImportError:  # the native library is missing: only torch's classes
        return out
    return out + [_torch_optim.CPUAdam, _torch_optim.CPUAdagrad, _torch_optim.CPULion, _ds_optim.DeepSpeedCPUAdam,
                  _ds_optim.DeepSpeedCPULion, _ds_optim.FusedAdam, _ds_optim.FusedLion]


ZERO_SUPPORTED_OPTIMIZERS = _supported()


def is_zero_supported_optimizer(optimizer) -> bool:
    """Whether ZeRO takes ``optimizer`` (an instance) without zero_allow_untested_optimizer: its
    exact class is one of ZERO_SUPPORTED_OPTIMIZERS (a subclass is not, as in DeepSpeed)."""
    return type(optimizer) in ZERO_SUPPORTED_OPTIMIZERS
