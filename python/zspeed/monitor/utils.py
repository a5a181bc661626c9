"""DeepSpeed's ``deepspeed.monitor.utils``: checks that a monitor's package is installed, raising
an ImportError that names the package and the way out (DeepSpeed prints a line and re-raises)."""
from __future__ import annotations

import importlib

from .._native import ZSpeedError

__all__ = ["MonitorUnavailableError", "check_tb_availability", "check_wandb_availability",
           "check_comet_availability"]


class MonitorUnavailableError(ZSpeedError, ImportError):
    """A monitor section is enabled but the package it writes through is not installed."""


def _need(module: str, section: str, install: str, minimum: tuple | None = None):
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise MonitorUnavailableError(
            f"the config's {section} section is enabled but {module} does not import ({e}); install it "
            f"(pip install {install}) or set \"{section}\": {{\"enabled\": false}}.") from None
    if minimum is not None:
        have = _version_tuple(getattr(mod, "__version__", "0"))
        if have < minimum:
            raise MonitorUnavailableError(
                f"the config's {section} section needs {module} >= {'.'.join(map(str, minimum))}, found "
                f"{getattr(mod, '__version__', 'unknown')}; pip install \"{install}\" or set \"{section}\": "
                f"{{\"enabled\": false}}.")
    return mod


def _version_tuple(text: str) -> tuple:
    out = []
    for part in str(text).split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        out.append(int(digits) if digits else 0)
    return tuple(out + [0] * (3 - len(out)))


def check_tb_availability():
    """TensorBoard's package (torch.utils.tensorboard needs it)."""
    return _need("tensorboard", "tensorboard", "tensorboard")


def check_wandb_availability():
    return _need("wandb", "wandb", "wandb")


def check_comet_availability():
    return _need("comet_ml", "comet", "comet_ml>=3.41.0", minimum=(3, 41, 0))
