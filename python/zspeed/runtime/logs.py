"""zspeed's logger (the standard ``logging`` logger named "zspeed", under which every zspeed
module logs) and the helpers around it, with DeepSpeed's names (``deepspeed.utils.logging``,
utils/logging.py, re-exports them)."""
from __future__ import annotations

import functools
import logging

__all__ = ["logger", "log_dist", "log_dist_once", "print_dist", "get_dist_msg", "set_log_level_from_string",
           "get_log_level_from_string", "get_current_level", "should_log_le"]

logger = logging.getLogger("zspeed")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}


@functools.lru_cache(None)
def _warning_once(*args, **kwargs):
    logger.warning(*args, **kwargs)


def _warning_once_method(*args, **kwargs):
    """``logger.warning`` that emits each distinct message once per process."""
    _warning_once(*args, **kwargs)


# DeepSpeed's logger carries this method; scripts call logger.warning_once(...).
logger.warning_once = _warning_once_method  # type: ignore[attr-defined]


def _rank() -> int | None:
    """This process's rank when a torch.distributed group exists, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


def get_dist_msg(message: str, ranks=None) -> str | None:
    """``"[Rank R] message"`` when this rank should log it, else None.

    DeepSpeed's rule: without a process group every process logs (rank shown as -1);
    with one, only the ranks listed in ``ranks`` log, and ``ranks=[-1]`` means all of
    them (no ``ranks`` means none)."""
    rank = _rank()
    if rank is None:
        return f"[Rank -1] {message}"
    ranks = list(ranks or [])
    if ranks and (ranks[0] == -1 or rank in ranks):
        return f"[Rank {rank}] {message}"
    return None


def log_dist(message: str, ranks=None, level: int = logging.INFO) -> None:
    """Logs ``message`` on the ranks ``get_dist_msg`` selects."""
    msg = get_dist_msg(message, ranks)
    if msg is not None:
        logger.log(level, msg)


@functools.lru_cache(None)
def _log_dist_once(message: str, ranks: tuple | None, level: int) -> None:
    log_dist(message, ranks=list(ranks) if ranks is not None else None, level=level)


def log_dist_once(message: str, ranks=None, level: int = logging.INFO) -> None:
    """``log_dist`` that logs each distinct (message, ranks, level) once per process."""
    _log_dist_once(message, tuple(ranks) if ranks is not None else None, level)


def print_dist(message: str, ranks=None) -> None:
    """Prints ``message`` on the ranks ``get_dist_msg`` selects (whatever the log level)."""
    msg = get_dist_msg(message, ranks)
    if msg is not None:
        print(msg)


def get_log_level_from_string(name: str) -> int:
    """"debug", "info", "warning", "error" or "critical" (any case) -> the logging level."""
    level = _LEVELS.get(str(name).lower())
    if level is None:
        raise ValueError(f"log level {name!r} is not one of {', '.join(_LEVELS)}")
    return level


def set_log_level_from_string(name: str, custom_logger: logging.Logger | None = None) -> None:
    """Sets the level of ``custom_logger`` (default: zspeed's logger) and of its handlers;
    zspeed's logger gets a stderr handler if neither it nor the root logger has one, so
    the level takes visible effect."""
    level = get_log_level_from_string(name)
    target = custom_logger if custom_logger is not None else logger
    target.setLevel(level)
    for h in target.handlers:
        h.setLevel(level)
    if target is logger and not target.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(name)s] %(message)s"))
        target.addHandler(handler)




def get_current_level() -> int:
    """The effective level of zspeed's logger."""
    return logger.getEffectiveLevel()


def should_log_le(max_log_level_str: str) -> bool:
    """Whether the logger's current level is at or below ``max_log_level_str`` ("info", ...)."""
    return get_current_level() <= get_log_level_from_string(max_log_level_str)
