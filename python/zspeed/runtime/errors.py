"""The runtime's error classes, below every other module of it (config.py re-exports
ConfigError, where scripts import it from)."""
from __future__ import annotations

from .._native import ZSpeedError

__all__ = ["ConfigError", "UnusedParametersError"]


class ConfigError(ZSpeedError, ValueError):
    """The DeepSpeed config is invalid or asks for something zspeed cannot do."""


class UnusedParametersError(ZSpeedError, AssertionError):
    """zero_optimization.ignore_unused_parameters is false and trained parameters got no gradient
    (an AssertionError, as DeepSpeed raises there)."""
