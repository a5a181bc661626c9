"""DeepSpeed's ``deepspeed.runtime.zero.utils`` names: the exception ZeRO raises for a misuse and
the optimizer classes ZeRO accepts from a script without ``zero_allow_untested_optimizer``
(runtime/optimizers.py decides it from the optimizer table)."""
from __future__ import annotations

from ..errors import ZeRORuntimeException
from ..optimizers import is_zero_supported_optimizer, zero_supported_classes

__all__ = ["ZeRORuntimeException", "ZERO_SUPPORTED_OPTIMIZERS", "is_zero_supported_optimizer"]

ZERO_SUPPORTED_OPTIMIZERS = zero_supported_classes()
