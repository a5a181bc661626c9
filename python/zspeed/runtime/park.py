"""``engine.offload_states()`` / ``reload_states()`` (DeepSpeed's names): the engine's states on
the device moved into host memory and back, bit for bit, for the phases of a run that need the
GPU memory for something else (an RLHF loop's generation, another model's evaluation).

How a state moves: every storage under its tensors is copied into a host buffer (page-locked
with ``pin_memory``) and resized to 0 bytes. That frees the device memory while each tensor and
view over the storage stays the same object, so nothing that holds one (a flat buffer, the
optimizer's views of it, the parameters) has to be told; reload_states() gives each storage its
size back and copies the bytes in. A tensor over a parked storage must not be read until then:
the engine refuses its own calls that would (forward while the weights are away, and backward,
step, zero_grad, checkpoints and the tensor-fragment API while anything is away), and the
parameters' ``data``, ``grad`` and ZeRO-3 ``ds_tensor`` point at their host copies meanwhile, so
a script can read (and write) them on the host.

What each of DeepSpeed's state kinds (runtime.zero.offload_config.OffloadStateTypeEnum) is here:

  lp_params      the model's 16-bit weights: the parameters and the parameter store's shards
  hp_params      the fp32 master weights that live on the device
  optim_states   the optimizer's state that lives on the device (Adam's moments ...)
  lp_grads       every other tensor the optimizer path and the gradient sync keep on the device:
                 gradients and their buffers (``contiguous_grad_buffer`` names the same set)

The masters and states of an offloaded optimizer are in host memory already and stay where they
are, as DeepSpeed leaves a CPU optimizer's. The tensors are found by walking the engine's parts
(the optimizer path and the gradient sync) for the tensors they hold, so a new part is covered
without a list to keep up to date; the weights come from the model and the parameter store.
"""
from __future__ import annotations

import gc
import logging
from enum import Enum

import torch

from .._native import ZSpeedError

__all__ = ["KINDS", "ParkedStates", "StatesAwayError"]

log = logging.getLogger("zspeed.engine")

# DeepSpeed's OffloadStateTypeEnum values, in the order a storage is claimed: a storage two kinds
# reach (the 16-bit weights a path writes into, masters that are the parameters at fp32) belongs
# to the first.
KINDS = ("lp_params", "hp_params", "optim_states", "lp_grads", "contiguous_grad_buffer")
_SAME_SET = {"contiguous_grad_buffer": "lp_grads"}


class StatesAwayError(ZSpeedError, RuntimeError):
    """An engine call that needs states that engine.offload_states() moved to host memory."""


def kinds_of(include) -> list:
    """``include`` (None for every kind, or kinds as OffloadStateTypeEnum members or their
    names) as zspeed's sets, checked."""
    if include is None:
        return ["lp_params", "hp_params", "optim_states", "lp_grads"]
    if isinstance(include, (str, Enum)):
        include = [include]
    out = []
    for k in include:
        name = k.value if isinstance(k, Enum) else k
        if name not in KINDS:
            raise ValueError(f"engine.offload_states(include=...): unknown state {k!r}; the states are "
                             f"{', '.join(KINDS)} (deepspeed.runtime.zero.offload_config.OffloadStateTypeEnum), "
                             f"or include=None for all of them")
        name = _SAME_SET.get(name, name)
        if name not in out:
            out.append(name)
    return out


def _walk(roots: list, skip: tuple) -> list:
    """Every tensor the objects in ``roots`` hold (zspeed's own objects, torch optimizers, and
    the lists, tuples and dicts among them), with the kind its place says: an optimizer's
    state is optim_states, its parameters hp_params, anything else lp_grads. Modules and the
    ``skip`` types are not entered."""
    out, seen = [], set()
    stack = [(r, "lp_grads") for r in roots]
    while stack:
        obj, kind = stack.pop()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out.append((obj, kind))
            if obj.grad is not None:
                stack.append((obj.grad, "lp_grads"))
        elif isinstance(obj, (list, tuple)):
            stack.extend((x, kind) for x in obj)
        elif isinstance(obj, dict):
            stack.extend((x, kind) for x in obj.values())
        elif isinstance(obj, torch.optim.Optimizer):
            stack.extend((v, "optim_states") for v in obj.state.values())
            stack.extend((g["params"], "hp_params") for g in obj.param_groups)
            if type(obj).__module__.startswith("zspeed."):
                stack.extend((v, kind) for v in vars(obj).values())
        elif isinstance(obj, (torch.nn.Module, *skip)):
            continue
        elif type(obj).__module__.startswith("zspeed.") and hasattr(obj, "__dict__"):
            stack.extend((v, kind) for v in vars(obj).values())
    return out


class _Parked:
    """One storage in host memory: the storage (0 bytes until put back) and its bytes."""

    __slots__ = ("storage", "host")

    def __init__(self, storage, host: torch.Tensor):
        self.storage, self.host = storage, host


class ParkedStates:
    """The engine's states that offload_states() moved to host memory (see the module
    docstring). ``device``: the engine's device; only storages there move."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._device_module = torch.get_device_module(self.device)  # torch.cuda, torch.cpu: synchronize()
        self._parked: dict = {}            # storage data_ptr at parking -> _Parked
        self._by_kind: dict = {}           # kind away -> [data_ptr], in the order they left
        self._pointed: list = []           # (parameter, attribute, the original tensor)

    @property
    def kinds(self) -> list:
        """The kinds away, in the order they left."""
        return list(self._by_kind)

    @property
    def away(self) -> bool:
        return bool(self._by_kind)

    def bytes_away(self) -> dict:
        """kind -> the bytes of that kind in host memory now."""
        return {k: sum(self._parked[ptr].host.numel() for ptr in self._by_kind[k]) for k in self.kinds}

    # -- the engine's checks ------------------------------------------------------------------
    def refuse(self, engine, caller, *, weights_only: bool = False) -> None:
        """Raises when the engine call running in frame ``caller`` needs states that are away:
        every kind, or with ``weights_only`` (a forward) the 16-bit weights."""
        if not self.kinds or (weights_only and "lp_params" not in self.kinds):
            return
        name = caller.f_code.co_name if caller.f_locals.get("self") is engine else "_fragments"
        what = (f"engine.{name}()" if not name.startswith("_") else
                "loss.backward()" if name == "_begin_direct_backward" else
                "the tensor-fragment API (deepspeed.utils.safe_get_full_grad and its siblings)")
        raise StatesAwayError(
            f"zspeed: {what} needs the engine's states on the device, and engine.offload_states() moved "
            f"{', '.join(self.kinds)} to host memory: call engine.reload_states() first")

    @staticmethod
    def kinds_to_move(include, device) -> list:
        """engine.offload_states()'s ``include`` as zspeed's sets (see :func:`kinds_of`), after
        checking ``device`` as DeepSpeed does: "cpu" (the default) or OffloadDeviceEnum.cpu; none
        moves nothing (a warning); anything else is refused."""
        where = device.value if isinstance(device, Enum) else ("cpu" if device is None else str(device))
        if where == "none":
            log.warning("zspeed: engine.offload_states(device=none): no device to move the states to; nothing moved")
            return []
        if where != "cpu":
            raise ValueError(f"engine.offload_states(device={where!r}): the states move to host memory only "
                             f"(device=OffloadDeviceEnum.cpu, the default), as in DeepSpeed; NVMe is for the "
                             f"optimizer state of the whole run: zero_optimization.offload_optimizer.device \"nvme\"")
        return kinds_of(include)

    # -- moving --------------------------------------------------------------------------------
    def _claims(self, params: list, stores: list, roots: list, skip: tuple) -> dict:
        """kind -> the storages (by data_ptr) on the device it claims, each storage once."""
        found = [(p, "lp_params") for p in params]
        for sm in stores:
            found.extend((t, "lp_params") for row in sm.local_layout.params for t in row)
        found.extend(_walk(roots, skip))
        claims: dict = {}
        taken: dict = {}
        for t, kind in found:
            if t.device != self.device or t.numel() == 0:
                continue
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr == 0 or ptr in taken or ptr in self._parked or not st.resizable():
                continue
            taken[ptr] = st
            claims.setdefault(kind, []).append((ptr, st))
        return claims

    def offload(self, include, device, module: torch.nn.Module, fetcher, settle, *, stores: list, roots: list,
                pin_memory: bool, non_blocking: bool) -> None:
        """engine.offload_states(include, device, ...): after ``settle()`` (a step running in the
        background finishes: it uses the buffers) and, when the weights go, the ZeRO-3 ``fetcher``'s
        release of every gathered weight, the states move (:meth:`park`)."""
        kinds = self.kinds_to_move(include, device)
        if not kinds:
            return
        settle()
        if "lp_params" in kinds and fetcher is not None:
            fetcher.release_all(persistent_too=True)  # gathered weights go back to their shards
        self.park(kinds, module, stores + [getattr(fetcher, "sm", None)], roots, pin_memory=pin_memory,
                  non_blocking=non_blocking)

    def park(self, kinds: list, module: torch.nn.Module, stores: list, roots: list, *, pin_memory: bool,
             non_blocking: bool) -> None:
        """Moves the storages of ``kinds`` (those not away already) to host memory: the weights of
        ``module`` and of the parameter ``stores`` (None entries ignored), and what the parts in
        ``roots`` hold (the optimizer path and the gradient sync; see :func:`_walk`)."""
        from .collectives import Collectives
        from .zero3 import ParamFetcher
        params = list(module.parameters())
        stores = list({id(s): s for s in stores if s is not None}.values())
        skip = (ParamFetcher, Collectives)  # the gathers a forward runs use their buffers
        kinds = [k for k in kinds if k not in self.kinds]
        if not kinds:
            return
        # every stream idle: a gradient a side stream still writes is read whole, and no block is
        # freed under a kernel of another stream
        self._device_module.synchronize(self.device)
        claims = self._claims(params, stores, roots, skip)
        pin = pin_memory and self.device.type == "cuda"
        for kind in kinds:
            ptrs = []
            for ptr, st in claims.get(kind, ()):
                host = torch.empty(st.nbytes(), dtype=torch.uint8, pin_memory=pin)
                host.copy_(self._bytes(st), non_blocking=non_blocking and pin)
                self._parked[ptr] = _Parked(st, host)
                ptrs.append(ptr)
            self._by_kind[kind] = ptrs
        self._point_params(params, kinds)
        for kind in kinds:  # after the copies were queued: the allocator reuses a block in stream order
            for ptr in self._by_kind[kind]:
                self._parked[ptr].storage.resize_(0)
        if not non_blocking:
            self._device_module.synchronize(self.device)
        gc.collect()
        torch.cuda.empty_cache()  # a no-op where CUDA was never initialized

    def _point_params(self, params: list, kinds: list) -> None:
        """The parameters' data, grad and ds_tensor over a storage that leaves now: pointed at
        their host copies until reload."""
        moving = {ptr for k in kinds for ptr in self._by_kind[k]}
        for p in params:
            for attr in ("data", "grad", "ds_tensor"):
                t = getattr(p, attr, None)
                if not isinstance(t, torch.Tensor) or t.device != self.device or t.numel() == 0:
                    continue
                ptr = t.untyped_storage().data_ptr()
                if ptr not in moving:
                    continue
                host = self._parked[ptr].host
                view = torch.empty(0, dtype=t.dtype).set_(host.untyped_storage(), t.storage_offset(), t.size(),
                                                          t.stride())
                self._pointed.append((p, attr, t))
                if attr == "grad" and p.device != view.device:
                    view = None  # the weights stay: a gradient must be on their device
                setattr(p, attr, view)

    def reload(self, non_blocking: bool = False) -> None:
        """Every storage away back on the device, its bytes as they left (or as a script wrote
        them through the parameters' host copies)."""
        if not self.kinds:
            return
        for parked in self._parked.values():
            parked.storage.resize_(parked.host.numel())
            self._bytes(parked.storage).copy_(parked.host, non_blocking=non_blocking)
        for p, attr, t in sorted(self._pointed, key=lambda e: e[1] != "data"):  # the weights before their grads
            setattr(p, attr, t)
        self._device_module.synchronize(self.device)  # the host buffers are freed below: the copies first
        self._parked.clear()
        self._by_kind.clear()
        self._pointed.clear()

    def _bytes(self, storage) -> torch.Tensor:
        """The storage as one uint8 tensor over all of its bytes."""
        return torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
