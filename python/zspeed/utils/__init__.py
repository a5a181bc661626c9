"""DeepSpeed's ``deepspeed.utils`` names that training scripts use: the ``logger``,
``log_dist`` / ``log_dist_once`` (log on chosen ranks), ``set_log_level_from_string``,
``RepeatingLoader``, ``required_torch_version`` (also as ``deepspeed.utils.torch``) and the
ZeRO-3 leaf modules (``set_z3_leaf_modules`` and its siblings, z3_leaf_module.py).

The logger is the standard ``logging`` logger named "zspeed" (every zspeed module logs
under it). As a library, zspeed adds no handler of its own: a script that wants zspeed's
info messages configures logging (``logging.basicConfig(level=logging.INFO)``) or calls
``set_log_level_from_string("info")``, which also gives the logger a handler when the
application has none, so the messages appear.
"""
from __future__ import annotations

import functools
import logging

from ..runtime.dataloader import RepeatingLoader
from .tensor_fragment import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,
                              safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
                              safe_set_full_fp32_param, safe_set_full_grad, safe_set_full_optimizer_state,
                              safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
                              safe_update_full_grad_vectorized)
from .tensor_fragment import __all__ as _FRAGMENT_NAMES
from .z3_leaf_module import (get_z3_leaf_modules, set_z3_leaf_modules, set_z3_leaf_modules_by_name,
                             set_z3_leaf_modules_by_suffix, unset_z3_leaf_modules, z3_leaf_module,
                             z3_leaf_parameter)

__all__ = ["logger", "log_dist", "log_dist_once", "print_dist", "set_log_level_from_string",
           "get_log_level_from_string", "RepeatingLoader", "get_dist_msg", "required_torch_version",
           "set_z3_leaf_modules", "unset_z3_leaf_modules", "get_z3_leaf_modules", "set_z3_leaf_modules_by_name",
           "set_z3_leaf_modules_by_suffix", "z3_leaf_module", "z3_leaf_parameter", *_FRAGMENT_NAMES]

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


def _release(version: str) -> tuple:
    """(release numbers, 0 for a pre-release or dev build else 1) of a version string such as
    "2.11.0+cu130", "2.5.0a0" or 2.1; the local part after "+" does not count."""
    import re
    text = str(version).split("+", 1)[0].strip()
    m = re.match(r"v?(\d+(?:\.\d+)*)(.*)$", text)
    if m is None:
        raise ValueError(f"required_torch_version: {version!r} is not a version (write it as 2.1 or '2.1.0')")
    nums = [int(x) for x in m.group(1).split(".")]
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    rest = m.group(2).lower().lstrip(".-_")
    return tuple(nums), 0 if rest.startswith(("a", "b", "c", "rc", "pre", "dev")) else 1


def required_torch_version(min_version=None, max_version=None) -> bool:
    """DeepSpeed's ``deepspeed.utils.torch.required_torch_version``: whether the installed
    torch is at least ``min_version`` and at most ``max_version`` (either may be left out, not
    both; numbers such as 2.1 or strings such as "2.1.0"). A pre-release (2.5.0a0) counts as
    below its release."""
    if min_version is None and max_version is None:
        raise ValueError("required_torch_version: give min_version, max_version or both")
    from .._requires import require_torch
    require_torch()
    import torch
    have = _release(torch.__version__)
    if min_version is not None and have < _release(min_version):
        return False
    if max_version is not None and have > _release(max_version):
        return False
    return True
