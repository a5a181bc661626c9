"""DeepSpeed's tensor-fragment API (``deepspeed.utils.safe_get_full_fp32_param`` and its
siblings): one parameter's fp32 master, gradient or optimizer state, however ZeRO partitions
and offloads them. What each returns, when it is valid and what a write does:
zspeed/runtime/fragments.py and docs/COMPAT.md ("The tensor-fragment API").

The ``full`` functions are collectives with several ranks: every rank calls them, for the same
parameters in the same order. The ``local`` ones read or write this rank's part of a ZeRO-3
parameter (zspeed's pieces: a rank holds whole units, so its part of a parameter may be all of
it, a range of it, or nothing). For a parameter no engine trains (frozen, or no engine) the
getters return None and the setters do nothing, as DeepSpeed's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List

if TYPE_CHECKING:
    import torch

__all__ = ["safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_set_full_fp32_param", "safe_set_full_grad", "safe_set_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_grad", "safe_set_local_optimizer_state",
           "safe_update_full_grad_vectorized"]


def fragments_of(param):
    """The Fragments of the engine that trains ``param``, or None (runtime/fragments.py; imported
    on first use: zspeed.utils imports without torch)."""
    from ..runtime.fragments import fragments_of as of
    return of(param)


def _call(param, method: str, *args, **kwargs):
    """``method`` of the Fragments of ``param``'s engine, or None without one (the local calls
    refuse an engine below ZeRO-3 themselves)."""
    f = fragments_of(param)
    return None if f is None else getattr(f, method)(param, *args, **kwargs)


def safe_get_full_fp32_param(param: torch.nn.Parameter) -> torch.Tensor | None:
    """The parameter's whole fp32 master weight (on the engine's device), or None."""
    return _call(param, "get_fp32")


def safe_set_full_fp32_param(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Replaces the parameter's fp32 master weight with ``value`` (its whole shape); the model's
    weight follows."""
    _call(param, "set_fp32", value)


def safe_get_full_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """The parameter's whole gradient as the step will apply it (valid after a boundary's
    backward, before step()), or None."""
    return _call(param, "get_grad")


def safe_set_full_grad(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Replaces the parameter's gradient (its whole shape) for the coming step."""
    _call(param, "set_grad", value)


def safe_get_full_optimizer_state(param: torch.nn.Parameter, optim_state_key: str) -> torch.Tensor | None:
    """The parameter's whole optimizer state ``optim_state_key`` (e.g. "exp_avg") in fp32, or
    None (no engine, or no state before the first step)."""
    return _call(param, "get_state", optim_state_key)


def safe_set_full_optimizer_state(param: torch.nn.Parameter, value: torch.Tensor, optim_state_key: str) -> None:
    """Replaces the parameter's optimizer state ``optim_state_key`` (its whole shape)."""
    _call(param, "set_state", value, optim_state_key)


def safe_get_local_fp32_param(param: torch.nn.Parameter) -> torch.Tensor | None:
    """This rank's part of a ZeRO-3 parameter's fp32 master (1-D)."""
    return _call(param, "get_fp32", local=True)


def safe_set_local_fp32_param(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Replaces this rank's part of a ZeRO-3 parameter's fp32 master."""
    _call(param, "set_fp32", value, local=True)


def safe_get_local_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """This rank's part of a ZeRO-3 parameter's gradient (1-D)."""
    return _call(param, "get_grad", local=True)


def safe_set_local_grad(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """Replaces this rank's part of a ZeRO-3 parameter's gradient."""
    _call(param, "set_grad", value, local=True)


def safe_get_local_optimizer_state(param: torch.nn.Parameter, optim_state_key: str) -> torch.Tensor | None:
    """This rank's part of a ZeRO-3 parameter's optimizer state (1-D fp32)."""
    return _call(param, "get_state", optim_state_key, local=True)


def safe_set_local_optimizer_state(param: torch.nn.Parameter, value: torch.Tensor, optim_state_key: str) -> None:
    """Replaces this rank's part of a ZeRO-3 parameter's optimizer state."""
    _call(param, "set_state", value, optim_state_key, local=True)


def safe_update_full_grad_vectorized(param_list: List[torch.nn.Parameter], update_func: Callable) -> None:
    """Each parameter's gradient replaced by ``update_func(gradient, parameter)`` (DeepSpeed's
    batched form of safe_get_full_grad + safe_set_full_grad)."""
    for p in param_list:
        f = fragments_of(p)
        if f is not None:
            f.set_grad(p, update_func(f.get_grad(p), p))
