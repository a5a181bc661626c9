"""Host memory of the offloaded optimizer paths and the copies between it and the model.

:class:`HostBuffers` is what the cpu and nvme paths (cpu.py, nvme.py) see of host memory,
over a parameter store's local space (dp.ShardedBuffers for the whole of it,
split_store.HostShare for a split's host share). It owns:
  - flat host buffers, one tensor per parameter group with a view per entry (layout.py),
    allocated for the gradients here and for whatever else a path keeps in host memory
    (masters, updated weights) through :meth:`alloc`;
  - the gradients' way from the model to the host (a gradient source the subclass makes:
    the gradient reducer of dp.py, which lands each unit's gradients in these buffers during
    backward, with their norms taken on the device);
  - the updated weights' way back into the model (the subclass's :meth:`write_back`: the
    store publishes them).

On CUDA the buffers are page-locked (hostmem.py says how, and what happens when the
driver refuses).
"""
from __future__ import annotations

import abc
import logging
import weakref

import torch

from .hostmem import alloc_host, unpin
from .layout import FlatLayout
from .paths import OptimizerPath
from .trace import OFF

log = logging.getLogger("zspeed.offload")

__all__ = ["HostBuffers", "OffloadedPath"]

class HostBuffers:
    """Host buffers, gradients and weight copies of one engine's offloaded path (subclasses say
    where the gradients come from, :meth:`_gradient_source`, and how new weights reach the
    model, :meth:`write_back`)."""

    prefilled = False  # whether alloc() hands out buffers that hold a path's values already

    def __init__(self, layout: FlatLayout, device: torch.device, model_dtype: torch.dtype, pin_memory: bool):
        self.layout = layout
        self.device = device
        self.cuda = device.type == "cuda"
        self.model_dtype = model_dtype
        self._pin = self.cuda and pin_memory
        self._pinned_ptrs: list[int] = []
        self._pinned_any = False
        weakref.finalize(self, unpin, self._pinned_ptrs)
        self._flats: list = []  # every flat buffer alloc() made
        # One flat gradient buffer per group, and per group its per-entry views.
        self.flat_grads, self.grads = self._grad_buffers()
        self._source = self._gradient_source()
        self._h2d_done = None

    def _grad_buffers(self) -> tuple[list, list]:
        """(flat gradient buffer per group, per-parameter views): allocated here."""
        return self.alloc(self.model_dtype)

    # What a path tells buffers that can hold the gradients in the weights' place (dp.py's
    # ShardedBuffers at ZeRO-3); nothing to do for separate gradient buffers.
    def use_masters(self, flats: list) -> None:
        """The path's fp32 masters (a flat tensor per group of this layout)."""

    def use_master_readers(self, readers: list) -> None:
        """The path's fp32 masters, kept elsewhere: ``readers[i](offset, n, cache)`` reads group i's."""

    def shard_storage(self) -> list | None:
        """Per group, a flat host tensor that is the weights' own storage, which a path may write
        its new weights into (the parameter shards of a ZeRO-3 store); None: none is."""
        return None

    def step_started(self) -> None:
        """The optimizer step has started (it may run on after release(), in the background)."""

    def abandoned(self) -> None:
        """A step that stopped partway is abandoned (what it did not step stays as it was)."""

    def chunk_stepped(self, keys: list) -> None:
        """The step has written the new weights of the parameters ``keys`` ((group, parameter))."""

    def _gradient_source(self):
        """Where the gradients come from: an object with before_backward(boundary),
        after_backward(), gather() -> the gradient rows, grad_stats(grads, scale, host_stats),
        reset() and a ``trace``."""
        raise NotImplementedError

    @property
    def trace(self):
        return getattr(self._source, "trace", OFF)

    @trace.setter
    def trace(self, tracer) -> None:
        self._source.trace = tracer

    @property
    def pinned(self) -> bool:
        """Whether the host buffers are page-locked (asynchronous copies)."""
        return self._pin and self._pinned_any

    # -- memory ----------------------------------------------------------------------------
    def alloc(self, dtype: torch.dtype, zero: bool = True) -> tuple[list, list]:
        """(one flat buffer per group, per group the per-parameter views), page-locked on CUDA
        with pin_memory. Their contents are undefined here (``zero`` matters to buffers over a
        store's local space, whose padding must stay zero: false when the caller writes every
        element itself)."""
        flats = [self._alloc_one(total, dtype) for total in self.layout.totals]
        self._flats.extend(flats)
        return flats, [self.layout.views(f, gi) for gi, f in enumerate(flats)]

    def _alloc_one(self, numel: int, dtype) -> torch.Tensor:
        t, pinned = alloc_host(numel, dtype, self._pin, self._pinned_ptrs)
        self._pinned_any = self._pinned_any or pinned
        return t

    # -- gradients: model -> host ---------------------------------------------------------
    def swap_grads(self) -> None:
        """Delayed update (cpu.py): the step in flight keeps reading the gradient buffers just
        gathered, so the next backward writes into a second set (allocated on first use)."""
        spare = getattr(self, "_spare_grads", None)
        if spare is None:
            spare = self.alloc(self.model_dtype)
        self._spare_grads = (self.flat_grads, self.grads)
        self.flat_grads, self.grads = spare
        self._retarget(self.flat_grads, self.grads)

    def _retarget(self, flat: list, views: list) -> None:
        self._source.dests = views

    def before_backward(self, boundary: bool) -> None:
        """Gradients are taken only from the backward of the boundary micro-batch."""
        self._source.before_backward(boundary)

    def after_backward(self) -> None:
        self._source.after_backward()

    def gather(self) -> list:
        """Host gradients of the boundary, per group, per parameter (flat, the model's dtype);
        a parameter without a gradient gets zeros."""
        return self._source.gather()

    def grad_stats(self, grads: list, scale: float, host_stats) -> tuple[float, bool]:
        """(sum of squares of scale*g, any inf/NaN) over the gathered gradients: on CUDA from
        the norms taken on the device, else ``host_stats(tensors, scale)`` over the host
        gradients (the path's CPU kernel)."""
        return self._source.grad_stats(grads, scale, host_stats)

    def release(self) -> None:
        """The step is over (applied or skipped): drop every gradient."""
        for ps in self.layout.params:
            for p in ps:
                p.grad = None
        self._source.reset()

    # -- weights: host -> model ----------------------------------------------------------------
    def wait_host_buffers(self) -> None:
        """The previous step's H2D copies still read the weight buffers: finish them before
        the optimizer overwrites them."""
        if self._h2d_done is not None:
            self._h2d_done.synchronize()
            self._h2d_done = None

    def write_back(self, src: list, keys: list) -> None:
        """The updated weights ``src[gi][pi]`` of the entries ``keys`` are ready for the model
        (the store publishes them, asynchronously on CUDA)."""
        raise NotImplementedError

    def set_h2d_done(self, event) -> None:
        """The event after the last copy into the model (copies made on another stream)."""
        self._h2d_done = event

    def end_write_back(self) -> None:
        """The next step must not overwrite the host buffers before these copies are done."""
        if self.cuda:
            self._h2d_done = torch.cuda.Event()
            self._h2d_done.record(torch.cuda.current_stream(self.device))

    def refresh(self, masters: list, outs: list | None) -> None:
        """After a checkpoint load replaced the fp32 masters: the model's weights and the path's
        weight buffers ``outs`` (or None) follow them."""
        self.refresh_begin()
        for gi, ms in enumerate(masters):
            for pi, m in enumerate(ms):
                self.refresh_entry(gi, pi, m, outs)
        self.refresh_end(outs if outs is not None else masters)

    def refresh_begin(self) -> None:
        """Before :meth:`refresh_entry` calls (a refresh entry by entry)."""

    def refresh_end(self, src: list) -> None:
        """After the :meth:`refresh_entry` calls; ``src``: the rows now holding the new weights."""

    def refresh_entry(self, gi: int, pi: int, m: torch.Tensor, outs: list | None) -> None:
        """:meth:`refresh` of one parameter of the layout from its fp32 master ``m``."""
        with torch.no_grad():
            p = self.layout.params[gi][pi]
            if p.data.data_ptr() != m.data_ptr():
                p.data.copy_(m.view(p.shape).to(p.device, p.dtype))
            if outs is not None:
                o = outs[gi][pi]
                if o.data_ptr() != m.data_ptr():
                    o.copy_(m.view(o.shape))


class OffloadedPath(OptimizerPath):
    """What the cpu and nvme paths share: their gradients and weights go through HostBuffers,
    and the gradient statistics come from the device (CUDA) or from ``_host_grad_stats``."""

    def __init__(self, layout: FlatLayout, buffers: HostBuffers):
        super().__init__(layout)
        self.buffers = buffers
        self._grads: list | None = None
        self._edited = False  # the tensor-fragment API wrote into the gathered gradients

    @property
    def pinned(self) -> bool:
        return self.buffers.pinned

    def before_backward(self, boundary: bool) -> None:
        self.buffers.before_backward(boundary)

    def after_backward(self) -> None:
        self.buffers.after_backward()

    def gather(self) -> None:
        self._grads = self.buffers.gather()

    def grad_stats(self, scale: float) -> tuple[float, bool]:
        if self._edited:  # (norms taken on the device while copying are of the old values)
            return self.host_grad_stats(scale)
        return self.buffers.grad_stats(self._grads, scale, self._host_grad_stats)

    def host_grad_stats(self, scale: float) -> tuple[float, bool]:
        """grad_stats computed on the host from the gathered gradients themselves."""
        return self._host_grad_stats([g for row in self._grads for g in row], scale)

    def grad_rows(self, create: tuple | None = None) -> list:
        return self._grads  # (every entry has one: zeros where backward left none)

    def grads_edited(self) -> None:
        self._edited = True

    @abc.abstractmethod
    def _host_grad_stats(self, tensors: list, scale: float) -> tuple[float, bool]:
        """(sum of squares of scale*g, any non-finite value) over host gradient tensors."""

    def release(self) -> None:
        self._grads = None
        self._edited = False
        self.buffers.release()
