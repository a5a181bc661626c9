"""The runtime's error classes, below every other module of it (config.py re-exports
ConfigError, where scripts import it from)."""
from __future__ import annotations

from .._native import ZSpeedError

__all__ = ["as_validation_error", "validates_like_pydantic", "ConfigError", "ConfigAssertionError", "ConfigNotImplementedError", "ZeRORuntimeException", "ZeRORuntimeConfigError", "UnusedParametersError", "FragmentError", "NotPartitionedError", "NoSyncError", "NoOptimizerError"]


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


def as_validation_error(title: str, err: Exception) -> Exception:
    """What DeepSpeed's pydantic config classes raise for a bad section: pydantic's ValidationError
    (a ValueError) titled ``title`` and carrying ``err``'s message, where pydantic is installed
    (DeepSpeed depends on it, zspeed does not); ``err`` itself otherwise."""
    try:
        from pydantic_core import ValidationError
    except ImportError:
        return err
    return ValidationError.from_exception_data(title, [{"type": "value_error", "loc": (), "input": None,
                                                        "ctx": {"error": err}}])


def validates_like_pydantic(init):
    """Decorates the ``__init__`` of a class named as one of DeepSpeed's config models: a
    ConfigError it raises becomes :func:`as_validation_error`'s, as the class scripts catch."""
    import functools

    @functools.wraps(init)
    def wrapped(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except ConfigError as e:
            raise as_validation_error(type(self).__name__, e) from None
    return wrapped


def one_line(e: BaseException) -> str:
    """An exception as its type and the first line of its text (the type alone without text)."""
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
