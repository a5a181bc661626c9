"""DeepSpeed's ``deepspeed.runtime.precision_config``: the ``bf16`` and ``fp16`` sections as
objects (``get_bfloat16_config``, ``get_float16_config``), for libraries that read a config's
precision the way DeepSpeed's engine does.

Each is validated by zspeed's schema, with every key as a read-only attribute and its default
filled in. An unknown key or a bad value raises what DeepSpeed's pydantic classes raise,
pydantic's ValidationError (a ValueError) carrying zspeed's message that names the key, where
pydantic is installed (DeepSpeed depends on it; zspeed does not), and zspeed's ConfigError (a
ValueError too) otherwise. ``get_bfloat16_config`` reads ``bf16`` or, when it is absent, the
old spelling ``bfloat16``, as DeepSpeed does.
"""
from __future__ import annotations

from .zero.offload_config import SchemaSection

__all__ = ["DeepSpeedBF16Config", "DeepSpeedFP16Config", "get_bfloat16_config", "get_float16_config"]


class _Precision(SchemaSection):
    def __repr__(self) -> str:
        return f"{type(self).__name__}(enabled={self.enabled!r})"


class DeepSpeedBF16Config(_Precision):
    """A validated ``bf16`` section (DeepSpeed's name)."""
    _section = "bf16"


class DeepSpeedFP16Config(_Precision):
    """A validated ``fp16`` section (DeepSpeed's name)."""
    _section = "fp16"


def get_bfloat16_config(param_dict: dict) -> DeepSpeedBF16Config:
    """The ``bf16`` section of a whole config dict (or ``bfloat16``, its old name); absent: disabled."""
    section = param_dict.get("bf16")
    if section is None:
        section = param_dict.get("bfloat16")
    return DeepSpeedBF16Config(**(section or {}))


def get_float16_config(param_dict: dict) -> DeepSpeedFP16Config:
    """The ``fp16`` section of a whole config dict; absent: disabled."""
    return DeepSpeedFP16Config(**(param_dict.get("fp16") or {}))
