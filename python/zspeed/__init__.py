"""zspeed: DeepSpeed's memory-saving training machinery (ZeRO-Offload of
optimizer state to CPU memory and NVMe, async I/O, SIMD CPU optimizers) as a
portable C11 library with a thin pure-Python front end."""
from ._version import __version__
from ._native import NativeError, ZSpeedError

__all__ = ["__version__", "ZSpeedError", "NativeError"]
