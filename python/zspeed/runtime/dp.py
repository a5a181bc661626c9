"""Data parallelism: ZeRO stages 1 and 2 over several ranks (torch.distributed).

Every rank holds the whole model (on its GPU, or the CPU) and trains it on its own
micro-batches. The partition plan (partition.py) cuts each parameter group into
units of whole parameters and every unit into one shard per rank. Three pieces
build on it:

:class:`ShardedModel`
    flattens the parameters of each unit into one buffer on the model's device
    (each parameter becomes a view of it, so an all-gather into the buffer updates
    the model in place), and describes this rank's *local space*: its shards of
    the group's units, laid out as a :class:`~zspeed.runtime.layout.FlatLayout`
    whose "parameters" are the pieces of real parameters it owns plus the padding
    at the end of a shard. The optimizer paths (cpu.py, nvme.py and
    :class:`ShardedDevicePath` below) work on that layout exactly as they work on
    the whole model in one process: pieces are stepped like parameters (padding
    stays zero: zero gradient, zero weight, zero state).
:class:`GradReducer`
    reduce-scatters each unit's gradients into this rank's shard: on the boundary
    micro-batch a hook per parameter copies its gradient into the unit's buffer;
    with stage 2 a unit's collective starts as soon as all its gradients are there
    (asynchronously with overlap_comm, else waited for before backward goes on),
    with stage 1 every unit is reduced after backward. Collectives are issued in one
    fixed order (descending unit index, the order backward usually produces them), so
    every rank issues the same sequence whatever order its hooks fire in.
:class:`ShardedBuffers`
    the interface of offload.HostBuffers for the offloaded paths: host buffers in the
    local space, the reduced gradients, and the way back: the updated shard goes into
    the unit buffer and one all-gather per unit gives every rank every weight.

Gradient accumulation sums on the device between boundaries (no communication);
the boundary's backward reduces the sum. Gradients are summed across ranks and the
mean is taken in the step's gradient factor (1 / world size folded into the
unscale/clip multiplier), so no extra pass runs over them; the sum of squares and the
overflow flag each rank computes over its shard are all-reduced by the engine, so
every rank takes the same skip/clip decision.

Communication device: NCCL reduces on the GPU, and only the shard crosses to the host
(offload); Gloo reduces host tensors, so with a CUDA model (Windows) the unit's
gradients are copied to the host first and reduced there, after backward (Gloo cannot
overlap with the GPU's work here). On a CPU-only run everything is host memory.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as td

from .layout import FlatLayout
from .offload import HostBuffers, _unpin, alloc_host
from .partition import PartitionPlan
from .paths import OptimizerPath
from .optimizers import build_device_optimizer, norms_stats, rebuild_like, torch_grad_stats


__all__ = ["ShardedModel", "GradReducer", "ShardedBuffers", "ShardedDevicePath"]


class ShardedModel:
    """The model's parameters flattened per unit on its device, and this rank's local space."""

    def __init__(self, layout: FlatLayout, plan: PartitionPlan, device: torch.device, dtype: torch.dtype,
                 group=None):
        self.layout, self.plan, self.device, self.dtype = layout, plan, device, dtype
        self.group = group
        self.rank, self.world_size = plan.rank, plan.world_size
        # Per group, per unit: one flat buffer holding the unit's parameters.
        self.bufs: list[list[torch.Tensor]] = []
        with torch.no_grad():
            for gi, gp in enumerate(plan.groups):
                row = []
                for u in gp.units:
                    buf = torch.zeros(u.padded, dtype=dtype, device=device)
                    at = 0
                    for pi in range(u.first, u.first + u.count):
                        p = layout.params[gi][pi]
                        n = p.numel()
                        view = buf[at:at + n]
                        view.copy_(p.detach().reshape(-1))
                        p.data = view.view(p.shape)
                        at += n
                    row.append(buf)
                self.bufs.append(row)
        self._build_local()

    def _build_local(self) -> None:
        """The local space: per group, the pieces (plus padding) in local order, as views of
        this rank's shards (:meth:`shard`)."""
        layout, plan = self.layout, self.plan
        self.pieces: list[list] = []      # per group: (Piece or None for padding, local start, length)
        local_params: list[list[torch.Tensor]] = []
        for gi, gp in enumerate(plan.groups):
            entries, tensors = [], []
            by_unit: dict = {}
            for pc in plan.pieces(gi):
                by_unit.setdefault(pc.unit, []).append(pc)
            for ui, u in enumerate(gp.units):
                shard0 = gp.local_start[ui]
                at = shard0
                for pc in by_unit.get(ui, ()):
                    entries.append((pc, pc.at, pc.length))
                    tensors.append(self.shard(gi, ui)[pc.at - shard0:pc.at - shard0 + pc.length])
                    at = pc.at + pc.length
                if at < shard0 + u.shard:  # padding (or a shard holding nothing real)
                    entries.append((None, at, shard0 + u.shard - at))
                    tensors.append(self.shard(gi, ui)[at - shard0:])
            self.pieces.append(entries)
            local_params.append(tensors)
        self.local_layout = FlatLayout(layout.with_params(local_params))

    def cut(self, full) -> list:
        """Per group, per entry of the local space (ShardedModel.pieces), the piece of
        ``full(gi, pi)`` (parameter pi of group gi, flattened) as fp32, or zeros for padding."""
        rows = []
        for gi, entries in enumerate(self.pieces):
            rows.append([torch.zeros(n, dtype=torch.float32) if pc is None else
                         full(gi, pc.param).reshape(-1)[pc.offset:pc.offset + n].to("cpu", torch.float32)
                         for pc, _at, n in entries])
        return rows

    def shard(self, gi: int, ui: int) -> torch.Tensor:
        """This rank's shard of unit ui of group gi (a view of the unit's buffer)."""
        u = self.plan.groups[gi].units[ui]
        return self.bufs[gi][ui].narrow(0, self.rank * u.shard, u.shard)

    def local_range(self, gi: int, ui: int) -> tuple[int, int]:
        """(start, length) of unit ui's shard in the local space of group gi."""
        gp = self.plan.groups[gi]
        return gp.local_start[ui], gp.units[ui].shard

    def all_gather(self, comm_cpu: bool, host_out: list | None = None) -> None:
        """Every rank's updated shards into every unit buffer (so into the parameters).

        comm_cpu with a CUDA model (Gloo): the shards are gathered from ``host_out`` (per
        group, the flat local-space host buffer holding the new weights) on the host and
        the whole unit is then copied to the device."""
        for gi, row in enumerate(self.bufs):
            for ui in range(len(row)):
                self.all_gather_unit(gi, ui, comm_cpu, host_out)

    def all_gather_unit(self, gi: int, ui: int, comm_cpu: bool, host_out: list | None = None,
                        group=None) -> None:
        """:meth:`all_gather` for unit ui of group gi alone, on ``group`` (default: the model's)."""
        group = self.group if group is None else group
        buf, (start, n) = self.bufs[gi][ui], self.local_range(gi, ui)
        with torch.no_grad():
            if comm_cpu and self.device.type == "cuda":
                full = torch.empty(buf.numel(), dtype=buf.dtype)
                td.all_gather_into_tensor(full, host_out[gi][start:start + n].contiguous(), group=group)
                buf.copy_(full, non_blocking=False)
            elif self.device.type == "cuda":
                td.all_gather_into_tensor(buf, self.shard(gi, ui), group=group)
            else:  # Gloo on host tensors: the input must not alias the output
                td.all_gather_into_tensor(buf, self.shard(gi, ui).clone(), group=group)

    def entry_units(self) -> list:
        """Per group, for each entry of the local space (:attr:`pieces`), the unit it lies in."""
        out = []
        for gi, entries in enumerate(self.pieces):
            gp, row, ui = self.plan.groups[gi], [], 0
            for _pc, at, _n in entries:  # in local order
                while ui + 1 < len(gp.units) and gp.local_start[ui + 1] <= at:
                    ui += 1
                row.append(ui)
            out.append(row)
        return out


class GradReducer:
    """Reduce-scatters the boundary's gradients, unit by unit, into this rank's shard
    (see the module docstring). ``dests``: per group, a flat buffer of the local space
    (host or device, any float dtype) that receives the summed shard."""

    def __init__(self, sharded: ShardedModel, dests: list, *, stage: int, overlap: bool, comm_cpu: bool,
                 comm_dtype: torch.dtype):
        self.sm, self.dests = sharded, dests
        self.layout = sharded.layout
        self.device = sharded.device
        self.cuda = self.device.type == "cuda"
        self.comm_cpu = comm_cpu
        self.comm_dtype = comm_dtype
        # Stage 1 reduces after backward; stage 2 during it (Gloo with a CUDA model after,
        # as the copies to the host must complete first). Stage 3 reduces during every
        # micro-batch's backward (the device keeps no gradient between micro-batches) and
        # accumulates the reduced shards in ``dests``.
        self.accumulate = stage >= 3
        if sharded.world_size == 1:
            comm_cpu = self.comm_cpu = False  # nothing to communicate
        self.eager = self.accumulate or (stage >= 2 and not (comm_cpu and self.cuda))
        self.overlap = overlap
        self.side = torch.cuda.Stream(device=self.device) if self.cuda else None
        self._armed = False
        self._order = [(gi, ui) for gi, gp in enumerate(sharded.plan.groups) for ui in range(len(gp.units))]
        self._order.reverse()
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
        """Puts parameter pi's gradient (or zeros) into its unit buffer."""
        gp = self.sm.plan.groups[gi]
        ui = gp.unit_of[pi]
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
        self._issue_ready()

    def _issue_ready(self) -> None:
        while self._next < len(self._order) and self._missing[self._order[self._next]] == 0:
            self._issue(*self._order[self._next])
            self._next += 1

    def _issue(self, gi: int, ui: int) -> None:
        # The unit's buffer is forgotten only once its collective is issued: if that raises (a
        # peer is gone), a later _flush finds the unit still pending instead of a missing buffer.
        buf = self._unit_bufs[(gi, ui)]
        self._issue_unit(gi, ui, buf)
        del self._unit_bufs[(gi, ui)]

    def _issue_unit(self, gi: int, ui: int, buf: torch.Tensor) -> None:
        start, n = self.sm.local_range(gi, ui)
        dest = self.dests[gi][start:start + n]
        group = self.sm.group
        if self.accumulate:
            self._issue_accumulate(gi, ui, buf, dest, n)
            return
        if self.comm_cpu and self.cuda:
            host = torch.empty(buf.numel(), dtype=buf.dtype, pin_memory=False)
            host.copy_(buf)
            out = torch.empty(n, dtype=buf.dtype)
            td.reduce_scatter_tensor(out, host, group=group)
            dest.copy_(out)
            return
        if not self.cuda:  # host tensors (Gloo)
            same = dest.dtype == buf.dtype and dest.is_contiguous()
            out = dest if same else torch.empty(n, dtype=buf.dtype)
            work = td.reduce_scatter_tensor(out, buf, group=group, async_op=True)
            self._works.append((work, None if same else (lambda o=out, d=dest: d.copy_(o)), buf))
            if not self.overlap:
                self._finish_all()
            return
        # CUDA with NCCL: reduce on the device, then the shard goes where dests says.
        out = torch.empty(n, dtype=buf.dtype, device=self.device)
        work = td.reduce_scatter_tensor(out, buf, group=group, async_op=True)
        with torch.cuda.stream(self.side):
            work.wait()  # the side stream waits for the collective
            self._norms.append(torch.linalg.vector_norm(out, 2, dtype=torch.float32))
            dest.copy_(out, non_blocking=True)
            out.record_stream(self.side)
            buf.record_stream(self.side)
        if not self.overlap:
            torch.cuda.current_stream(self.device).wait_stream(self.side)

    def _reduce(self, buf: torch.Tensor, n: int, device) -> tuple:
        """(the reduced shard of ``buf`` as a tensor on ``device``, the collective's work or None)."""
        if self.sm.world_size == 1:
            return buf, None
        out = torch.empty(n, dtype=buf.dtype, device=device)
        return out, td.reduce_scatter_tensor(out, buf, group=self.sm.group, async_op=True)

    def _issue_accumulate(self, gi: int, ui: int, buf: torch.Tensor, dest: torch.Tensor, n: int) -> None:
        """Stage 3: the unit's reduced shard added into ``dest`` (copied on its first micro-batch
        since the last step); the norm is taken of the sum, on the boundary micro-batch."""
        first = (gi, ui) not in self._fresh
        self._fresh.add((gi, ui))
        if self.comm_cpu and self.cuda:  # Gloo with a CUDA model: reduce on the host, synchronously
            host = buf.to("cpu")
            out, work = self._reduce(host, n, "cpu")
            if work is not None:
                work.wait()
            dest.copy_(out) if first else dest.add_(out)
            return
        if not self.cuda:
            out, work = self._reduce(buf, n, "cpu")

            def finish(o=out, d=dest, f=first):
                d.copy_(o) if f else d.add_(o)
            if work is None:
                finish()
            else:
                self._works.append((work, finish, buf))
                if not self.overlap:
                    self._finish_all()
            return
        out, work = self._reduce(buf, n, self.device)
        producer = torch.cuda.current_stream(self.device)  # where the unit's gradients were copied
        with torch.cuda.stream(self.side):
            self.side.wait_stream(producer)
            if work is not None:
                work.wait()
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
            buf.record_stream(self.side)

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
        self._armed = False

    # -- the step --------------------------------------------------------------------------------------
    def gather(self) -> None:
        """Reduces what is left (every unit with stage 1) and waits. Stage 3 reduced everything
        during backward: units that got nothing since the last step read as zeros."""
        if not self.accumulate:
            self._flush()
        self._finish_all()
        if self.cuda:
            self.side.synchronize()
        if self.accumulate:
            for gi, gp in enumerate(self.sm.plan.groups):
                for ui in range(len(gp.units)):
                    if (gi, ui) not in self._fresh:
                        start, n = self.sm.local_range(gi, ui)
                        self.dests[gi][start:start + n].zero_()
                        self._fresh.add((gi, ui))

    def local_norms(self) -> list:
        return self._norms

    def reset(self) -> None:
        """Ready for the next boundary: every unit waits for all its gradients again."""
        self._begin_pass()
        self._works: list = []      # Gloo: (work, copy to dest or None, input kept alive), in order
        self._norms: list = []      # CUDA: fp32 norms of the reduced shards, on the device
        self._fresh: set = set()    # stage 3: units whose dest holds this step's sum
        self._boundary = True

    def _begin_pass(self) -> None:
        self._missing = {(gi, ui): u.count for gi, gp in enumerate(self.sm.plan.groups)
                         for ui, u in enumerate(gp.units)}  # gradients a unit still waits for
        self._unit_bufs: dict = {}  # (group, unit) -> the unit's gradient buffer until issued
        self._next = 0              # index into _order of the next unit to issue
        self._taken: set = set()    # (group, param) whose gradient is in its unit buffer


def _flat_base(views: list, flats: list) -> list | None:
    """Per group, the flat tensor whose per-piece views ``views`` are (None if not among ``flats``)."""
    out = []
    for gi, row in enumerate(views):
        hit = next((f for f in flats if row and f.data_ptr() == row[0].data_ptr()), None)
        if hit is None:
            return None
        out.append(hit)
    return out


class _ShardedSource:
    """offload.HostBuffers' gradient source for several ranks: the GradReducer's shards."""

    def __init__(self, reducer: GradReducer, grads: list, device_norms: bool):
        self.reducer, self.grads, self.device_norms = reducer, grads, device_norms

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


class ShardedBuffers(HostBuffers):
    """offload.HostBuffers for several ranks (see the module docstring): host buffers in this
    rank's local space, gradients reduce-scattered into them, weights all-gathered back. What
    does not depend on the ranks (pinning, the gradient source's calls, waiting for the last
    step's copies) is HostBuffers' own."""

    def __init__(self, sm: ShardedModel, *, pin_memory: bool, stage: int, overlap: bool, comm_cpu: bool,
                 comm_dtype: torch.dtype):
        self.sm = sm
        self.layout = sm.local_layout
        self.device = sm.device
        self.cuda = self.device.type == "cuda"
        self.model_dtype = sm.dtype
        self.comm_cpu = comm_cpu
        self._pin = self.cuda and pin_memory
        self._pinned_ptrs: list[int] = []
        self._pinned_any = False
        weakref.finalize(self, _unpin, self._pinned_ptrs)
        self._flats: list = []
        self.flat_grads, self.grads = self.alloc(sm.dtype)
        self.reducer = GradReducer(sm, self.flat_grads, stage=stage, overlap=overlap, comm_cpu=comm_cpu,
                                   comm_dtype=comm_dtype)
        self._source = _ShardedSource(self.reducer, self.grads, device_norms=self.cuda and not comm_cpu)
        self._h2d_done = None
        self._pending_src = None

    def alloc(self, dtype: torch.dtype) -> tuple[list, list]:
        """(one flat zeroed host buffer per group of the local space, per group the per-piece
        views), page-locked on CUDA with pin_memory."""
        flats = []
        for total in self.layout.totals:
            t, pinned = alloc_host(total, dtype, self._pin, self._pinned_ptrs)
            t.zero_()  # padding stays zero
            self._pinned_any = self._pinned_any or pinned
            flats.append(t)
        self._flats.extend(flats)
        return flats, [self.layout.views(f, gi) for gi, f in enumerate(flats)]

    # -- gradients (the source's calls are HostBuffers') -------------------------------------------
    def _retarget(self, flat: list, views: list) -> None:
        self.reducer.dests = flat
        self._source.grads = views

    def release(self) -> None:
        for ps in self.sm.layout.params:
            for p in ps:
                p.grad = None
        self._source.reset()

    # -- weights ----------------------------------------------------------------------------------
    def write_back(self, src: list, keys: list) -> None:
        """Puts the new weights of the pieces ``keys`` into this rank's shards of the unit
        buffers (on the host path with Gloo and a CUDA model: remembered for the all-gather,
        which then runs on the host)."""
        self._pending_src = src
        if self.comm_cpu and self.cuda:
            return
        with torch.no_grad():
            for gi, pi in keys:
                p, s = self.layout.params[gi][pi], src[gi][pi]
                if s.data_ptr() != p.data_ptr():
                    p.copy_(s, non_blocking=self.cuda)

    def gather_unit(self, gi: int, ui: int, src: list, group) -> None:
        """After :meth:`write_back` of every piece of unit ui (group gi): its all-gather on
        ``group`` (offload_optimizer.overlap_forward runs it from the step's own thread, on a
        process group of its own, so it never interleaves with the training thread's
        collectives)."""
        host_out = _flat_base(src, self._flats) if self.comm_cpu and self.cuda else None
        self.sm.all_gather_unit(gi, ui, self.comm_cpu, host_out, group)

    def end_write_back(self) -> None:
        """One all-gather per unit: every rank's new shard into every rank's parameters."""
        host_out = None
        if self.comm_cpu and self.cuda:
            host_out = _flat_base(self._pending_src, self._flats)
        self.sm.all_gather(self.comm_cpu, host_out)
        self._pending_src = None
        if self.cuda:
            self._h2d_done = torch.cuda.Event()
            self._h2d_done.record(torch.cuda.current_stream(self.device))

    def refresh(self, masters: list, outs: list | None) -> None:
        """After a checkpoint load replaced this rank's masters: its shards, its weight buffers
        and then, by all-gather, every parameter follow them."""
        with torch.no_grad():
            for ps, ms in zip(self.layout.params, masters):
                for p, m in zip(ps, ms):
                    if p.data_ptr() != m.data_ptr():
                        p.copy_(m.reshape(-1).to(p.device, p.dtype))
            for ms, os_ in zip(masters, outs or []):
                for m, o in zip(ms, os_):
                    if o.data_ptr() != m.data_ptr():
                        o.copy_(m.reshape(-1))
        src = outs if outs is not None else masters
        self._pending_src = src
        self.end_write_back()
        self.wait_host_buffers()


class ShardedDevicePath(OptimizerPath):
    """torch's optimizer on the device over this rank's shards (offload_optimizer.device none,
    several ranks): one flat fp32 master per group (the local space), reduced gradients
    in fp32 beside it, updated weights into the shards and all-gathered."""

    def __init__(self, sm: ShardedModel, name: str | None, params: dict, client, *, stage: int,
                 overlap: bool, comm_cpu: bool, comm_dtype: torch.dtype):
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
        self.reducer = GradReducer(sm, self._gflat, stage=stage, overlap=overlap, comm_cpu=comm_cpu,
                                   comm_dtype=comm_dtype)
        self.comm_cpu = comm_cpu
        self._phase = 0  # of the step under way: 1 gradients scaled, 2 stepped (see apply)

    def before_backward(self, boundary: bool) -> None:
        self.reducer.before_backward(boundary)

    def after_backward(self) -> None:
        self.reducer.after_backward()

    def gather(self) -> None:
        self.reducer.gather()

    def grad_stats(self, scale: float) -> tuple[float, bool]:
        return torch_grad_stats(self._gflat, scale)

    def apply(self, factor: float) -> None:
        # Called again after it raised: each phase that ran is not repeated (the all-gather is).
        if factor != 1.0 and self._phase == 0:
            torch._foreach_mul_(self._gflat, factor)
        self._phase = max(self._phase, 1)
        if self._phase == 1:
            self.optimizer.step()
            self._phase = 2
        self._to_model()
        self._phase = 0

    def abandon_step(self) -> None:
        self._phase = 0

    def _to_model(self) -> None:
        host_out = None
        with torch.no_grad():
            for gi, gp in enumerate(self.sm.plan.groups):
                for ui in range(len(gp.units)):
                    start, n = self.sm.local_range(gi, ui)
                    self.sm.shard(gi, ui).copy_(self._flat[gi][start:start + n])
            if self.comm_cpu and self.sm.device.type == "cuda":
                host_out = [f.to("cpu", self.sm.dtype) for f in self._flat]
        self.sm.all_gather(self.comm_cpu, host_out)

    def release(self) -> None:
        self._phase = 0
        self.reducer.reset()
        self.zero_grad()

    def zero_grad(self) -> None:
        for ps in self.sm.layout.params:
            for p in ps:
                p.grad = None

    @property
    def sharded(self) -> ShardedModel:
        return self.sm

    def param_states(self) -> list:
        """The flat state of each group cut into the local space's entries (views; a value
        that is not per element, the step, is shared by every entry)."""
        state = self.optimizer.state_dict()["state"]
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
                if torch.is_tensor(v0) and v0.dim() >= 1:
                    flat = torch.zeros(total, dtype=v0.dtype)
                    for (_pc, at, n), st in zip(entries, row):
                        v = st[k]
                        if not torch.is_tensor(v) or v.numel() != n:
                            raise ValueError(f"state '{k}' of a piece has {getattr(v, 'numel', lambda: 1)()} "
                                             f"values for {n} elements")
                        flat[at:at + n] = v.reshape(-1)
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
                    v.copy_(s.reshape(-1).to(v.device, torch.float32))
        self._to_model()
