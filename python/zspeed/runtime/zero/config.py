"""DeepSpeed's ZeRO config names (``deepspeed.runtime.zero.config``): ``ZeroStageEnum``,
``DeepSpeedZeroConfig`` and ``get_zero_config``.

Scripts import these to name stages (``ZeroStageEnum.weights``), to register DeepSpeed's types
with ``torch.serialization.add_safe_globals`` before resuming a Trainer checkpoint, and to
read a config's ZeRO section. ``DeepSpeedZeroConfig(**section)`` validates the section with
zspeed's own schema (unknown keys and bad values are a ConfigError, a ValueError, naming the
key; DeepSpeed's pydantic model raises its ValidationError, also a ValueError), and exposes
every key as an attribute with its default filled in; ``offload_param`` and
``offload_optimizer`` are the offload config objects of offload_config.py, or None when the
section is absent or its device is "none". DeepSpeed's deprecated spellings are accepted:
``cpu_offload`` (optimizer to cpu), ``cpu_offload_param`` (parameters to cpu) and
``cpu_offload_use_pin_memory``. As DeepSpeed's model, it checks each key, not the rules
between them (parameter offload below stage 3 is refused when a run starts, not here). Unlike
DeepSpeed's pydantic model, the object is read-only.
"""
from __future__ import annotations

from enum import Enum

from .offload_config import DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig

__all__ = ["ZeroStageEnum", "DeepSpeedZeroConfig", "get_zero_config", "DeepSpeedZeroOffloadParamConfig",
           "DeepSpeedZeroOffloadOptimizerConfig"]


class ZeroStageEnum(int, Enum):
    """The ZeRO stages by what they partition (DeepSpeed's names)."""
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


_DEPRECATED = ("cpu_offload_param", "cpu_offload_use_pin_memory")


class DeepSpeedZeroConfig:
    """A validated ``zero_optimization`` section (see the module docstring)."""

    def __init__(self, **section):
        from ..config import ConfigError, parse_zero_section
        section = dict(section)
        param_cpu = bool(section.pop("cpu_offload_param", False))
        pin = section.pop("cpu_offload_use_pin_memory", None)
        if param_cpu and section.get("offload_param") is None:
            section["offload_param"] = {"device": "cpu"}
        if section.get("cpu_offload") and section.get("offload_optimizer") is None:
            section["offload_optimizer"] = {"device": "cpu"}
        if pin is not None:
            for key in ("offload_param", "offload_optimizer"):
                if isinstance(section.get(key), dict):
                    section[key] = {"pin_memory": bool(pin), **section[key]}
        zero, off, offp = parse_zero_section(section)
        stage = zero["stage"]
        if not isinstance(stage, int) or isinstance(stage, bool) or not 0 <= stage <= 3:
            raise ConfigError(f"zero_optimization.stage = {stage!r} is not one of 0, 1, 2, 3.")
        values = dict(zero)
        values["stage"] = ZeroStageEnum(stage)
        values["offload_param"] = DeepSpeedZeroOffloadParamConfig(**offp) if offp["device"] != "none" else None
        values["offload_optimizer"] = DeepSpeedZeroOffloadOptimizerConfig(**off) if off["device"] != "none" else None
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"DeepSpeedZeroConfig has no field {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError("a zspeed DeepSpeedZeroConfig is read-only; build a new one from the changed section")

    def __repr__(self) -> str:
        return f"DeepSpeedZeroConfig(stage={int(self.stage)}, offload_param={self.offload_param!r}, " \
               f"offload_optimizer={self.offload_optimizer!r})"


def get_zero_config(param_dict: dict) -> DeepSpeedZeroConfig:
    """The ZeRO section of a whole DeepSpeed config dict, validated (an absent section: stage 0)."""
    section = param_dict.get("zero_optimization", {})
    if isinstance(section, bool):  # DeepSpeed's oldest form: "zero_optimization": true is stage 1
        section = {"stage": int(section)}
    return DeepSpeedZeroConfig(**(section or {}))
