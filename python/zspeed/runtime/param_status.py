"""DeepSpeed's per-parameter ZeRO-3 attributes (``ds_id``, ``ds_persist``, ``ds_status``), set
by zero.Init when it partitions a parameter and kept up to date by the engine's fetcher
(runtime/zero3.py) as it gathers and releases it; and zero.Init's form of a partitioned
parameter outside an engine (``p.ds_tensor``, this rank's shard): whole again, cut again."""
from __future__ import annotations

import itertools
from enum import Enum

import torch
import torch.distributed as td

__all__ = ["ZeroParamStatus", "mark_partitioned", "mark_whole", "world", "comm_device", "init_gather", "init_scatter",
           "shard_only"]


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


# -- zero.Init's form of a partitioned parameter -------------------------------------------------
def world() -> tuple[int, int]:
    """(this rank, the world size) of the default process group; (0, 1) without one."""
    if td.is_available() and td.is_initialized():
        return td.get_rank(), td.get_world_size()
    return 0, 1


def comm_device() -> torch.device:
    """Where collectives run: with NCCL the GPU the engine will use (LOCAL_RANK's, or
    ZSPEED_DEVICE's), not torch's current device, which a script may not have set."""
    if td.get_backend() == "nccl":
        from .device import pick_device
        dev = pick_device()
        return dev if dev.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_gather(p) -> None:
    """A parameter zero.Init partitioned (not yet in an engine): its whole value into p.data."""
    rank, ws = world()
    dev = comm_device()
    s = p.ds_tensor.numel()
    full = torch.empty(s * ws, dtype=p.ds_tensor.dtype, device=dev)
    td.all_gather_into_tensor(full, p.ds_tensor.to(dev))
    p.data = full[:p.ds_numel].view(p.ds_shape).to(p.ds_tensor.device)
    p.ds_status = ZeroParamStatus.AVAILABLE


def init_scatter(p) -> None:
    """The whole value in ``p.data`` (the same on every rank) cut into this rank's ``p.ds_tensor``."""
    rank, ws = world()
    flat = p.data.reshape(-1)
    s = p.ds_tensor.numel()
    full = torch.zeros(s * ws, dtype=flat.dtype)
    full[:p.ds_numel].copy_(flat)
    p.ds_tensor.copy_(full[rank * s:(rank + 1) * s])
    shard_only(p)


def shard_only(p) -> None:
    """A zero.Init parameter back to its shard alone (``p.data`` emptied, in the shard's dtype)."""
    p.data = torch.empty(0, dtype=p.ds_tensor.dtype)
    p.ds_status = ZeroParamStatus.NOT_AVAILABLE
