"""DeepSpeed's ``deepspeed.runtime.zero.utils`` names: the exception ZeRO raises for a misuse and
the optimizer classes ZeRO accepts from a script without ``zero_allow_untested_optimizer``."""
from __future__ import annotations

from ..._optimizers import ZERO_TESTED_CLASSES
from ..errors import ZeRORuntimeException

__all__ = ["ZeRORuntimeException", "ZERO_SUPPORTED_OPTIMIZERS", "is_zero_supported_optimizer"]


def _supported() -> list:
    """The classes of zspeed._optimizers.ZERO_TESTED_CLASSES (only torch's where libzspeed is missing)."""
    import importlib
    out = []
    for module, name in ZERO_TESTED_CLASSES:
        try:
            out.append(getattr(importlib.import_module(module), name))
        except ImportError:  # zspeed.ops without libzspeed: its classes cannot be passed either
            pass
    return out


ZERO_SUPPORTED_OPTIMIZERS = _supported()


def is_zero_supported_optimizer(optimizer) -> bool:
    """Whether ZeRO takes ``optimizer`` (an instance) without zero_allow_untested_optimizer: its
    exact class is one of ZERO_SUPPORTED_OPTIMIZERS (a subclass is not, as in DeepSpeed)."""
    return type(optimizer) in ZERO_SUPPORTED_OPTIMIZERS
