"""DeepSpeed's ``deepspeed.runtime.swap_tensor`` constants, which tests and scripts use to size
tensors for NVMe offload (DeepSpeed's swapper does not swap tensors smaller than
MIN_SWAPPABLE_BYTES). zspeed's NVMe offload has no such size threshold (what goes to disk is
set by offload_optimizer / offload_param: docs/OFFLOAD.md), so the values only serve code that
sizes its own tensors by them."""
from __future__ import annotations

__all__ = ["MIN_AIO_BYTES", "AIO_ALIGNED_BYTES", "MIN_SWAPPABLE_BYTES"]

MIN_AIO_BYTES = 1024 ** 2
AIO_ALIGNED_BYTES = 1024
MIN_SWAPPABLE_BYTES = MIN_AIO_BYTES
