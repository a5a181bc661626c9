"""Data parallelism: the gradient reducer of ZeRO stages 1-3 (over several ranks, and on one
rank for an offloaded optimizer), and the optimizer paths' pieces that go with it
(torch.distributed, through collectives.py).

The parameter store (store.py) holds the partition plan: each parameter group is cut into
units of whole parameters and every unit into one shard per rank; this rank's shards are its
local space, which the optimizer paths step. Here:

:class:`GradReducer`
    reduce-scatters each unit's gradients into this rank's shard: on the boundary
    micro-batch a hook per parameter copies its gradient into the unit's buffer;
    with stage 2 a unit's collective starts as soon as all its gradients are there
    (asynchronously with overlap_comm, else waited for before backward goes on),
    with stage 1 every unit is reduced after backward, and with stage 3 during every
    micro-batch's backward, the reduced shards accumulated in the destination. Collectives
    are issued in one fixed order (descending unit index, the order backward usually
    produces them), so every rank issues the same sequence whatever order its hooks fire in.
:class:`ShardedBuffers`
    offload.HostBuffers for a store: host buffers in the local space, the reduced
    gradients, and the way back: the store publishes the new shards (an all-gather per
    unit at stages 1-2, the shards themselves at stage 3).
:class:`ShardedDevicePath`
    torch's optimizer on the device over the local space (offload_optimizer none).

Gradient accumulation sums on the device between boundaries (no communication);
the boundary's backward reduces the sum. Gradients are summed across ranks and the
mean is taken in the step's gradient factor (1 / world size folded into the
unscale/clip multiplier), so no extra pass runs over them; the sum of squares and the
overflow flag each rank computes over its shard are all-reduced by the engine, so
every rank takes the same skip/clip decision.

Where a reduced shard lands: with the collective on the GPU (NCCL, or one rank of a CUDA
model) on a side stream, whose kernels also take each shard's norm (nearly free there, and
the step then needs no CPU pass over the gradients); with the collective on the host (Gloo)
in host memory, after the collective completes. With a CUDA model on Gloo (Windows) the
unit's gradients are copied to the host and reduced there after backward (Gloo cannot
overlap with the GPU's work here).
"""
from __future__ import annotations

import contextlib
import functools
import math

import torch

from .checkpoint_files import real
from .collectives import Collectives
from .memory import Need, Sizes, state_bytes
from .offload import HostBuffers
from .paths import OptimizerPath
from .optimizers import build_device_optimizer, norms_stats, rebuild_like, torch_grad_stats
from .trace import OFF
from .store import GradsInShards, ParamStore, PartitionedStore, flat_base, per_element

__all__ = ["GradReducer", "ShardGrads", "ShardedBuffers", "ShardedDevicePath", "NoSync", "ReplicaSync", "ShardSync"]


class GradReducer:
    """Reduce-scatters the boundary's gradients, unit by unit, into this rank's shard
    (see the module docstring). ``dests``: per group, a flat buffer of the local space
    (host or device, any float dtype) that receives the summed shard; ``dest_of``, when set,
    gives each unit's destination instead (the GPU/CPU split lands each unit on its half)."""

    trace = OFF  # the engine's tracer once set (one rank: the copies to the host are spans)

    def __init__(self, store: ParamStore, dests: list | None, *, stage: int, overlap: bool, comm: Collectives,
                 comm_dtype: torch.dtype):
        self.sm, self.dests = store, dests
        self.dest_of = None  # (group, unit) -> the tensor its summed shard goes into
        self.landed = None   # called with (group, unit) as its summed shard is sent to its destination
        self.layout = store.layout
        self.device = store.device
        self.cuda = self.device.type == "cuda"
        self.comm = comm
        self.comm_dtype = comm_dtype
        # Stage 1 reduces after backward; stage 2 during it (Gloo with a CUDA model after,
        # as the copies to the host must complete first). Stage 3 reduces during every
        # micro-batch's backward (the device keeps no gradient between micro-batches) and
        # accumulates the reduced shards in ``dests``.
        self.accumulate = stage >= 3
        # One rank below stage 3 sums nothing: each unit's gradients go straight to their
        # destination during backward (no unit buffer, no wait), as soon as the unit has them all.
        self.solo = comm.solo and not self.accumulate
        self.eager = self.accumulate or self.solo or (stage >= 2 and comm.kind != "staged")
        self.overlap = overlap
        # Where a reduced shard lands (the module docstring), decided once.
        on_device = comm.device.type == "cuda"
        self.device_norms = on_device
        self._land = self._land_on_device if on_device else self._land_on_host
        self.side = torch.cuda.Stream(device=self.device) if on_device else None
        self._armed = False
        self._order = [(gi, ui) for gi, gp in enumerate(store.plan.groups) for ui in range(len(gp.units))]
        self._order.reverse()
        self._works: list = []
        self.reset()
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad)
                       for ps in self.layout.params for p in ps]

    # -- backward ------------------------------------------------------------------------------------
    def before_backward(self, boundary: bool) -> None:
        self._boundary = boundary
        if self.accumulate:
            self._begin_pass()
            self._armed = True
        else:
            self._armed = boundary and self.eager

    def _unit_buf(self, gi: int, ui: int) -> torch.Tensor:
        key = (gi, ui)
        buf = self._unit_bufs.get(key)
        if buf is None:
            u = self.sm.plan.groups[gi].units[ui]
            buf = torch.empty(u.padded, dtype=self.comm_dtype, device=self.device)
            if u.padded > u.length:
                buf[u.length:].zero_()
            self._unit_bufs[key] = buf
        return buf

    def _take(self, gi: int, pi: int, g: torch.Tensor | None) -> None:
        """Puts parameter pi's gradient (or zeros) into its unit buffer (one rank: holds it)."""
        gp = self.sm.plan.groups[gi]
        ui = gp.unit_of[pi]
        if self.solo:
            self._held.setdefault((gi, ui), []).append((pi, g))
        else:
            off = gp.offsets[pi] - gp.units[ui].start
            dst = self._unit_buf(gi, ui)[off:off + gp.numels[pi]]
            with torch.no_grad():
                if g is None:
                    dst.zero_()
                else:
                    dst.copy_(g.reshape(-1))
        self._taken.add((gi, pi))
        self._missing[(gi, ui)] -= 1

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._armed or p.grad is None:
            return
        gi, pi = self.layout.index[id(p)]
        self._take(gi, pi, p.grad)
        p.grad = None
        if self.solo:  # no collective to order: a unit goes as soon as it is complete
            key = (gi, self.sm.plan.groups[gi].unit_of[pi])
            if self._missing[key] == 0:
                self._issue(*key)
        else:
            self._issue_ready()

    def _issue_ready(self) -> None:
        while self._next < len(self._order) and self._missing[self._order[self._next]] == 0:
            self._issue(*self._order[self._next])
            self._next += 1

    def _issue(self, gi: int, ui: int) -> None:
        # The unit's buffer is forgotten only once its collective is issued: if that raises (a
        # peer is gone), a later _flush finds the unit still pending instead of a missing buffer.
        if self.solo:
            grads = self._held.pop((gi, ui), None)
            if grads:  # (none: the unit went during backward)
                self._pass_on(gi, ui, grads)
            return
        buf = self._unit_bufs[(gi, ui)]
        self._issue_unit(gi, ui, buf)
        del self._unit_bufs[(gi, ui)]

    def _dest(self, gi: int, ui: int) -> torch.Tensor:
        if self.dest_of is not None:
            return self.dest_of(gi, ui)
        start, n = self.sm.local_range(gi, ui)
        return self.dests[gi][start:start + n]

    def _issue_unit(self, gi: int, ui: int, buf: torch.Tensor) -> None:
        dest = self._dest(gi, ui)
        if self.landed is not None:
            self.landed(gi, ui)
        n = dest.numel()
        first = True  # stage 3 adds into dest after its first micro-batch since the last step
        if self.accumulate:
            first = (gi, ui) not in self._fresh
            self._fresh.add((gi, ui))
        # Summed straight into dest where the collective can write it (host memory, same dtype).
        into = None if self.accumulate else dest
        out, work, keep = self.comm.reduce_scatter(buf, n, out=into)
        self._land(out, work, dest, first, (buf, keep))

    def _pass_on(self, gi: int, ui: int, grads) -> None:
        """One rank: the unit's gradients ``grads`` ((parameter, gradient or None)) into their
        places in its destination; on CUDA on the side stream once the training stream has
        produced them, with each gradient's norm (the step then needs no pass over them)."""
        dest = self._dest(gi, ui)
        if self.landed is not None:
            self.landed(gi, ui)
        gp = self.sm.plan.groups[gi]
        base = gp.units[ui].start
        side = self.side
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(self.device))
        on_side = contextlib.nullcontext() if side is None else torch.cuda.stream(side)
        span = contextlib.nullcontext() if side is None else self.trace.cuda_span("gradients to host", side,
                                                                                   tensors=len(grads))
        with torch.no_grad(), on_side, span:
            for pi, g in grads:
                d = dest[gp.offsets[pi] - base:gp.offsets[pi] - base + gp.numels[pi]]
                if g is None:
                    d.zero_()
                    continue
                if side is not None:
                    self._norms.append(torch.linalg.vector_norm(g, 2, dtype=torch.float32))
                    g.record_stream(side)  # the device gradient is freed once its copy is done
                d.copy_(g.reshape(-1), non_blocking=side is not None)

    def _land_on_host(self, out, work, dest, first: bool, keep) -> None:
        """The reduced shard ``out`` (host memory) into ``dest`` once the collective is done."""
        def finish(o=out, d=dest, f=first):
            if o is not d:
                d.copy_(o) if f else d.add_(o)
        if work is None:
            finish()
            return
        self._works.append((work, finish, keep))
        if not self.overlap:
            self._finish_all()

    def _land_on_device(self, out, work, dest, first: bool, keep) -> None:
        """The reduced shard ``out`` (on the GPU) into ``dest`` on the side stream, with its norm
        (stage 3: of the sum, on the boundary micro-batch)."""
        producer = torch.cuda.current_stream(self.device)  # where the unit's gradients were copied
        with torch.cuda.stream(self.side):
            if self.accumulate:
                self.side.wait_stream(producer)
            if work is not None:
                work.wait()  # the side stream waits for the collective
            if not self.accumulate:
                self._norms.append(torch.linalg.vector_norm(out, 2, dtype=torch.float32))
                dest.copy_(out, non_blocking=True)
            else:
                if dest.device.type == "cuda":
                    dest.copy_(out) if first else dest.add_(out)
                    val = dest
                elif first:
                    val = out
                else:
                    val = dest.to(self.device, non_blocking=True)
                    val.add_(out)
                if self._boundary:
                    self._norms.append(torch.linalg.vector_norm(val, 2, dtype=torch.float32))
                if val is not dest:
                    dest.copy_(val, non_blocking=True)
                    val.record_stream(self.side)
            out.record_stream(self.side)
            for t in keep:
                if torch.is_tensor(t) and t.is_cuda:
                    t.record_stream(self.side)
        if not self.overlap and not self.accumulate:
            producer.wait_stream(self.side)

    def _flush(self) -> None:
        """Every unit not issued yet is reduced now, in the fixed order (stage 3: at the end of
        each micro-batch's backward; stages 1-2: at the step). A parameter whose hook did not
        fire contributes the gradient it has (accumulated in earlier micro-batches) or zeros."""
        for gi, ui in self._order[self._next:]:
            u = self.sm.plan.groups[gi].units[ui]
            for pi in range(u.first, u.first + u.count):
                if (gi, pi) not in self._taken:
                    p = self.layout.params[gi][pi]
                    self._take(gi, pi, p.grad)
                    p.grad = None
            self._issue(gi, ui)
        self._next = len(self._order)

    def _finish_all(self) -> None:
        for work, finish, _buf in self._works:
            work.wait()
            if finish is not None:
                finish()
        self._works.clear()

    def after_backward(self) -> None:
        if self.accumulate and self._armed:
            self._flush()
            self._landed()
        self._armed = False

    def _landed(self) -> None:
        """Stage 3, at the end of each backward: every reduced shard is in its destination when
        engine.backward returns, as after DeepSpeed's (whose ZeRO-3 backward ends with a device
        synchronize). Destinations in host memory (the parameter shards with grads_in_shards:
        ``p.ds_tensor``) are read by the CPU, which must not see them before the copies that
        fill them are done; on the device, the training stream waits for the side stream."""
        self._finish_all()
        if self.side is not None:
            done = torch.cuda.Event()
            done.record(self.side)
            torch.cuda.current_stream(self.device).wait_event(done)
            done.synchronize()

    # -- the step --------------------------------------------------------------------------------------
    def gather(self) -> None:
        """Reduces what is left (every unit with stage 1) and waits. Stage 3 reduced everything
        during backward: units that got nothing since the last step read as zeros."""
        if not self.accumulate:
            self._flush()
        self._finish_all()
        if self.side is not None:
            self.side.synchronize()
        if self.accumulate:
            for gi, gp in enumerate(self.sm.plan.groups):
                for ui in range(len(gp.units)):
                    if (gi, ui) not in self._fresh:
                        if self.landed is not None:
                            self.landed(gi, ui)
                        self._dest(gi, ui).zero_()
                        self._fresh.add((gi, ui))

    def local_norms(self) -> list:
        return self._norms

    def reset(self) -> None:
        """Ready for the next boundary: every unit waits for all its gradients again. Reductions
        still in flight (a backward's, dropped by engine.zero_grad before any step read them)
        complete first, so that nothing lands in a destination afterwards."""
        for work, _finish, _keep in self._works:
            work.wait()
        if self.side is not None:
            self.side.synchronize()
        self._begin_pass()
        self._works: list = []      # Gloo: (work, copy to dest or None, input kept alive), in order
        self._norms: list = []      # CUDA: fp32 norms of the reduced shards, on the device
        self._fresh: set = set()    # stage 3: units whose dest holds this step's sum
        self._boundary = True

    def _begin_pass(self) -> None:
        self._missing = {(gi, ui): u.count for gi, gp in enumerate(self.sm.plan.groups)
                         for ui, u in enumerate(gp.units)}  # gradients a unit still waits for
        self._unit_bufs: dict = {}  # (group, unit) -> the unit's gradient buffer until issued
        self._held: dict = {}       # one rank: (group, unit) -> its (parameter, gradient) until issued
        self._next = 0              # index into _order of the next unit to issue
        self._taken: set = set()    # (group, param) whose gradient is in its unit buffer


class _ShardedSource:
    """offload.HostBuffers' gradient source over a store: the GradReducer's shards."""

    def __init__(self, reducer: GradReducer, grads: list, device_norms: bool):
        self.reducer, self.grads, self.device_norms = reducer, grads, device_norms

    @property
    def trace(self):
        return self.reducer.trace

    @trace.setter
    def trace(self, tracer) -> None:
        self.reducer.trace = tracer

    def before_backward(self, boundary: bool) -> None:
        self.reducer.before_backward(boundary)

    def after_backward(self) -> None:
        self.reducer.after_backward()

    def gather(self) -> list:
        self.reducer.gather()
        return self.grads

    def grad_stats(self, grads: list, scale: float, host_stats) -> tuple[float, bool]:
        if self.device_norms:
            return norms_stats(self.reducer.local_norms(), scale)
        return host_stats([g for row in grads for g in row], scale)

    def reset(self) -> None:
        self.reducer.reset()


class ShardGrads:
    """What host buffers over a parameter store do when its shards receive their gradients
    (``grads_in``: a store.GradsInShards, or None for a separate gradient buffer). Subclasses
    say which part of the store's local space they cover (:meth:`_shard_spans`) and which unit
    each entry of their layout lies in (``entry_units()``)."""

    grads_in: GradsInShards | None = None
    _stepping = False  # a step started since the gradients were taken (see _release_shard_grads)

    def _shard_spans(self) -> list:
        """(store group, local start, length) of each group of these buffers' layout."""
        raise NotImplementedError

    def _grad_buffers(self) -> tuple[list, list]:
        if self.grads_in is None:
            return super()._grad_buffers()
        flats = [self.sm.flat[gi][b:b + n] for gi, b, n in self._shard_spans()]
        return flats, [self.layout.views(f, i) for i, f in enumerate(flats)]

    def use_masters(self, flats: list) -> None:
        if self.grads_in is not None:
            gis, bases, _ = zip(*self._shard_spans())
            self.grads_in.use_masters(list(gis), flats, list(bases))

    def use_master_readers(self, readers: list) -> None:
        """The path's fp32 masters are not in host buffers (the NVMe swap files): ``readers[i]``
        (layout offset, n, cache) -> group i's masters there."""
        if self.grads_in is not None:
            gis, bases, sizes = zip(*self._shard_spans())
            self.grads_in.use_readers(list(gis), [lambda start, n, cache, r=r, b=b: r(start - b, n, cache)
                                                  for r, b in zip(readers, bases)], list(bases), list(sizes))

    def shard_storage(self) -> list | None:
        """Per group of the layout, the part of the store's shards it covers (one flat tensor
        each), when the shards live in host memory and are the weights (a ZeRO-3 store): a path
        may write its new weights there itself. None otherwise."""
        if not isinstance(self.sm, PartitionedStore) or self.sm.flat[0].device.type != "cpu":
            return None
        return [self.sm.flat[gi][b:b + n] for gi, b, n in self._shard_spans()]

    def step_started(self) -> None:
        self._stepping = True

    def abandoned(self) -> None:
        self._published.clear()
        if self.grads_in is not None:
            self.grads_in.restore()

    @functools.cached_property
    def _ends(self) -> list:
        """Per group, per entry: its (store group, unit) if it is that unit's last entry, else None."""
        return [[u if i + 1 == len(row) or row[i + 1] != u else None for i, u in enumerate(row)]
                for row in self.entry_units()]

    def completed_units(self, keys: list) -> list:
        """(group of this layout, (store group, unit)) of each unit whose last entry is among the
        entries ``keys``, in their order: what stepping them completes."""
        return [(i, u) for i, ei in keys if (u := self._ends[i][ei]) is not None]

    def chunk_stepped(self, keys: list) -> None:
        if self.grads_in is not None:
            self.grads_in.stepped(u for _i, u in self.completed_units(keys))

    # -- new weights, unit by unit as the step goes ---------------------------------------------------
    _pending_src = None
    _bases_of = None  # (weight views, their flat buffers) of the last publish

    def _publish(self, i: int, gi: int, ui: int, bases: list | None, group=None) -> None:
        """Unit ui of store group gi (group i of this layout) published from ``bases`` (per group of
        this layout, the path's flat weight buffer; None: the shards hold the new weights)."""
        raise NotImplementedError

    def _bases(self, src: list | None) -> list | None:
        """Per group, the flat buffer the path's weight views ``src`` are views of (None where the
        path writes the shards' own storage), found once per set of views."""
        if src is None:
            return None
        if self._bases_of is None or self._bases_of[0] is not src:
            self._bases_of = (src, flat_base(src, self._flats))
        return self._bases_of[1]

    @functools.cached_property
    def _published(self) -> set:
        """The (store group, unit)s published since the step's weights began to come out."""
        return set()

    def write_back(self, src: list, keys: list) -> None:
        """The new weights of the entries ``keys`` are in ``src``: every unit whose last entry is
        among them is published now, so that its copy (or collective) runs while the step goes on
        with its next chunks; :meth:`end_write_back` publishes the rest. (overlap_forward publishes
        unit by unit through :meth:`gather_unit` from its own thread instead.)"""
        self._pending_src = src
        bases = self._bases(src)
        for i, u in self.completed_units(keys):
            if u not in self._published:
                self._publish(i, *u, bases)
                self._published.add(u)

    def gather_unit(self, i: int, unit: tuple, src: list, group) -> None:
        """Once every piece of ``unit`` (store group, unit; group i of this layout) is stepped:
        its new shard published, with the collective on ``group`` (offload_optimizer.overlap_forward
        runs it from the step's own thread, on a process group of its own, so it never
        interleaves with the training thread's collectives)."""
        self._publish(i, *unit, self._bases(src), group)

    def end_write_back(self) -> None:
        """Every unit not published yet is published (with several ranks, every rank's new shards
        into every rank's parameters)."""
        bases = self._bases(self._pending_src)
        self._pending_src = None
        for i, row in enumerate(self._ends):
            for u in row:
                if u is not None and u not in self._published:
                    self._publish(i, *u, bases)
        self._published.clear()
        super().end_write_back()

    # refresh (HostBuffers'): after a checkpoint load replaced this rank's masters, its shards,
    # its weight buffers and then, by the store's publish, every parameter follow them.
    def refresh_begin(self) -> None:
        self.sm.check_writable()  # gradients held in the shards would be overwritten

    def refresh_entry(self, gi: int, pi: int, m: torch.Tensor, outs: list | None) -> None:
        with torch.no_grad():
            p = self.layout.params[gi][pi]
            if p.data_ptr() != m.data_ptr():
                p.copy_(m.reshape(-1).to(p.device, p.dtype))
            if outs is not None:
                o = outs[gi][pi]
                if o.data_ptr() != m.data_ptr():
                    o.copy_(m.reshape(-1))

    def refresh_end(self, src: list) -> None:
        self._pending_src = src
        self.end_write_back()
        self.wait_host_buffers()

    def _release_shard_grads(self) -> None:
        """Gradients no step read (an overflow skip) give way to the weights; a step under way (in
        the background, with overlap_forward) turns them into the new weights itself."""
        if self.grads_in is not None and self.grads_in.held and not self._stepping:
            self.grads_in.restore()
        self._stepping = False


class ShardedBuffers(ShardGrads, HostBuffers):
    """offload.HostBuffers over a parameter store (see the module docstring): host buffers in
    this rank's local space, gradients reduce-scattered into them, new weights published by
    the store. What does not depend on the store (pinning, the gradient source's calls,
    waiting for the last step's copies) is HostBuffers' own."""

    def __init__(self, store: ParamStore, *, pin_memory: bool, stage: int, overlap: bool, comm: Collectives,
                 comm_dtype: torch.dtype, grads_in_shards: bool = False):
        self.sm = store
        self._reducer_args = dict(stage=stage, overlap=overlap, comm=comm, comm_dtype=comm_dtype)
        # plan.grads_in_shards: the shards themselves receive the reduced gradients (store.GradsInShards)
        self.grads_in = GradsInShards(store) if grads_in_shards else None
        super().__init__(store.local_layout, store.device, store.dtype, pin_memory)
        if self.grads_in is not None:
            store.grads_in = self.grads_in
            self.reducer.landed = self.grads_in.land

    def _shard_spans(self) -> list:
        return [(gi, 0, f.numel()) for gi, f in enumerate(self.sm.flat)]

    def _gradient_source(self):
        self.reducer = GradReducer(self.sm, self.flat_grads, **self._reducer_args)
        return _ShardedSource(self.reducer, self.grads, device_norms=self.reducer.device_norms)

    def alloc(self, dtype: torch.dtype, zero: bool = True) -> tuple[list, list]:
        """As HostBuffers.alloc, zeroed (the padding of the local space stays zero) unless the
        caller writes every element itself (``zero`` false)."""
        flats, views = super().alloc(dtype)
        for t in flats if zero else ():
            t.zero_()
        return flats, views

    # -- gradients (the source's calls are HostBuffers') -------------------------------------------
    def _retarget(self, flat: list, views: list) -> None:
        self.reducer.dests = flat
        self._source.grads = views

    def release(self) -> None:
        self._release_shard_grads()
        self.sm.drop_grads()
        self._source.reset()

    # -- weights (published unit by unit: ShardGrads) ---------------------------------------------
    def entry_units(self) -> list:
        """Per group of this layout, per entry: the (store group, unit) it lies in."""
        return [[(gi, ui) for ui in row] for gi, row in enumerate(self.sm.entry_units())]

    def _publish(self, i: int, gi: int, ui: int, bases: list | None, group=None) -> None:
        self.sm.publish_unit(gi, ui, bases, group)

    def end_write_back(self) -> None:
        super().end_write_back()
        self.sm.mark_stale()  # ZeRO-3: materialized (persistent) parameters are gathered again

class PhasedStep:
    """A device optimizer's step over fp32 gradients ``grads``: the gradients times the step's
    factor, then ``optimizer.step()``, each once per step (``phase``: 1 scaled, 2 stepped) even
    when called again after what follows the step raised; ``reset`` when the step is over."""

    def __init__(self, grads: list):
        self.grads = grads
        self.phase = 0

    def run(self, optimizer, factor: float) -> None:
        if factor != 1.0 and self.phase == 0:
            torch._foreach_mul_(self.grads, factor)
        self.phase = max(self.phase, 1)
        if self.phase == 1:
            optimizer.step()
            self.phase = 2

    def reset(self) -> None:
        self.phase = 0


class ShardedDevicePath(OptimizerPath):
    """torch's optimizer on the device over this rank's shards (offload_optimizer.device none,
    over a store: several ranks, or ZeRO-3 on any number): one flat fp32 master per group (the local space), reduced gradients
    in fp32 beside it, updated weights into the shards and all-gathered."""

    # The gradients it keeps on the device, by stage: stage 1 the model's whole ones until the
    # step's reduction, stages 2-3 this rank's reduced part in fp32.
    _GRADS = {1: lambda s: Need("gpu", "gradients", s.esize * s.total),
              2: lambda s: Need("gpu", "gradients (this rank's part, fp32)", 4 * s.local)}
    _GRADS[3] = _GRADS[2]

    @classmethod
    def bytes_needed(cls, plan, config, s: Sizes) -> list:
        """What this path holds (memory.py): gradients, fp32 masters and state of the rank's part."""
        sd, per = state_bytes(config)
        return [cls._GRADS[plan.stage](s), Need("gpu", f"fp32 masters and optimizer state ({sd})",
                                                 int((4 + per) * s.local))]

    def __init__(self, sm: ParamStore, name: str | None, params: dict, client, *, stage: int,
                 overlap: bool, comm: Collectives, comm_dtype: torch.dtype):
        super().__init__(sm.local_layout)
        self.sm = sm
        dev = sm.device
        with torch.no_grad():
            self._flat = [torch.cat([sm.shard(gi, ui) for ui in range(len(gp.units))]).to(dev, torch.float32)
                          for gi, gp in enumerate(sm.plan.groups)]
        self._gflat = [torch.zeros_like(f) for f in self._flat]
        for f, g in zip(self._flat, self._gflat):
            f.grad = g
        self._views = [self.layout.views(f, gi) for gi, f in enumerate(self._flat)]
        flat_groups = [[f] for f in self._flat]
        if client is not None:
            self.optimizer = rebuild_like(client, flat_groups)
        else:
            self.optimizer = build_device_optimizer(name, params, sm.layout.with_params(flat_groups), dev)
        self.reducer = GradReducer(sm, self._gflat, stage=stage, overlap=overlap, comm=comm, comm_dtype=comm_dtype)
        self._steps = PhasedStep(self._gflat)

    def before_backward(self, boundary: bool) -> None:
        self.reducer.before_backward(boundary)

    def after_backward(self) -> None:
        self.reducer.after_backward()

    def gather(self) -> None:
        self.reducer.gather()

    def grad_stats(self, scale: float) -> tuple[float, bool]:
        return torch_grad_stats(self._gflat, scale)

    def grad_rows(self, create: tuple | None = None) -> list:
        return [self.layout.views(g, gi) for gi, g in enumerate(self._gflat)]

    def apply(self, factor: float) -> None:
        # Called again after it raised: each phase that ran is not repeated (the all-gather is).
        self._steps.run(self.optimizer, factor)
        self._to_model()
        self._steps.reset()

    def abandon_step(self) -> None:
        self._steps.reset()

    def _to_model(self) -> None:
        with torch.no_grad():
            for gi, gp in enumerate(self.sm.plan.groups):
                for ui in range(len(gp.units)):
                    start, n = self.sm.local_range(gi, ui)
                    self.sm.shard(gi, ui).copy_(self._flat[gi][start:start + n])
        self.sm.publish()

    def release(self) -> None:
        self._steps.reset()
        self.reducer.reset()
        self.zero_grad()

    def zero_grad(self) -> None:
        self.sm.drop_grads()

    @property
    def sharded(self) -> ParamStore:
        return self.sm

    def param_states(self, saved: bool = False) -> list:
        """The flat state of each group cut into the local space's entries (views; a value
        that is not per element, the step, is shared by every entry)."""
        state = self.saved_state() if saved else self.optimizer.state_dict()["state"]
        out = []
        for gi, entries in enumerate(self.sm.pieces):
            st, total = state.get(gi), self._flat[gi].numel()
            out.append([None if st is None else
                        {k: (v[at:at + n] if torch.is_tensor(v) and v.dim() == 1 and v.numel() == total else v)
                         for k, v in st.items()} for _pc, at, n in entries])
        return out

    def state_dict_from(self, rows: list, groups: list) -> dict:
        """Joins per-entry states back into one flat state per group: per-element tensors
        are placed at their entries' local offsets, other values (the step) must agree."""
        if [len(r) for r in rows] != [len(e) for e in self.sm.pieces]:
            raise ValueError("the optimizer state does not have one entry per piece of this rank")
        state = {}
        for gi, (entries, row) in enumerate(zip(self.sm.pieces, rows)):
            if all(st is None for st in row):
                continue
            if any(st is None for st in row) or any(st.keys() != row[0].keys() for st in row):
                raise ValueError(f"the optimizer state covers only some parameters of group {gi} (or not with "
                                 f"the same keys); this rank's optimizer steps the group as one tensor")
            total, joined = self._flat[gi].numel(), {}
            for k, v0 in row[0].items():
                elementwise = [per_element(k, st[k], n) for (_pc, _at, n), st in zip(entries, row)]
                if any(elementwise) and not all(elementwise):
                    i = elementwise.index(False)
                    v, n = row[i][k], entries[i][2]
                    raise ValueError(f"state '{k}' holds one value per element in some pieces of group {gi} but a "
                                     f"piece of {n} elements has {v.numel() if torch.is_tensor(v) else 1}")
                if all(elementwise):
                    flat = torch.zeros(total, dtype=v0.dtype)
                    for (_pc, at, n), st in zip(entries, row):
                        flat[at:at + n] = real(st[k]).reshape(-1)
                    joined[k] = flat
                else:
                    for st in row[1:]:
                        v = st[k]
                        same = torch.equal(v, v0) if torch.is_tensor(v) and torch.is_tensor(v0) else v == v0
                        if not same:
                            raise ValueError(f"the pieces of group {gi} have different '{k}' values; this rank's "
                                             f"optimizer keeps one per group")
                    joined[k] = v0.clone() if torch.is_tensor(v0) else v0
            state[gi] = joined
        return {"state": state, "param_groups": groups}

    def masters(self) -> list:
        return self._views

    def load_masters(self, masters: list) -> None:
        with torch.no_grad():
            for vs, srcs in zip(self._views, masters):
                for v, s in zip(vs, srcs):
                    v.copy_(real(s).reshape(-1).to(v.device, torch.float32))
        self._to_model()


# -- what the ranks agree on before a step -------------------------------------------------------
class NoSync:
    """One rank: its gradients and their statistics are the whole job's."""

    def grads(self) -> None:
        pass

    def stats(self, sumsq: float, nonfinite: bool) -> tuple[float, bool]:
        return sumsq, nonfinite


class ShardSync(NoSync):
    """A rank steps its part of the parameters (stages 1-3): every rank's (sum of squares, any
    inf/NaN) are added up, so all take the same skip and clip decision."""

    def __init__(self, comm: Collectives):
        self.comm = comm

    def stats(self, sumsq: float, nonfinite: bool) -> tuple[float, bool]:
        t = torch.tensor([sumsq if math.isfinite(sumsq) else 0.0, 1.0 if nonfinite or not math.isfinite(sumsq)
                          else 0.0], dtype=torch.float64, device=self.comm.device)
        self.comm.all_reduce(t)
        total, bad = float(t[0]), float(t[1]) > 0
        return (float("inf") if bad else total), bad


class ReplicaSync(NoSync):
    """ZeRO stage 0 on several ranks (plain data parallelism): every gradient is summed over the
    ranks in place before the step, in flat buckets of one dtype (a missing gradient counts as
    zeros); the statistics are then every rank's alike."""

    def __init__(self, params: list, comm: Collectives, bucket_elems: int):
        self.params, self.comm, self.cap = params, comm, max(1, bucket_elems)

    def grads(self) -> None:
        by_dtype: dict = {}
        for p in (p for ps in self.params for p in ps):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_dtype.setdefault(p.grad.dtype, []).append(p)
        for dtype in sorted(by_dtype, key=str):
            params = by_dtype[dtype]
            i = 0
            while i < len(params):
                bucket, n = [], 0
                while i < len(params) and (not bucket or n + params[i].numel() <= self.cap):
                    bucket.append(params[i])
                    n += params[i].numel()
                    i += 1
                flat = torch.cat([p.grad.reshape(-1) for p in bucket]).to(self.comm.device)
                self.comm.all_reduce(flat)
                at = 0
                for p in bucket:
                    p.grad.copy_(flat[at:at + p.numel()].view_as(p.grad))
                    at += p.numel()
