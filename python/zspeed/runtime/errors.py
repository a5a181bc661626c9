"""The runtime's error classes, below every other module of it (config.py re-exports
ConfigError, where scripts import it from)."""
from __future__ import annotations

from .._native import ZSpeedError

__all__ = ["ConfigError", "ConfigAssertionError", "ConfigNotImplementedError", "ZeRORuntimeException", "ZeRORuntimeConfigError", "UnusedParametersError", "FragmentError", "NotPartitionedError", "NoSyncError", "NoOptimizerError"]


class ConfigError(ZSpeedError, ValueError):
    """The DeepSpeed config is invalid or asks for something zspeed cannot do."""


class ConfigAssertionError(ConfigError, AssertionError):
    """A config DeepSpeed refuses with an assertion (scripts written for it catch AssertionError)."""


class ConfigNotImplementedError(ConfigError, NotImplementedError):
    """A config DeepSpeed refuses with NotImplementedError (a combination it does not implement)."""


class ZeRORuntimeException(Exception):
    """DeepSpeed's deepspeed.runtime.zero.utils.ZeRORuntimeException (the class scripts catch)."""


class ZeRORuntimeConfigError(ConfigError, ZeRORuntimeException):
    """A misuse DeepSpeed refuses with ZeRORuntimeException (a ConfigError, and that class)."""


class UnusedParametersError(ZSpeedError, AssertionError):
    """zero_optimization.ignore_unused_parameters is false and trained parameters got no gradient
    (an AssertionError, as DeepSpeed raises there)."""


class FragmentError(ZSpeedError, ValueError):
    """A tensor-fragment call (zspeed.utils.safe_get_full_grad and its siblings) that cannot be
    served: a value of the wrong size, a state the optimizer does not keep, gradients read
    outside backward..step."""


class NotPartitionedError(FragmentError, AssertionError):
    """A safe_*_local_* call on a parameter that ZeRO-3 does not partition (an AssertionError,
    as DeepSpeed raises there)."""


class NoSyncError(ZSpeedError, AssertionError):
    """A misuse of engine.no_sync() or engine.coalesce_grad_reduction(): step() inside, a context
    inside another, no_sync where gradients are partitioned (an AssertionError, as DeepSpeed
    raises there)."""


class NoOptimizerError(ZSpeedError, RuntimeError):
    """A training call (backward, step, a checkpoint of the optimizer) on an engine built without
    an optimizer (zspeed.initialize with neither optimizer= nor an 'optimizer' section: the
    engine runs the model's forward only, as DeepSpeed's ZeRO-Inference does)."""
