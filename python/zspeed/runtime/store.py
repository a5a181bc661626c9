"""Parameter stores: where the trained (or frozen) parameters' values live, and this rank's
part of them.

A store sits on a partition plan (partition.py): every parameter group is cut into units
of whole parameters, and every unit into one shard per rank. This rank's shards, one after
another per group, are its *local space*; :attr:`ParamStore.local_layout` describes it as a
:class:`~zspeed.runtime.layout.FlatLayout` whose "parameters" are the pieces of real
parameters the rank owns plus the padding at the end of a shard. The optimizer paths
(paths.py, cpu.py, nvme.py) step that local space exactly as they would step whole
parameters: pieces like parameters (padding stays zero: zero gradient, weight and state).

Two kinds, by composition of the same base:

:class:`ShardedStore` (ZeRO stages 1 and 2 on several ranks, or on one with an offloaded optimizer)
    every rank holds the whole model on its device, each unit flattened into one buffer
    (the parameters are views of it, so an all-gather into the buffer updates the model in
    place); this rank's shard of a unit is a view of that buffer. :meth:`publish` all-gathers
    every rank's new shards into every rank's buffers.
:class:`PartitionedStore` (ZeRO stage 3)
    the rank holds only its shards, one flat tensor per group on the shard medium (the
    device, or host memory, page-locked on CUDA); the parameters themselves are emptied
    (``p.ds_shape``/``p.ds_numel`` keep their size) and the fetcher (zero3.py) gathers them
    when a module runs. :meth:`publish` puts new weights into the shards and marks the
    gathered copies stale. zero3_nvme.py's store keeps the shards of parameters nothing
    trains in a file instead.

Collectives go through the run's comm strategy (collectives.py), so no store asks which
backend runs.
"""
from __future__ import annotations

import math
import weakref

import torch

from .checkpoint_files import is_tensor
from .collectives import Collectives
from .hostmem import alloc_host, pin_filled, unpin
from .layout import FlatLayout
from .partition import PartitionPlan

__all__ = ["ParamStore", "ShardedStore", "PartitionedStore", "GradsInShards", "full_numel", "full_shape",
           "flat_base"]


def full_numel(p: torch.Tensor) -> int:
    """The number of elements of a parameter, partitioned or not."""
    return int(p.ds_numel) if hasattr(p, "ds_numel") else p.numel()


def full_shape(p: torch.Tensor) -> torch.Size:
    return p.ds_shape if hasattr(p, "ds_shape") else p.shape


def flat_base(views: list, flats: list) -> list | None:
    """Per group, the flat tensor of ``flats`` whose per-piece views ``views`` are (None when a
    group's views are not views of one of them)."""
    out = []
    for row in views:
        hit = next((f for f in flats if row and f.data_ptr() == row[0].data_ptr()), None)
        if hit is None:
            return None
        out.append(hit)
    return out


class ShardView(torch.Tensor):
    """``p.ds_tensor`` under the engine: a view of this rank's part of the store. Assigning
    ``ds_tensor.data = t`` (DeepSpeed's scripts and tests do) copies ``t`` into the store, as an in-place
    write does, instead of pointing the view elsewhere, which the engine would never read: the next
    gather sees it. A ``t`` of another shape is refused (the store's layout is fixed)."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # plain tensor speed; results are Tensors

    @property
    def data(self):
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, value):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"zspeed: ds_tensor.data takes a tensor, not {type(value).__name__}")
        if value.shape != self.shape:
            raise ValueError(
                f"zspeed: ds_tensor.data = a tensor of shape {tuple(value.shape)}: this rank's part of the parameter "
                f"has shape {tuple(self.shape)} and lives in the engine's store (its layout is fixed), so a new value "
                f"must have that shape; write the whole parameter with deepspeed.utils.safe_set_full_fp32_param or "
                f"inside zero.GatheredParameters(..., modifier_rank=0) instead")
        with torch.no_grad():
            torch.Tensor.data.__get__(self).copy_(value)


class ParamStore:
    """What every store has: the layout of its parameters, the partition plan (also with one
    rank), the comm strategy, and this rank's local space. Subclasses hold the shards
    (:meth:`shard`) and say how new weights reach the model (:meth:`publish`)."""

    nvme = False          # shards in a file (zero3_nvme.py)
    whole_params = False  # the parameters themselves hold whole values (else only this rank's shards)

    def __init__(self, layout: FlatLayout, plan: PartitionPlan, device: torch.device, dtype: torch.dtype,
                 comm: Collectives, *, param_device: torch.device):
        self.layout, self.plan, self.device, self.dtype = layout, plan, device, dtype
        self.comm = comm
        self.group = comm.group
        self.rank, self.world_size = plan.rank, plan.world_size
        self.param_device = param_device  # where the shards live
        self.fetcher = None  # ZeRO-3: the ParamFetcher gathering these parameters
        self._pinned_ptrs: list[int] = []
        weakref.finalize(self, unpin, self._pinned_ptrs)

    # -- the shards -------------------------------------------------------------------------------
    def shard(self, gi: int, ui: int) -> torch.Tensor:
        """This rank's shard of unit ui of group gi."""
        raise NotImplementedError

    def local_range(self, gi: int, ui: int) -> tuple[int, int]:
        """(start, length) of unit ui's shard in the local space of group gi."""
        gp = self.plan.groups[gi]
        return gp.local_start[ui], gp.units[ui].shard

    def _build_local(self) -> None:
        """The local space: per group, the pieces (plus padding) in local order, as views of
        this rank's shards."""
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
        """Per group, per entry of the local space (:attr:`pieces`), the piece of
        ``full(gi, pi)`` (parameter pi of group gi, flattened) as fp32, or zeros for padding."""
        rows = []
        for gi, entries in enumerate(self.pieces):
            rows.append([torch.zeros(n, dtype=torch.float32) if pc is None else
                         full(gi, pc.param).reshape(-1)[pc.offset:pc.offset + n].to("cpu", torch.float32)
                         for pc, _at, n in entries])
        return rows

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

    def weights(self, gi: int, ui: int) -> torch.Tensor:
        """Unit ui's shard as weights, for every reader but the optimizer (gathers, whole values):
        the shard itself, or where it holds gradients (:class:`GradsInShards`) the weights
        derived from the fp32 masters."""
        return self.shard(gi, ui)

    def _source(self, src: list | None, gi: int, ui: int) -> torch.Tensor:
        """Unit ui's new shard: from ``src`` (per group, a flat tensor of the local space) or, with
        None, the shard itself."""
        if src is None:
            return self.shard(gi, ui)
        start, n = self.local_range(gi, ui)
        return src[gi][start:start + n]

    # -- new weights, whole values ------------------------------------------------------------------
    def publish(self, src: list | None = None) -> None:
        """After an optimizer step: this rank's new shards (``src``, per group a flat tensor of
        the local space; None: the shards hold them) reach the model."""
        raise NotImplementedError

    def publish_unit(self, gi: int, ui: int, src: list | None = None, group=None) -> None:
        """:meth:`publish` for unit ui of group gi alone, with its collective on ``group`` (the
        gathered copies of a partitioned store are not marked stale here: :meth:`mark_stale`)."""
        self.publish_shard(gi, ui, self._source(src, gi, ui), group)

    def publish_shard(self, gi: int, ui: int, new: torch.Tensor, group=None) -> None:
        """Unit ui of group gi's new shard ``new`` (this rank's, any device; the shard itself
        when it holds them already) into the model, with its collective on ``group``."""
        raise NotImplementedError

    def check_writable(self) -> None:
        """Raises if writing weights into the shards now would destroy gradients held there."""

    def drop_grads(self) -> None:
        """The model's gradients of this store's parameters are dropped (after a step)."""
        for ps in self.layout.params:
            for p in ps:
                p.grad = None

    def mark_stale(self) -> None:
        """The gathered copies of this store's parameters (ZeRO-3) are stale: an optimizer step
        is changing the shards. Called from the training thread before a step starts."""
        if self.fetcher is not None:
            self.fetcher.mark_stale(self)

    def full(self, gi: int, pi: int, device=None) -> torch.Tensor:
        """Parameter pi of group gi whole (flat, the model's dtype) on ``device`` (default: the
        model's). With several ranks every rank must call it (an all-gather)."""
        device = torch.device(device) if device is not None else self.device
        gp = self.plan.groups[gi]
        ui = gp.unit_of[pi]
        u = gp.units[ui]
        off, n = gp.offsets[pi] - u.start, gp.numels[pi]  # the parameter's place in its unit
        whole = self.comm.gathered(self.weights(gi, ui), u.padded)
        return whole[off:off + n].to(device, copy=True)

    def set_full(self, gi: int, pi: int, value: torch.Tensor) -> None:
        """Writes this rank's shard of parameter pi from its whole value (any shape of its size)."""
        gp = self.plan.groups[gi]
        ui = gp.unit_of[pi]
        u = gp.units[ui]
        self.check_writable()
        flat = value.detach().reshape(-1)
        off, n = gp.offsets[pi] - u.start, gp.numels[pi]
        with torch.no_grad():
            lo = max(off, self.rank * u.shard)  # in the unit: this rank's part of the parameter
            hi = min(off + n, (self.rank + 1) * u.shard)
            if hi > lo:
                at = lo - self.rank * u.shard
                self.shard(gi, ui)[at:at + hi - lo].copy_(flat[lo - off:hi - off].to(self.param_device, self.dtype))
        if self.fetcher is not None:
            self.fetcher.mark_stale(self)


class ShardedStore(ParamStore):
    """ZeRO stages 1-2 on several ranks (or on one, with an offloaded optimizer: one unit per
    parameter, unpadded): the whole model on the device, flattened per unit."""

    whole_params = True

    def __init__(self, layout: FlatLayout, plan: PartitionPlan, device: torch.device, dtype: torch.dtype,
                 comm: Collectives):
        super().__init__(layout, plan, device, dtype, comm, param_device=device)
        # Per group, per unit: one flat buffer holding the unit's parameters. In host memory the
        # units of a group are end to end in one allocation: the CPU optimizer writes the
        # parameters there, and steps a run of them that lie end to end in one call. On a device
        # each unit is an allocation of its own, made as the model's own storage is freed
        # parameter by parameter (one allocation would hold the model twice for a moment).
        self.bufs: list[list[torch.Tensor]] = []
        with torch.no_grad():
            for gi, gp in enumerate(plan.groups):
                row = []
                whole = torch.zeros(sum(u.padded for u in gp.units), dtype=dtype) if device.type == "cpu" else None
                start = 0
                for u in gp.units:
                    buf = (whole[start:start + u.padded] if whole is not None else
                           torch.zeros(u.padded, dtype=dtype, device=device))
                    start += u.padded
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

    def shard(self, gi: int, ui: int) -> torch.Tensor:
        """This rank's shard of unit ui of group gi (a view of the unit's buffer)."""
        u = self.plan.groups[gi].units[ui]
        return self.bufs[gi][ui].narrow(0, self.rank * u.shard, u.shard)

    def publish(self, src: list | None = None) -> None:
        """Every rank's new shards into every unit buffer (so into the parameters)."""
        for gi, row in enumerate(self.bufs):
            for ui in range(len(row)):
                self.publish_unit(gi, ui, src)

    def publish_shard(self, gi: int, ui: int, new: torch.Tensor, group=None) -> None:
        with torch.no_grad():
            self.comm.all_gather(self.bufs[gi][ui], new, group=group)

    def full(self, gi: int, pi: int, device=None) -> torch.Tensor:
        p = self.layout.params[gi][pi]
        return p.detach().reshape(-1).to(device if device is not None else self.device, copy=True)


class PartitionedStore(ParamStore):
    """ZeRO-3: only this rank's shards, one flat tensor per group on ``param_device`` (host
    memory, page-locked with ``pin``, or the device); the parameters are emptied."""

    def __init__(self, layout: FlatLayout, plan: PartitionPlan, device: torch.device, dtype: torch.dtype,
                 comm: Collectives, *, param_device: torch.device, pin: bool):
        super().__init__(layout, plan, device, dtype, comm, param_device=param_device)
        self.flat: list[torch.Tensor] = []
        with torch.no_grad():
            for gi, gp in enumerate(plan.groups):
                # Host shards are filled before they are page-locked: the pages of a fresh
                # allocation are taken only as the shards are written, while each parameter is
                # freed once copied, so host memory holds the model about once (locking first
                # would take every page at once, beside the whole model).
                if param_device.type == "cpu":
                    flat, _ = alloc_host(gp.local_len, dtype, False, self._pinned_ptrs)
                else:
                    flat = torch.empty(gp.local_len, dtype=dtype, device=param_device)
                pieces = plan.pieces(gi)
                last = {pc.param: i for i, pc in enumerate(pieces)}
                done = set()
                end = 0  # pieces come in local order: what lies between them is padding, zeroed
                for i, pc in enumerate(pieces):
                    if pc.at > end:
                        flat[end:pc.at].zero_()
                    end = pc.at + pc.length
                    p = layout.params[gi][pc.param]
                    flat[pc.at:end].copy_(shard_source(p, pc, plan, gp))
                    if last[pc.param] == i:  # the whole parameter is not needed any more: free it now
                        empty_param(p, dtype, device)
                        done.add(pc.param)
                if end < gp.local_len:
                    flat[end:].zero_()
                if param_device.type == "cpu" and pin:
                    flat = pin_filled(flat, self._pinned_ptrs)
                self.flat.append(flat)
                for pi, p in enumerate(layout.params[gi]):
                    if pi not in done:  # no piece on this rank
                        empty_param(p, dtype, device)
        self._build_local()
        self._expose_shards()

    def _expose_shards(self) -> None:
        """DeepSpeed's ``p.ds_tensor`` under the engine: this rank's part of each parameter (the
        elements the safe_*_local_* calls read and write, without the shard's padding; empty on a
        rank holding none of it), a live view of the store in the model's dtype (ShardView: an
        assignment to its ``.data`` is copied in). Writing into it in place changes the weights
        the next gather reads, not the fp32 masters (the next step writes them back), as
        DeepSpeed's; while the gradients are held in the shards (GradsInShards) it holds
        gradients."""
        for gi, gp in enumerate(self.plan.groups):
            flat, parts = self.flat[gi], {pc.param: pc for pc in self.plan.pieces(gi)}
            for pi, p in enumerate(self.layout.params[gi]):
                pc = parts.get(pi)
                part = flat.narrow(0, 0, 0) if pc is None else flat.narrow(0, pc.at, pc.length)
                p.ds_tensor = part.as_subclass(ShardView)

    def shard(self, gi: int, ui: int) -> torch.Tensor:
        u = self.plan.groups[gi].units[ui]
        start = self.plan.groups[gi].local_start[ui]
        return self.flat[gi].narrow(0, start, u.shard)

    grads_in: "GradsInShards | None" = None  # set when the reduced gradients land in the shards

    def weights(self, gi: int, ui: int) -> torch.Tensor:
        g = self.grads_in
        return g.derived(gi, ui) if g is not None and (gi, ui) in g.held else self.shard(gi, ui)

    def check_writable(self) -> None:
        if self.grads_in is not None and self.grads_in.held:
            raise RuntimeError(
                "zspeed: the parameters cannot be written between backward and step here: the last backward's "
                "gradients are held in the host parameter shards until engine.step() (ZeRO-3 with offload_param, "
                "to save host memory). Call engine.step() first, or set zero_optimization.offload_param."
                "grads_in_shards false to keep a separate gradient buffer.")

    def publish(self, src: list | None = None) -> None:
        """Nothing is gathered now, as the shards are the weights: new weights kept elsewhere
        (``src``: the path's host buffer, when it is not the shards themselves) are copied in,
        and materialized (persistent) parameters are gathered again before their next use."""
        with torch.no_grad():
            for flat, out in zip(self.flat, src or ()):
                if out.data_ptr() != flat.data_ptr():
                    flat.copy_(out)
        if self.fetcher is not None:
            self.fetcher.mark_stale(self)

    def publish_shard(self, gi: int, ui: int, new: torch.Tensor, group=None) -> None:
        del group  # nothing is gathered now: the fetcher gathers the shards when a module runs
        shard = self.shard(gi, ui)
        if new.data_ptr() != shard.data_ptr():
            with torch.no_grad():
                shard.copy_(new, non_blocking=new.is_cuda and shard.is_pinned())


class GradsInShards:
    """The reduced gradients of a boundary in a partitioned store's host shards (ZeRO-3 with
    offload_param, offload_optimizer cpu: plan.grads_in_shards). A unit's weights are not
    needed between the last use of its parameters in backward and the step, which overwrites
    them, and the fp32 masters hold them meanwhile (the shards are the masters rounded to the
    model's dtype), so the shards can serve as the gradient buffer: the CPU kernel reads each
    element's gradient and writes its new weight in its place.

    ``held`` lists the units whose shards hold gradients: from the landing of their first
    gradient until the step has stepped all of their elements (chunk by chunk, also in the
    background with overlap_forward, whose gate lets a forward read a unit only then). Every
    reader but the optimizer gets a held unit's weights from the masters (:meth:`derived`: a
    forward or GatheredParameters between backward and step, a second backward before the step,
    a forward after a step that failed partway), which is right at any point of a step, as each
    chunk's masters and shards are written by the same kernel call. A step that does not run
    (an overflow skip) or is abandoned puts the weights back from the masters
    (:meth:`restore`, at the release of the gradients); writing weights into the shards while
    any unit is held is refused (its gradients would be lost)."""

    def __init__(self, store: PartitionedStore):
        self.store = store
        self.held: set = set()
        # per group of the store, per (local start, end) of the space a path steps: a reader of
        # its fp32 masters, reader(local start, n, cache) -> n values (a flat host buffer's slice,
        # or a read from the NVMe swap files; ``cache`` lets one restore read each file partition once)
        self.masters: dict = {}

    def land(self, gi: int, ui: int) -> None:
        self.held.add((gi, ui))

    def use_masters(self, gis: list, flats: list, bases: list) -> None:
        """Groups ``gis``' fp32 masters: ``flats[i]`` holds group gis[i]'s local space from ``bases[i]``."""
        self.use_readers(gis, [lambda start, n, cache, f=f, b=b: f[start - b:start - b + n]
                               for f, b in zip(flats, bases)], bases, [f.numel() for f in flats])

    def use_readers(self, gis: list, readers: list, bases: list, sizes: list) -> None:
        """Groups ``gis``' fp32 masters from ``readers[i]`` for the local range ``bases[i]`` +
        ``sizes[i]`` (a path that keeps its masters elsewhere than in one host buffer)."""
        for gi, r, b, n in zip(gis, readers, bases, sizes):
            row = self.masters.setdefault(gi, {})
            for lo, hi in [k for k in row if k[0] < b + n and b < k[1]]:  # a path this one replaces
                del row[lo, hi]
            row[b, b + n] = r

    def _masters(self, gi: int, ui: int, cache: dict | None = None) -> torch.Tensor:
        start, n = self.store.local_range(gi, ui)
        for (lo, hi), read in self.masters[gi].items():
            if lo <= start < hi:
                return read(start, n, {} if cache is None else cache)
        raise AssertionError(f"no path holds the masters of unit {ui} of group {gi}")

    def derived(self, gi: int, ui: int) -> torch.Tensor:
        """Unit ui's weights, rounded from its masters (the values its shard held before the
        gradients; a new tensor)."""
        return self._masters(gi, ui).to(self.store.dtype)

    def stepped(self, units) -> None:
        """The step has written every element of ``units`` ((group, unit)): they hold weights."""
        for u in units:
            self.held.discard(u)

    def restore(self) -> None:
        """The held units' weights back into their shards from the masters."""
        cache: dict = {}
        with torch.no_grad():
            for gi, ui in sorted(self.held):
                self.store.shard(gi, ui).copy_(self._masters(gi, ui, cache))
        self.held.clear()


def shard_source(p: torch.Tensor, pc, plan: PartitionPlan, gp) -> torch.Tensor:
    """The elements of piece ``pc`` from the parameter: from its data, or from the shard that
    zero.Init left in ``p.ds_tensor`` (computed by the same plan: one unit per parameter)."""
    ds = getattr(p, "ds_tensor", None)
    if ds is not None:
        u = gp.units[pc.unit]
        lo = plan.rank * u.shard
        return ds.reshape(-1)[pc.offset - lo:pc.offset - lo + pc.length]
    return p.detach().reshape(-1)[pc.offset:pc.offset + pc.length]


def empty_param(p: torch.Tensor, dtype, device) -> None:
    """Releases a parameter's storage, recording its real size (DeepSpeed's ds_shape/ds_numel)."""
    if not hasattr(p, "ds_shape"):
        p.ds_shape = p.shape
        p.ds_numel = p.numel()
    if hasattr(p, "ds_tensor"):
        del p.ds_tensor
    p.data = torch.empty(0, dtype=dtype, device=device)


def per_element_shape(key: str, shape, n: int) -> bool:
    """Whether optimizer state ``key`` of this shape, for a piece of n elements, holds one value
    per element (exp_avg, ...) rather than one for the piece's whole tensor (a step, also as a
    tensor of shape () or (1,)): a tensor of n elements; for a one-element piece, a
    one-element 'step' counts as the shared step. The checkpoint reader decides on the saved
    shape, the optimizer paths on the tensor (:func:`per_element`)."""
    return len(shape) >= 1 and math.prod(shape) == n and not (n == 1 and key == "step")


def per_element(key: str, v, n: int) -> bool:
    """:func:`per_element_shape` of a state value (a tensor, or a number: never per element)."""
    return is_tensor(v) and per_element_shape(key, v.shape, n)
