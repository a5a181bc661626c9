"""DeepSpeed's ``deepspeed.utils.nvtx``: ``@instrument_w_nvtx`` marks each call of a function as
an NVTX range named after its qualified name (visible in Nsight Systems), through the
accelerator's ``range_push`` / ``range_pop`` (on CUDA torch.cuda.nvtx; on the CPU nothing).
The range is left out while torch.compile traces (it would break the graph) and when the
module's ``enable_nvtx`` is set false. An accelerator that declares ``supports_nvtx_domain``
gets the range in the "DeepSpeed" domain, as DeepSpeed's does."""
from __future__ import annotations

import functools

from ..accelerator import get_accelerator

__all__ = ["instrument_w_nvtx", "enable_nvtx", "DEEPSPEED_NVTX_DOMAIN", "is_compiling"]

enable_nvtx = True
DEEPSPEED_NVTX_DOMAIN = "DeepSpeed"


def is_compiling() -> bool:
    """True while torch.compile / dynamo traces (no NVTX ranges then)."""
    import torch
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(check()) if callable(check) else False


def _push(accelerator, msg):
    if getattr(accelerator, "supports_nvtx_domain", False):
        return accelerator.range_push(msg, domain=DEEPSPEED_NVTX_DOMAIN)
    return accelerator.range_push(msg)


def _pop(accelerator):
    if getattr(accelerator, "supports_nvtx_domain", False):
        return accelerator.range_pop(domain=DEEPSPEED_NVTX_DOMAIN)
    return accelerator.range_pop()


def instrument_w_nvtx(func):
    """Decorates ``func`` so that each call is one NVTX range (see the module's text). The
    range is closed when the call raises too."""

    @functools.wraps(func)
    def wrapped_fn(*args, **kwargs):
        if not (enable_nvtx and not is_compiling()):
            return func(*args, **kwargs)
        accelerator = get_accelerator()
        _push(accelerator, func.__qualname__)
        try:
            return func(*args, **kwargs)
        finally:
            _pop(accelerator)

    return wrapped_fn
