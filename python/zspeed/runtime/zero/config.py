"""DeepSpeed's ZeRO config names (``deepspeed.runtime.zero.config``): ``ZeroStageEnum``,
``DeepSpeedZeroConfig`` and ``get_zero_config``.

Scripts import these to name stages (``ZeroStageEnum.weights``), to register DeepSpeed's types
with ``torch.serialization.add_safe_globals`` before resuming a Trainer checkpoint, and to
read a config's ZeRO section. ``DeepSpeedZeroConfig(**section)`` validates the section with
zspeed's own schema (unknown keys and bad values raise pydantic's ValidationError carrying
zspeed's message naming the key, as DeepSpeed's pydantic model does, where pydantic is
installed, and zspeed's ConfigError where not; both are ValueErrors), and exposes
every key as an attribute with its default filled in; ``offload_param`` and
``offload_optimizer`` are the offload config objects of offload_config.py (also with device
"none"), or None when the section is absent or null, as DeepSpeed's; ``leaf_module`` is a DeepSpeedZeroLeafModuleConfig
(leaf_module_config.py). DeepSpeed's deprecated spellings are accepted:
``cpu_offload`` (optimizer to cpu), ``cpu_offload_param`` (parameters to cpu) and
``cpu_offload_use_pin_memory``. As DeepSpeed's model, it checks each key, not the rules
between them (parameter offload below stage 3 is refused when a run starts, not here). Unlike
DeepSpeed's pydantic model, the object is read-only.
"""
from __future__ import annotations

from enum import Enum

from ..errors import validates_like_pydantic
from .leaf_module_config import DeepSpeedZeroLeafModuleConfig
from .offload_config import DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig, ReadOnlyConfig

__all__ = ["ZeroStageEnum", "DeepSpeedZeroConfig", "get_zero_config", "DeepSpeedZeroOffloadParamConfig",
           "DeepSpeedZeroOffloadOptimizerConfig", "DeepSpeedZeroLeafModuleConfig"]


class ZeroStageEnum(int, Enum):
    """The ZeRO stages by what they partition (DeepSpeed's names)."""
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


# DeepSpeed's deprecated booleans and the section each turns on (on the cpu).
_DEPRECATED = {"cpu_offload_param": "offload_param", "cpu_offload": "offload_optimizer"}


def _section_object(cls, given, values: dict):
    """The offload section as its config object (also with device "none"), or None where the
    section is absent or null, as DeepSpeed's fields."""
    return None if given is None else cls(**values)


class DeepSpeedZeroConfig(ReadOnlyConfig):
    """A validated ``zero_optimization`` section (see the module docstring)."""

    @validates_like_pydantic
    def __init__(self, **section):
        from ..config import _ZERO_FIELD_NAMES, deprecated_zero_keys, parse_zero_section
        from ..plan import overlap_comm
        section = dict(section)
        pin = section.pop("cpu_offload_use_pin_memory", None)
        flags = {old: section.pop(old, None) for old in _DEPRECATED}
        for old, new in _DEPRECATED.items():  # a deprecated boolean: its section on the cpu
            if flags[old] and section.get(new) is None:
                section[new] = {"device": "cpu"}
        section["cpu_offload"] = bool(flags["cpu_offload"])  # (a field of the schema; the other one is not)
        given = {k: section.get(k) for k in ("offload_param", "offload_optimizer")}
        if pin is not None:
            for key in ("offload_param", "offload_optimizer"):
                if isinstance(section.get(key), dict):
                    section[key] = {"pin_memory": bool(pin), **section[key]}
        zero, off, offp = parse_zero_section(section)  # the schema checks the stage (0-3) too
        if deprecated_zero_keys(zero):
            from ...utils.logging import logger
            for text in deprecated_zero_keys(zero):
                logger.warning(text)
        zenflow = zero.pop("zenflow", None)
        values = dict(zero)
        for field, key in _ZERO_FIELD_NAMES.items():  # DeepSpeed's attribute names of the stage3_* keys
            values[field] = zero[key]
        # the older fp16 spelling is the same field in DeepSpeed's model (an alias of it)
        values["gather_16bit_weights_on_model_save"] = bool(zero["stage3_gather_16bit_weights_on_model_save"] or
                                                            zero["stage3_gather_fp16_weights_on_model_save"])
        values["stage"] = ZeroStageEnum(zero["stage"])
        values["overlap_comm"] = overlap_comm(zero)  # resolved as DeepSpeed's validator does
        values["offload_param"] = _section_object(DeepSpeedZeroOffloadParamConfig, given["offload_param"], offp)
        values["offload_optimizer"] = _section_object(DeepSpeedZeroOffloadOptimizerConfig,
                                                      given["offload_optimizer"], off)
        values["cpu_offload_param"], values["cpu_offload_use_pin_memory"] = flags["cpu_offload_param"], pin
        values["zenflow"] = None if zenflow is None else ReadOnlyConfig(**zenflow)
        values["leaf_module"] = DeepSpeedZeroLeafModuleConfig(**zero["leaf_module"])
        super().__init__(**values)

    def __repr__(self) -> str:
        return f"DeepSpeedZeroConfig(stage={int(self.stage)}, offload_param={self.offload_param!r}, " \
               f"offload_optimizer={self.offload_optimizer!r})"


def get_zero_config(param_dict: dict) -> DeepSpeedZeroConfig:
    """The ZeRO section of a whole DeepSpeed config dict, validated (an absent section: stage 0)."""
    section = param_dict.get("zero_optimization", {})
    if isinstance(section, bool):  # DeepSpeed's oldest form: "zero_optimization": true is stage 1
        section = {"stage": int(section)}
    return DeepSpeedZeroConfig(**(section or {}))
