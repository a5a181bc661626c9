"""The one adapter from user buffers to what libzspeed takes: an address, a
size in bytes and elements, and (for the optimizer kernels and the NVMe
swapper) an element type. The async I/O handle, the swapper and the
optimizer wrappers all go through :func:`buf`, so a buffer is accepted or
refused, with the same message, wherever it is passed.

Accepted:
  * numpy arrays, C-contiguous;
  * torch tensors, contiguous, in CPU memory; where the caller allows it
    (``stage=True``, the I/O handle) also device tensors, which are copied
    through a host tensor (page-locked when CUDA is available). torch is
    never imported here: a tensor is recognised by its module;
  * any other object with the buffer protocol: bytearray, bytes (read-only),
    memoryview, array.array, ctypes arrays; its format gives the element
    type.
Element types map to ``DType``: float32, float16, bfloat16, int8 and uint8
(the 8-bit Adam codes). numpy has no bfloat16: a numpy (or buffer) uint16
array holds bf16 bit patterns, e.g. ``t.view(torch.int16).numpy().view(
numpy.uint16)`` of a torch bf16 tensor, or ml_dtypes' bfloat16 viewed as
uint16. Other element types (float64, int32, ...) have no DType: raw byte
transfers accept them, the kernels refuse them.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .._signatures.optim import BF16, F16, F32, Q8, DType

__all__ = ["Buf", "buf", "is_torch", "threads", "integer", "INT32", "INT64", "UINT64"]

# The ranges of the C integer types of the API, (lo, hi): integer() keeps a
# value inside its C type, and the library judges what the value means (a
# negative offset, a step of 0) with its own error.
INT32 = (-2 ** 31, 2 ** 31 - 1)
INT64 = (-2 ** 63, 2 ** 63 - 1)
UINT64 = (0, 2 ** 64 - 1)

# Element type names (numpy's, and torch's without "torch.") -> DType.
_NUMPY = {"float32": F32, "float16": F16, "uint16": BF16, "bfloat16": BF16,
          "int8": Q8, "uint8": Q8}
_TORCH = {"float32": F32, "bfloat16": BF16, "float16": F16, "int8": Q8,
          "uint8": Q8}
_NAMES = {F32: "fp32", BF16: "bf16", F16: "fp16", Q8: "8-bit codes"}


def is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


class Buf:
    """A described buffer.

    ``ptr`` (address), ``nbytes``, ``n`` (elements), ``dtype`` (a DType, or
    None for element types the kernels do not take), ``kind`` (the element
    type's name: "float32", "int8", ...). ``finish()`` completes a staged
    transfer into a device tensor; the object keeps alive whatever the
    address points into."""
    __slots__ = ("ptr", "nbytes", "n", "dtype", "kind", "_keep", "_device")

    def __init__(self, ptr: int, nbytes: int, n: int, dtype: DType | None,
                 kind: str, keep: Any, device: Any = None):
        self.ptr, self.nbytes, self.n, self.dtype, self.kind = ptr, nbytes, n, dtype, kind
        self._keep, self._device = keep, device

    def finish(self) -> None:
        """After a read into a staged device tensor: copy the host bytes to
        the device. Nothing to do for host memory."""
        if self._device is not None:
            self._device.copy_(self._keep)


def _torch_buf(x: Any, name: str, writable: bool, stage: bool) -> tuple:
    if not x.is_contiguous():
        raise ValueError(f"{name} is not contiguous; pass .contiguous()")
    src, device = x, None
    if x.device.type != "cpu":
        if not stage:
            raise ValueError(f"{name} is on {x.device}; zspeed needs it in CPU "
                             f"memory here (move it with .cpu())")
        import torch  # noqa: PLC0415 - only for device tensors, on purpose
        src = torch.empty(x.shape, dtype=x.dtype, device="cpu",
                          pin_memory=torch.cuda.is_available())
        if writable:
            device = x  # filled on the host, copied back by finish()
        else:
            src.copy_(x)
    kind = str(x.dtype).split(".")[-1]
    return (src.data_ptr(), src.numel() * src.element_size(), src.numel(),
            _TORCH.get(kind), kind, str(x.dtype), src, device)


def _numpy_buf(x: np.ndarray, name: str, writable: bool) -> tuple:
    if not x.flags["C_CONTIGUOUS"]:
        raise ValueError(f"{name} is not C-contiguous; pass "
                         f"numpy.ascontiguousarray({name})")
    if writable and not x.flags["WRITEABLE"]:
        raise ValueError(f"{name} is read-only; zspeed writes into it, pass a "
                         f"writeable array")
    kind = str(x.dtype)
    return (x.__array_interface__["data"][0], x.nbytes, x.size, _NUMPY.get(kind),
            kind, kind, x, None)


def buf(x: Any, name: str, *, writable: bool = False,
        allowed: tuple | None = (F32, BF16, F16), stage: bool = False) -> Buf:
    """Describes x, or raises TypeError / ValueError saying what is wrong
    with it and how to fix it.

    name: how messages call x. writable: zspeed writes into x (a read-only
    array is refused). allowed: the DTypes accepted (None = any element
    type, for raw bytes). stage: device tensors are copied through a host
    tensor instead of refused (call ``finish()`` after a read)."""
    if is_torch(x):
        parts = _torch_buf(x, name, writable, stage)
    elif isinstance(x, np.ndarray):
        parts = _numpy_buf(x, name, writable)
    else:
        try:
            view = np.asarray(memoryview(x))
        except (TypeError, ValueError, NotImplementedError):
            raise TypeError(f"{name} must be a numpy array, a torch tensor or a "
                            f"buffer (bytearray, memoryview, ctypes array), not "
                            f"{type(x).__name__}") from None
        ptr, nbytes, n, dt, kind, key, _, dev = _numpy_buf(view, name, writable)
        parts = (ptr, nbytes, n, dt, kind, key, (x, view), dev)
    ptr, nbytes, n, dt, kind, key, keep, device = parts
    if allowed is not None and (dt is None or dt not in allowed):
        want = ", ".join(_NAMES[a] for a in allowed)
        raise TypeError(f"{name} has dtype {key}; expected one of: {want}")
    return Buf(ptr, nbytes, n, dt, kind, keep, device)


def integer(value, name: str, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi] (or in the C type ``lo`` = INT32, INT64,
    UINT64), checked before it reaches a C integer.

    ctypes converts a Python int to a fixed-width C integer by dropping the
    high bits (2**64 + 4 becomes 4) and int() truncates floats (4.7 becomes
    4), so every integer argument of the library passes here first: ints
    and integer scalars of numpy and torch (anything with ``__index__``) are
    taken, bools and floats refused with TypeError, values outside the
    range with ValueError; both name the argument."""
    if hi is None:
        lo, hi = lo
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} "
                        f"({value!r})")
    v = operator.index(value)
    if not lo <= v <= hi:
        raise ValueError(f"{name} = {v} is out of range [{lo}, {hi}]")
    return v


def threads(num_threads) -> int:
    """None -> 0 (every thread of the default pool)."""
    if num_threads is None:
        return 0
    return integer(num_threads, "num_threads", 1, INT32[1])
