"""DeepSpeed's offload enums (``deepspeed.runtime.zero.offload_config``): the devices of
``offload_optimizer`` / ``offload_param`` and the states of ``engine.offload_states``, and the
offload sections as objects (DeepSpeedZeroOffloadParamConfig / ...OptimizerConfig, built by
zero/config.py's DeepSpeedZeroConfig)."""
from __future__ import annotations

from enum import Enum

from ..errors import validates_like_pydantic

__all__ = ["OffloadDeviceEnum", "OffloadStateTypeEnum", "SchemaSection", "DeepSpeedZeroOffloadParamConfig",
           "DeepSpeedZeroOffloadOptimizerConfig"]


class OffloadDeviceEnum(str, Enum):
    """Where offloaded state lives: none (on the device), cpu or nvme."""
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, Enum):
    """The kinds of state engine.offload_states() moves (runtime/park.py says what each is in zspeed)."""
    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"


class ReadOnlyConfig:
    """A validated config section: every key a read-only attribute (zero/config.py's
    DeepSpeedZeroConfig and the offload sections below)."""

    def __init__(self, **values):
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError(f"a zspeed {type(self).__name__} is read-only; build a new one from the changed "
                             f"section")


class SchemaSection(ReadOnlyConfig):
    """A config section checked and defaulted by zspeed's schema alone (``SCHEMA[_section]``), as
    DeepSpeed's pydantic section classes are built from a dict: the offload sections here,
    runtime/precision_config.py's and zspeed.monitor's."""

    _section = ""

    @validates_like_pydantic
    def __init__(self, **values):
        from ..config import SCHEMA, _parse_section
        super().__init__(**_parse_section(self._section, values, SCHEMA[self._section].keys, set()))


class _Offload(SchemaSection):
    """A validated offload section, ``device`` as OffloadDeviceEnum: each key checked and
    defaulted by zspeed's schema (as DeepSpeedZeroConfig builds it, or directly)."""

    @validates_like_pydantic
    def __init__(self, **values):
        if isinstance(values.get("device"), Enum):
            values["device"] = values["device"].value
        super().__init__(**values)
        self._values["device"] = OffloadDeviceEnum(self._values["device"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device.value!r})"


class DeepSpeedZeroOffloadParamConfig(_Offload):
    """``zero_optimization.offload_param`` (DeepSpeed's name)."""

    _section = "zero_optimization.offload_param"


class DeepSpeedZeroOffloadOptimizerConfig(_Offload):
    """``zero_optimization.offload_optimizer`` (DeepSpeed's name); ``pipeline`` is true when
    pipeline_read or pipeline_write is, as DeepSpeed derives it."""

    _section = "zero_optimization.offload_optimizer"

    @validates_like_pydantic
    def __init__(self, **values):
        super().__init__(**values)
        self._values["pipeline"] = bool(self.pipeline_read or self.pipeline_write)
