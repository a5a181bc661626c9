"""zspeed.ops: the CPU optimizers, their statistics pass, and the async I/O
handle (``zspeed.ops.aio``).

Imports without torch. ``zspeed.ops.adam.CPUAdam``,
``zspeed.ops.adagrad.CPUAdagrad`` and ``zspeed.ops.lion.CPULion`` are
torch.optim.Optimizer subclasses built when first accessed (that imports
torch); the functions ``adam_step``, ``adagrad_step``, ``lion_step`` and
:func:`grad_stats` work on numpy arrays (and on CPU torch tensors) without
torch.
"""
from __future__ import annotations

from . import _kernels

__all__ = ["grad_stats", "qblocks"]


def __getattr__(name):
    # DeepSpeed's deepspeed.ops.__compatible_ops__ (op name -> whether it works here; libraries
    # read it to skip what cannot run), computed on first use.
    if name == "__compatible_ops__":
        from .op_builder import compatible_ops
        return compatible_ops()
    if name == "op_builder":
        import importlib
        return importlib.import_module(".op_builder", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

qblocks = _kernels.qblocks


def grad_stats(tensors, scale=1.0, num_threads=None):
    """Sum of squares of ``scale * g`` over every element of every tensor, and
    whether any of them is inf or NaN: ``(sumsq: float, nonfinite: bool)``.

    ``tensors``: a list of contiguous CPU torch tensors (fp32/bf16/fp16) or
    numpy arrays (float32, float16, or uint16 read as bf16 bits).
    ``scale * g`` is rounded to fp32 (as the optimizer sees it) and squared
    exactly in float64; per tensor the sum is deterministic for any thread
    count and SIMD level (fixed 16384-element chunks summed in order), and
    tensors are added in list order. The global gradient norm is
    ``sqrt(sumsq)``; ``nonfinite`` is True exactly when some element is
    inf/NaN (then sumsq is inf or NaN), for fp16 overflow skipping: nothing is
    modified, so the step can simply be skipped.
    ``num_threads``: None = the default pool (all cores; ZSPEED_NUM_THREADS
    overrides), else at most that many threads including the caller.
    """
    return _kernels.grad_stats(tensors, scale, num_threads)
