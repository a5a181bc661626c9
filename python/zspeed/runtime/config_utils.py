"""DeepSpeed's ``deepspeed.runtime.config_utils`` names that scripts and libraries import.

``DeepSpeedConfigModel`` is DeepSpeed's base of its config section classes (a pydantic model
there). zspeed's section classes (``runtime.zero.config.DeepSpeedZeroConfig``, the offload
sections, ``runtime.precision_config``'s) validate with zspeed's own schema instead and share
this base, so ``isinstance(section, DeepSpeedConfigModel)`` holds for every one of them. It is
not a pydantic model: a class of your own deriving from it gets zspeed's read-only attribute
access, not pydantic's field declarations (docs/COMPAT.md).
"""
from __future__ import annotations

from .zero.offload_config import ReadOnlyConfig

__all__ = ["DeepSpeedConfigModel"]

DeepSpeedConfigModel = ReadOnlyConfig
