"""DeepSpeed's per-parameter ZeRO-3 attributes (``ds_id``, ``ds_persist``, ``ds_status``), set
by zero.Init when it partitions a parameter and kept up to date by the engine's fetcher
(runtime/zero3.py) as it gathers and releases it."""
from __future__ import annotations

import itertools
from enum import Enum

__all__ = ["ZeroParamStatus", "mark_partitioned", "mark_whole"]


class ZeroParamStatus(Enum):
    """DeepSpeed's ``p.ds_status`` values (also in partition_parameters)."""
    AVAILABLE = 1       # whole, in the parameter
    NOT_AVAILABLE = 2   # only the shards exist
    INFLIGHT = 3        # being gathered


_PARAM_IDS = itertools.count()  # DeepSpeed's p.ds_id: unique per partitioned parameter in the process


def mark_partitioned(p, persistent: bool = False, sanity_checks: bool | None = None,
                     status: ZeroParamStatus = ZeroParamStatus.NOT_AVAILABLE) -> None:
    """DeepSpeed's attributes of a ZeRO-3 parameter, which libraries read (peft, accelerate, TRL):
    ``ds_id`` (kept once given), ``ds_persist``, ``ds_status`` (NOT_AVAILABLE: shards only) and
    ``ds_active_sub_modules`` (the set of the ``ds_id`` of the modules whose forward or backward is
    running with it whole; TRL clears it, zspeed's releases do not depend on it);
    ``ds_enable_sanity_checks`` (zero_optimization.enable_sanity_checks, read by
    GatheredParameters) when given."""
    if not hasattr(p, "ds_id"):
        p.ds_id = next(_PARAM_IDS)
    if not hasattr(p, "ds_active_sub_modules"):  # the ds_ids of the modules running with it whole
        p.ds_active_sub_modules = set()
    p.ds_persist = persistent
    p.ds_status = status
    if sanity_checks is not None:
        p.ds_enable_sanity_checks = bool(sanity_checks)


def mark_whole(p, sanity_checks: bool | None = None) -> None:
    """DeepSpeed's attributes of a parameter zero.Init processed but kept whole (one rank: zspeed
    does not cut it, docs/COMPAT.md): ``ds_id`` (DeepSpeed's mark that zero.Init processed it),
    ``ds_persist`` False and ``ds_status`` AVAILABLE (it is whole)."""
    mark_partitioned(p, False, sanity_checks, ZeroParamStatus.AVAILABLE)
