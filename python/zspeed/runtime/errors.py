"""The runtime's error classes, below every other module of it (config.py re-exports
ConfigError, where scripts import it from)."""
from __future__ import annotations

from .._native import ZSpeedError

__all__ = ["ConfigError"]


class ConfigError(ZSpeedError, ValueError):
    """The DeepSpeed config is invalid or asks for something zspeed cannot do."""
