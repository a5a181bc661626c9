"""Helpers with DeepSpeed's names (``deepspeed.runtime.utils``) that scripts call."""
from __future__ import annotations

import gc
import os
import random

__all__ = ["set_random_seed", "see_memory_usage"]


def set_random_seed(seed: int) -> None:
    """Seeds Python's, numpy's and torch's generators (every device) with ``seed``."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def _host_used() -> str:
    from .memory import available_host_bytes
    avail = available_host_bytes()
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        total = None
    if avail is None or not total:
        return "CPU Virtual Memory: unknown on this system"
    used = total - avail
    return f"CPU Virtual Memory:  used = {used / 2 ** 30:.2f} GB, percent = {100.0 * used / total:.1f}%"


def see_memory_usage(message, force: bool = False) -> None:
    """DeepSpeed's debugging print: with ``force`` (else nothing), on rank 0 only, prints
    ``message``, the accelerator's memory allocated and reserved now and at peak (GB; on the CPU
    accelerator, as DeepSpeed's, the process's resident memory), and the host memory in use;
    then resets the peak counters so the next call shows the peak since this one."""
    if not force:
        return
    import torch.distributed as td
    from ..accelerator import get_accelerator
    if td.is_available() and td.is_initialized() and td.get_rank() != 0:
        return
    gc.collect()  # so the host figure does not count garbage not yet collected
    acc, gb = get_accelerator(), float(2 ** 30)
    print(message)
    print(f"MA {acc.memory_allocated() / gb:.2f} GB         Max_MA {acc.max_memory_allocated() / gb:.2f} GB         "
          f"CA {acc.memory_reserved() / gb:.2f} GB         Max_CA {acc.max_memory_reserved() / gb:.0f} GB ")
    print(_host_used())
    acc.reset_peak_memory_stats()
