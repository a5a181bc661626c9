"""Which device this process trains on (chosen once, before anything is built)."""
from __future__ import annotations

import os

import torch

from .. import comm
from .errors import ConfigError

__all__ = ["pick_device"]


def pick_device() -> torch.device:
    """CUDA (device LOCAL_RANK) when available, else the CPU; ZSPEED_DEVICE=cpu|cuda|cuda:N forces one."""
    forced = os.environ.get("ZSPEED_DEVICE")
    if forced:
        try:
            dev = torch.device(forced)
        except RuntimeError:
            raise ConfigError(f"ZSPEED_DEVICE={forced!r} is not a device; use cpu, cuda or cuda:N.") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"ZSPEED_DEVICE={forced!r} but torch sees no CUDA device; unset it or use cpu.")
        if dev.type not in ("cpu", "cuda"):
            raise ConfigError(f"ZSPEED_DEVICE={forced!r}: zspeed runs on cpu or cuda.")
        return dev
    if torch.cuda.is_available():
        local = comm.get_local_rank()
        if local >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK={local} but torch sees {torch.cuda.device_count()} GPU(s): start at most "
                              f"one rank per GPU on each host (or set ZSPEED_DEVICE=cpu).")
        return torch.device("cuda", local)
    return torch.device("cpu")
