"""DeepSpeed's ``deepspeed.monitor.config``: the monitor sections as objects, each checked and
defaulted by zspeed's config schema (python/zspeed/runtime/config.py), a bad one raising
pydantic's ValidationError where pydantic is installed (ConfigError otherwise), as DeepSpeed's
pydantic models do."""
from __future__ import annotations

from ..runtime.errors import ConfigError, validates_like_pydantic
from ..runtime.zero.offload_config import ReadOnlyConfig, SchemaSection

__all__ = ["TensorBoardConfig", "WandbConfig", "CSVConfig", "CometConfig", "DeepSpeedMonitorConfig",
           "get_monitor_config"]


class _Section(SchemaSection):
    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values.items() if k != 'api_key')})"


class TensorBoardConfig(_Section):
    """The ``tensorboard`` section: enabled, output_path, job_name."""
    _section = "tensorboard"


class WandbConfig(_Section):
    """The ``wandb`` section: enabled, group, team, project."""
    _section = "wandb"


class CSVConfig(_Section):
    """The ``csv_monitor`` section: enabled, output_path, job_name."""
    _section = "csv_monitor"


class CometConfig(_Section):
    """The ``comet`` section: enabled, samples_log_interval, project, workspace, api_key,
    experiment_name, experiment_key, online, mode."""
    _section = "comet"


_CLASSES = {"tensorboard": TensorBoardConfig, "wandb": WandbConfig, "csv_monitor": CSVConfig, "comet": CometConfig}


class DeepSpeedMonitorConfig(ReadOnlyConfig):
    """The four monitor sections (each a dict or its config object; absent: disabled) and
    ``enabled``, true when any of them is."""

    @validates_like_pydantic
    def __init__(self, tensorboard=None, wandb=None, csv_monitor=None, comet=None):
        given = {"tensorboard": tensorboard, "wandb": wandb, "csv_monitor": csv_monitor, "comet": comet}
        values = {}
        for name, section in given.items():
            cls = _CLASSES[name]
            if isinstance(section, cls):
                values[name] = section
            elif section is None or isinstance(section, dict):
                values[name] = cls(**(section or {}))
            else:
                raise ConfigError(f"{name} must be an object (a dict), got {type(section).__name__}.")
        values["enabled"] = any(v.enabled for v in values.values())
        super().__init__(**values)

    def __repr__(self) -> str:
        on = [k for k in _CLASSES if self._values[k].enabled]
        return f"DeepSpeedMonitorConfig(enabled: {', '.join(on) if on else 'none'})"


def get_monitor_config(param_dict: dict) -> DeepSpeedMonitorConfig:
    """The monitor sections of a whole config dict (DeepSpeed's helper)."""
    return DeepSpeedMonitorConfig(**{k: param_dict.get(k) for k in _CLASSES})
