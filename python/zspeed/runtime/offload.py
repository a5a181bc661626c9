"""Host memory of the offloaded optimizer paths and the copies between it and the model.

:class:`HostBuffers` is the one component the cpu and nvme paths (cpu.py,
nvme.py) share. It owns:
  - flat host buffers, one tensor per parameter group with a view per parameter
    (layout.py), allocated for the gradients here and for whatever else a path
    keeps in host memory (masters, updated weights) through :meth:`alloc`;
  - the gradients' way from the model to the host (:meth:`gather`);
  - the updated weights' way back into the model (:meth:`write_back`).

On CUDA the buffers are page-locked (hostmem.py says how, and what happens when the
driver refuses).

Timeline of one optimizer step on CUDA:
  backward of the boundary micro-batch: a post-accumulate-grad hook per parameter
    queues its (device-accumulated) gradient into a bucket; a full bucket is copied
    to the host gradient buffer on a side stream after an event on the compute
    stream, so the copies overlap the rest of backward; the device gradient is
    released as soon as its copy completes (record_stream). The fp32 norm of each
    gradient is taken on the side stream too, while it is still on the device
    (nearly free there), so the step needs no CPU pass over the gradients for the
    global norm.
  step: wait for the side stream; the path's optimizer runs over the host
    gradients and writes the new weights into a host buffer; non-blocking H2D
    copies put them into the model on the compute stream (the next forward is
    ordered after them); an event guards the host buffers until then.
Gradient accumulation accumulates on the device (hooks stay idle until the
boundary). On a CPU-only machine nothing is copied that need not be: the
gradients are read where autograd left them (or copied into the flat buffer when
the path needs one contiguous buffer per group, ``flat_grads=True``), and a
weight buffer that is the parameter's own storage is not copied back.
"""
from __future__ import annotations

import abc
import logging
import weakref

import torch

from .hostmem import alloc_host, unpin
from .layout import FlatLayout
from .optimizers import norms_stats
from .paths import OptimizerPath
from .trace import OFF

log = logging.getLogger("zspeed.offload")

__all__ = ["HostBuffers", "OffloadedPath"]

class HostBuffers:
    """Host buffers, gradient copies and weight copies of one engine's offloaded path.

    ``flat_grads``: on the CPU, gather the gradients into one flat buffer per group
    (always so on CUDA, where they arrive by copy anyway)."""

    prefilled = False  # whether alloc() hands out buffers that hold a path's values already

    def __init__(self, layout: FlatLayout, device: torch.device, model_dtype: torch.dtype,
                 pin_memory: bool, bucket_elems: int, flat_grads: bool):
        self.layout = layout
        self.device = device
        self.cuda = device.type == "cuda"
        self.model_dtype = model_dtype
        self._pin = self.cuda and pin_memory
        self._pinned_ptrs: list[int] = []
        self._pinned_any = False
        weakref.finalize(self, unpin, self._pinned_ptrs)
        self._flats: list = []  # every flat buffer alloc() made
        # Per group, per parameter views of one flat gradient buffer per group (or None:
        # the CPU path reads the gradients where autograd left them).
        self.flat_grads: list | None = None
        self.grads: list | None = None
        if self.cuda or flat_grads:
            self.flat_grads, self.grads = self._grad_buffers()
        self._source = self._gradient_source(bucket_elems)
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

    def _gradient_source(self, bucket_elems: int):
        """Where the gradients come from: copies made during backward (CUDA), or the
        parameters' .grad read at the step (CPU)."""
        return (_CudaGradCopies(self.layout, self.grads, self.device, bucket_elems) if self.cuda
                else _CpuGrads(self.layout, self.grads))

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
        """Copies the updated weights ``src[gi][pi]`` of the parameters ``keys`` into the model
        (asynchronous on CUDA); a buffer that is the parameter's own storage needs no copy."""
        with torch.no_grad():
            for gi, pi in keys:
                p, s = self.layout.params[gi][pi], src[gi][pi]
                if s.data_ptr() != p.data_ptr():
                    p.data.copy_(s.view(p.shape), non_blocking=self.cuda)

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


class _CpuGrads:
    """The gradients where autograd left them, or copied into the flat buffers when the
    path reads one contiguous buffer per group (``dests``)."""

    def __init__(self, layout: FlatLayout, dests: list | None):
        self.layout = layout
        self.dests = dests
        self._zeros: dict = {}

    def before_backward(self, boundary: bool) -> None:
        pass

    def after_backward(self) -> None:
        pass

    def gather(self) -> list:
        out = []
        with torch.no_grad():
            for gi, ps in enumerate(self.layout.params):
                row = []
                for pi, p in enumerate(ps):
                    g = p.grad
                    if self.dests is not None:
                        h = self.dests[gi][pi]
                        if g is None:
                            h.zero_()
                        else:
                            h.copy_(g.reshape(-1))
                    elif g is None:
                        h = self._zero(gi, pi, p)
                    else:
                        h = g.detach().contiguous().view(-1)
                    row.append(h)
                out.append(row)
        return out

    def _zero(self, gi, pi, p):
        z = self._zeros.get((gi, pi))
        if z is None:
            z = self._zeros[(gi, pi)] = torch.zeros(p.numel(), dtype=p.dtype)
        return z

    def grad_stats(self, grads: list, scale: float, host_stats) -> tuple[float, bool]:
        return host_stats([g for row in grads for g in row], scale)

    def reset(self) -> None:
        pass


class _CudaGradCopies:
    """CUDA: copies each boundary gradient into its host view while backward runs."""

    def __init__(self, layout: FlatLayout, dests: list, device: torch.device, bucket_elems: int):
        self.layout = layout
        self.dests = dests
        self.device = device
        self.bucket_elems = max(1, int(bucket_elems))
        self.side = torch.cuda.Stream(device=device)
        self._armed = False
        self._copied: set = set()
        self._pending: list = []
        self._pending_elems = 0
        self._norms: list = []  # fp32 norm of each copied gradient, on the device
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad)
                       for ps in layout.params for p in ps]
        self.trace = OFF

    def before_backward(self, boundary: bool) -> None:
        self._armed = boundary

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._armed or p.grad is None:
            return
        key = self.layout.index[id(p)]
        self._pending.append((key, p.grad))
        self._pending_elems += p.grad.numel()
        self._copied.add(key)
        p.grad = None  # the pending list keeps it alive until its copy is queued
        if self._pending_elems >= self.bucket_elems:
            self._issue(torch.cuda.current_stream(self.device))

    def _issue(self, producer: torch.cuda.Stream) -> None:
        if not self._pending:
            return
        ready = torch.cuda.Event()
        ready.record(producer)
        self.side.wait_event(ready)
        with torch.cuda.stream(self.side), self.trace.cuda_span("gradients to host", self.side,
                                                                 tensors=len(self._pending)):
            for (gi, pi), g in self._pending:
                self._norms.append(torch.linalg.vector_norm(g, 2, dtype=torch.float32))
                self.dests[gi][pi].copy_(g.reshape(-1), non_blocking=True)
                g.record_stream(self.side)  # free the device copy only after the D2H is done
        self._pending.clear()
        self._pending_elems = 0

    def after_backward(self) -> None:
        """Queues the last partial bucket."""
        if self._pending:
            self._issue(torch.cuda.current_stream(self.device))
        self._armed = False

    def gather(self) -> list:
        cur = torch.cuda.current_stream(self.device)
        for gi, pi in self.layout.keys:
            if (gi, pi) in self._copied:
                continue
            p = self.layout.params[gi][pi]
            if p.grad is not None:  # accumulated earlier, no gradient in the boundary micro-batch
                self._pending.append(((gi, pi), p.grad))
                p.grad = None
            else:
                self.dests[gi][pi].zero_()
            self._copied.add((gi, pi))
        self._issue(cur)
        self.side.synchronize()
        # _copied is cleared by reset(): a step that raised (an NVMe I/O error) and is called
        # again gathers the same host gradients instead of zeros.
        return self.dests

    def grad_stats(self, grads: list, scale: float, host_stats) -> tuple[float, bool]:
        """From the norms taken on the device: per-tensor fp32 norms summed in float64, as
        torch_grad_stats does. Kept until reset(): a step that fails (an NVMe I/O error) and
        is called again sees the same."""
        return norms_stats(self._norms, scale)

    def reset(self) -> None:
        self._pending.clear()
        self._pending_elems = 0
        self._copied.clear()
        self._norms = []
