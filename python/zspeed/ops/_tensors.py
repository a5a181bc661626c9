"""Turns numpy arrays and torch tensors into (address, dtype code, numel)
for the C kernels, without importing torch.

Accepted buffers are C-contiguous and in CPU memory. Element types:
fp32, bf16, fp16 for params/grads/outputs; fp32/bf16 for states; int8
(exp_avg codes), uint8 (exp_avg_sq codes) and fp32 scales for 8-bit Adam
states. numpy has no bfloat16: a numpy ``uint16`` array is read as bf16 bit
patterns (``x.view(np.uint16)`` of a torch bf16 tensor's ``.numpy()`` after
``.view(torch.int16)``, or ml_dtypes' bfloat16 viewed as uint16).
"""
from __future__ import annotations

from .._signatures.optim import BF16, F16, F32, Q8

__all__ = ["Buf", "buf", "is_torch"]

_NUMPY = {"float32": F32, "float16": F16, "uint16": BF16, "bfloat16": BF16,
          "int8": Q8, "uint8": Q8}
_TORCH = {"torch.float32": F32, "torch.bfloat16": BF16, "torch.float16": F16,
          "torch.int8": Q8, "torch.uint8": Q8}
_NAMES = {F32: "fp32", BF16: "bf16", F16: "fp16", Q8: "8-bit codes"}


class Buf:
    """address, dtype code (F32/BF16/F16/Q8), element count, element size
    and the kind of integer codes ("int8"/"uint8") for Q8."""
    __slots__ = ("ptr", "dtype", "n", "kind")

    def __init__(self, ptr: int, dtype: int, n: int, kind: str):
        self.ptr, self.dtype, self.n, self.kind = ptr, dtype, n, kind


def is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def buf(x, name: str, *, writable: bool = False, allowed=(F32, BF16, F16)) -> Buf:
    """Describes x for the C kernels or raises TypeError/ValueError that says
    what is wrong with it and how to fix it."""
    if is_torch(x):
        key = str(x.dtype)
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}; zspeed's optimizers run "
                             f"on CPU tensors (move it with .cpu())")
        if not x.is_contiguous():
            raise ValueError(f"{name} is not contiguous; pass .contiguous()")
        dt = _TORCH.get(key)
        ptr, n = x.data_ptr(), x.numel()
        kind = key.split(".")[-1]
    elif hasattr(x, "__array_interface__") and hasattr(x, "flags"):
        key = str(x.dtype)
        if not x.flags["C_CONTIGUOUS"]:
            raise ValueError(f"{name} is not C-contiguous; pass "
                             f"numpy.ascontiguousarray({name})")
        if writable and not x.flags["WRITEABLE"]:
            raise ValueError(f"{name} is read-only; it is updated in place, "
                             f"pass a writeable array")
        dt = _NUMPY.get(key)
        ptr, n = x.__array_interface__["data"][0], x.size
        kind = key
    else:
        raise TypeError(f"{name} must be a numpy array or a torch tensor, not "
                        f"{type(x).__name__}")
    if dt is None or dt not in allowed:
        want = ", ".join(_NAMES[a] for a in allowed)
        raise TypeError(f"{name} has dtype {key}; expected one of: {want}")
    return Buf(ptr, dt, n, kind)


def threads(num_threads) -> int:
    """None -> 0 (every thread of the default pool)."""
    if num_threads is None:
        return 0
    n = int(num_threads)
    if n < 1:
        raise ValueError(f"num_threads = {num_threads} must be >= 1, or None "
                         f"for all cores")
    return n
