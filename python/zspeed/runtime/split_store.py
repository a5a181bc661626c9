"""The GPU/CPU optimizer split over a parameter store's local space (``offload_optimizer.ratio``
< 1 or ``"auto"``, at every ZeRO stage on any number of ranks: with an offloaded optimizer,
stages 1-2 on one rank step a store of shard degree 1).

A store (store.py) cuts every parameter group into units and gives this rank one shard of
each: its local space, which the optimizer steps. The split gives the GPU the first units of
every group's local space -- the same units on every rank, as a unit's shards are alike in
size -- until the GPU's share of the rank's elements is ``1 - ratio``; the CPU steps the
rest. Per group the cut is one point of the local space, so each half is one contiguous
range of it:

- the GPU half (:class:`DeviceShare`): the range's fp32 masters in one flat tensor per group
  on the GPU, its fp32 gradients beside them, torch's fused AdamW; after its step the new
  weights go into the store's shards (on the GPU, or in host memory for ZeRO-3 with
  offload_param: a copy out of the GPU, asynchronous into page-locked shards) and are
  published (all-gathered at stages 1-2);
- the CPU half: the ordinary HostPath (cpu.py) over the rest, with :class:`HostShare` as its
  host buffers, so its step is timed by the same runners: synchronous, or overlapped with
  the next forward (offload_optimizer.overlap_forward), where each of its units is published
  once stepped and the next forward -- at ZeRO-3 the fetcher's gathers -- waits per unit.

With ``offload_optimizer.device "nvme"`` the rest keeps its masters and state in the NVMe swap
files (nvme.NVMePath over a HostShare), and with ``max_in_cpu`` there are three tiers along the
local space: the GPU's units, then host memory's (HostPath, at most max_in_cpu elements, whole
units), then NVMe's (the ``disk`` half); a step queues the GPU's, then steps the host's and the
disk's (:func:`tier_units` cuts them).

One gradient reducer (dp.GradReducer) serves every half: it lands each unit's summed shard on its
half (the GPU's units in the GPU's fp32 buffer, the CPU's in its host buffer). The gradient
norm and the overflow flag are taken over both halves at once (from the reducer's norms on
the GPU, or per half on the host), so clipping and fp16 loss scaling see the whole model,
exactly as without a split. The checkpoint sees the store's pieces, each with its fp32
master and its Adam state in CPUAdam's format, whichever half holds it: a checkpoint moves
between any split, plain offload and any rank count.
"""
from __future__ import annotations

import logging

import torch

from .checkpoint_files import Deferred, materialized, real
from .collectives import Collectives
from .cpu import HostPath
from .dp import GradReducer, PhasedStep, ShardGrads
from .layout import FlatLayout
from .memory import Need
from .nvme import NVMePath
from .offload import HostBuffers
from .optimizers import build_device_optimizer, convert_adam_state, converted_like, norms_stats, torch_grad_stats
from .paths import OptimizerPath, copy_masters, indexed_groups
from .split import AutoSplit, TwoHalves
from .store import GradsInShards, ParamStore
from .streams import streams_for

log = logging.getLogger("zspeed.split")

__all__ = ["StoreSplitPath", "DeviceShare", "HostShare", "gpu_units", "tier_units"]


def gpu_units(sm: ParamStore, ratio: float) -> list:
    """Per group, how many of its first units the GPU steps for a CPU share of ``ratio`` (of this
    rank's local elements, as near as whole units allow): a prefix in (group, unit) order."""
    total = sum(u.shard for gp in sm.plan.groups for u in gp.units)
    return _advance(sm, [0] * len(sm.plan.groups), (1.0 - float(ratio)) * total, at_most=False)


def tier_units(sm: ParamStore, ratio: float, host_elems: int = 0) -> list:
    """Per group (k1, k2): units [0, k1) on the GPU (:func:`gpu_units`), [k1, k2) in host memory
    -- the next ones in (group, unit) order, at most ``host_elems`` elements -- and the rest,
    [k2, end), on the last tier (host memory too, or NVMe)."""
    k1 = gpu_units(sm, ratio)
    k2 = _advance(sm, k1, float(host_elems), at_most=True) if host_elems > 0 else \
        [len(gp.units) for gp in sm.plan.groups]
    return list(zip(k1, k2))


def _advance(sm: ParamStore, starts: list, elems: float, at_most: bool) -> list:
    """Per group, the end of a run of units that begins at ``starts`` and goes on in (group, unit)
    order over ``elems`` elements: as near as whole units allow, or never more (``at_most``)."""
    out, left = [], elems
    for gp, k in zip(sm.plan.groups, starts):
        for u in gp.units[k:]:
            if left <= 0 or left < (u.shard if at_most else u.shard / 2):
                left = 0  # the run ends here: the rest of the model is the next tier's
                break
            left -= u.shard
            k += 1
        out.append(k)
    return out


_SPANS = {"cuda": "cuda_span"}  # the device's kind of trace span (elsewhere: a span of the training thread)


def _end(gp, k: int) -> int:
    """Where unit k begins in a group's local space (its end for k = the unit count)."""
    return gp.local_start[k] if k < len(gp.units) else sum(u.shard for u in gp.units)


class DeviceShare(OptimizerPath):
    """The GPU's half: units [0, k) of each group in ``gis`` (``ks``), fp32 masters and torch's
    AdamW on the store's device (see the module docstring)."""

    def __init__(self, sm: ParamStore, layout: FlatLayout, gis: list, ks: list, name: str, params: dict):
        super().__init__(layout)
        self.sm, self.gis, self.ks = sm, gis, ks
        dev = sm.device
        with torch.no_grad():
            self._flat = [torch.cat([sm.shard(gi, ui).reshape(-1) for ui in range(k)]).to(dev, torch.float32)
                          for gi, k in zip(gis, ks)]
        self._gflat = [torch.zeros_like(f) for f in self._flat]
        for f, g in zip(self._flat, self._gflat):
            f.grad = g
        self._views = [layout.views(f, i) for i, f in enumerate(self._flat)]
        self.optimizer = build_device_optimizer(name, params, layout.with_params([[f] for f in self._flat]), dev)
        self._steps = PhasedStep(self._gflat)
        self._streams = streams_for(dev)
        self._written = None  # CUDA event after the copies of the new weights into host shards

    def unit_dest(self, i: int, gi: int, ui: int) -> torch.Tensor:
        """Where the reducer puts unit ui's summed shard: its range of the fp32 gradient buffer."""
        start, n = self.sm.local_range(gi, ui)
        return self._gflat[i][start:start + n]

    def grad_stats(self, scale: float) -> tuple[float, bool]:
        return torch_grad_stats(self._gflat, scale)

    def grad_rows(self, create: tuple | None = None) -> list:
        return [self.layout.views(g, i) for i, g in enumerate(self._gflat)]

    def gather(self) -> None:
        pass  # the store split's reducer put the gradients in place

    def apply(self, factor: float) -> None:
        # Called again after the CPU half raised: the phases that ran are not repeated. On the
        # trace: the GPU's own time for its half (a CUDA span on the compute stream).
        with getattr(self.trace, _SPANS.get(self.sm.device.type, "span"))("gpu half: AdamW and new weights"):
            self._steps.run(self.optimizer, factor)
            self._publish()
        self._steps.reset()

    def _publish(self) -> None:
        """The new weights into the shards (queued on the current stream) and to the model."""
        sm = self.sm
        with torch.no_grad():
            for flat, gi, k in zip(self._flat, self.gis, self.ks):
                for ui in range(k):  # unit by unit: the training dtype's copy is one unit at a time
                    start, n = sm.local_range(gi, ui)
                    sm.publish_shard(gi, ui, flat[start:start + n].to(sm.dtype))
        self._written = self._streams.mark_current()

    def flush(self) -> None:
        """What reads the shards on the host (a checkpoint) comes after the copies into them."""
        ev, self._written = self._written, None
        if ev is not None:
            ev.synchronize()

    def abandon_step(self) -> None:
        self._steps.reset()

    def release(self) -> None:
        self._steps.reset()

    def zero_grad(self) -> None:
        pass  # the model's gradients are the store split's

    def masters(self) -> list:
        return self._views

    def load_masters(self, masters: list) -> None:
        copy_masters(self._views, masters)
        self._publish()

    def entry_states(self, saved: bool = False) -> list:
        """Per group of the half, per entry: its Adam state in CPUAdam's format (an int step,
        fp32 moments in host memory), or None before the first step. ``saved``: as a save
        writes them, each entry's moments copied to host memory when the writer reaches them."""
        out = []
        for i, f in enumerate(self._flat):
            st = self.optimizer.state.get(f)
            if not st:
                out.append([None] * len(self._views[i]))
                continue
            step = st["step"]
            step = int(step.item()) if torch.is_tensor(step) else int(step)
            if saved:
                m, v = (self.layout.views(st[k].detach(), i) for k in ("exp_avg", "exp_avg_sq"))
                m, v = ([Deferred(torch.float32, t.shape, lambda t=t: t.to("cpu", torch.float32, copy=True))
                         for t in row] for row in (m, v))
            else:
                m = self.layout.views(st["exp_avg"].detach().to("cpu", torch.float32), i)
                v = self.layout.views(st["exp_avg_sq"].detach().to("cpu", torch.float32), i)
            out.append([{"step": step, "exp_avg": a, "exp_avg_sq": b} for a, b in zip(m, v)])
        return out

    def load_entry_states(self, rows: list) -> None:
        """The inverse of :meth:`entry_states` (each state in any of Adam's state dtypes; a group
        whose entries have no state starts fresh)."""
        state = {}
        for i, (row, f) in enumerate(zip(rows, self._flat)):
            if all(st is None for st in row):
                continue
            m = torch.zeros_like(f)
            v = torch.zeros_like(f)
            steps = set()
            for st, mv, vv, n in zip(row, self.layout.views(m, i), self.layout.views(v, i), self.layout.numels[i]):
                if st is None:
                    continue
                st = convert_adam_state(st, "fp32", n, (n,))
                mv.copy_(real(st["exp_avg"]).reshape(-1))
                vv.copy_(real(st["exp_avg_sq"]).reshape(-1))
                steps.add(int(st["step"].item()) if torch.is_tensor(st["step"]) else int(st["step"]))
            if len(steps) != 1:
                raise ValueError(f"the pieces of a parameter group have different Adam steps ({sorted(steps)}); "
                                 f"the GPU's share steps the group as one tensor")
            state[i] = {"step": torch.tensor(float(steps.pop()), dtype=torch.float32), "exp_avg": m,
                        "exp_avg_sq": v}
        sd = self.optimizer.state_dict()
        sd["state"] = state
        self.optimizer.load_state_dict(sd)


class _Given:
    """HostShare's gradient source: the store split's reducer fills the buffers; nothing to do."""

    def __init__(self, grads: list):
        self.grads = grads

    def before_backward(self, boundary: bool) -> None:
        pass

    def after_backward(self) -> None:
        pass

    def gather(self) -> list:
        return self.grads

    def grad_stats(self, grads: list, scale: float, host_stats) -> tuple[float, bool]:
        return host_stats([g for row in grads for g in row], scale)

    def reset(self) -> None:
        pass


class HostShare(ShardGrads, HostBuffers):
    """A host tier's buffers: units [lo, hi) of each group in ``gis`` (``spans``: the (lo, hi) of
    each). Gradients arrive from the store split's reducer; new weights are published unit by
    unit through the store (dp.ShardedBuffers does the same for a whole local space); with
    ``grads_in`` the gradients land in the shards (dp.ShardGrads)."""

    def __init__(self, sm: ParamStore, layout: FlatLayout, gis: list, spans: list, pin_memory: bool,
                 donor: "HostShare | None" = None, grads_in: GradsInShards | None = None):
        self.sm, self.gis, self.spans = sm, gis, spans
        # The gradients in the store's shards (store.GradsInShards): the tier's gradient buffers
        # are views of the shards.
        self.grads_in = grads_in
        self._base = [_end(sm.plan.groups[gi], lo) for gi, (lo, _) in zip(gis, spans)]
        self._size = [_end(sm.plan.groups[gi], hi) - b for gi, (_, hi), b in zip(gis, spans, self._base)]
        # A shrunk CPU half (StoreSplitPath.resize to a smaller CPU share) takes over the buffers
        # of the half it replaces: each of its alloc() calls gets the tail of that half's buffers
        # of the same call, so nothing is copied and no host memory is added.
        self._donor, self._calls = donor, 0
        self.prefilled = donor is not None
        super().__init__(layout, sm.device, sm.dtype, pin_memory)
        if donor is not None:  # the page-locked registrations move with the buffers
            ptrs, self._pinned_any = donor.hand_over_pins()
            self._pinned_ptrs.extend(ptrs)

    def _shard_spans(self) -> list:
        return list(zip(self.gis, self._base, self._size))

    def alloc(self, dtype: torch.dtype, zero: bool = True) -> tuple[list, list]:
        d = self._donor
        if d is None:
            flats, views = super().alloc(dtype)
            for t in flats if zero else ():
                t.zero_()  # the padding of the local space stays zero (unless the caller writes it all)
            return flats, views
        call, self._calls = self._calls, self._calls + 1
        flats = [d.tail_of(call, gi, self._base[i], self._size[i], dtype) for i, gi in enumerate(self.gis)]
        self._flats.extend(flats)
        return flats, [self.layout.views(f, i) for i, f in enumerate(flats)]

    def hand_over_pins(self) -> tuple[list, bool]:
        """(the page-locked registrations of this half's buffers, whether any is pinned), for the
        half that takes the buffers over; this half then unregisters nothing."""
        ptrs = list(self._pinned_ptrs)
        self._pinned_ptrs.clear()
        return ptrs, self._pinned_any

    def tail_of(self, call: int, gi: int, base: int, size: int, dtype: torch.dtype) -> torch.Tensor:
        """The part [base, base + size) of group gi's buffer that this half's alloc() call number
        ``call`` made (a shrunk half's share of it)."""
        j = self.gis.index(gi)
        src = self._flats[call * len(self.gis) + j]
        if src.dtype != dtype:
            raise AssertionError(f"a shrunk CPU half's buffer {call} is {src.dtype}, not {dtype}")
        at = base - self._base[j]
        return src[at:at + size]

    def _gradient_source(self):
        return _Given(self.grads)

    def unit_dest(self, i: int, gi: int, ui: int) -> torch.Tensor:
        start, n = self.sm.local_range(gi, ui)
        return self.flat_grads[i][start - self._base[i]:start - self._base[i] + n]

    def entry_units(self) -> list:
        units = self.sm.entry_units()
        return [[(gi, ui) for ui in units[gi] if lo <= ui < hi] for gi, (lo, hi) in zip(self.gis, self.spans)]

    def release(self) -> None:
        self._release_shard_grads()  # (the store split drops the model's gradients and resets the reducer)

    def _new(self, bases: list | None, i: int, gi: int, ui: int) -> torch.Tensor:
        """Unit ui's new shard: in ``bases`` (the path's weight buffers), or in the shard itself
        when the path writes the shards' own storage."""
        if bases is None:
            return self.sm.shard(gi, ui)
        start, n = self.sm.local_range(gi, ui)
        return bases[i][start - self._base[i]:start - self._base[i] + n]

    # write_back / gather_unit / end_write_back: ShardGrads', unit by unit through these
    def _publish(self, i: int, gi: int, ui: int, bases: list | None, group=None) -> None:
        self.sm.publish_shard(gi, ui, self._new(bases, i, gi, ui), group)



def _host_half(layout: FlatLayout, buffers: HostShare, a: dict) -> HostPath:
    return HostPath(layout, buffers, a["name"], a["params"], client=None, force_native=a["force_native"],
                    chunk_elems=a["chunk_elems"], num_threads=a["num_threads"], timing=a["timing"])


def _nvme_half(layout: FlatLayout, buffers: HostShare, a: dict):
    return NVMePath(layout, buffers, a["name"], a["params"], client=None, **a["nvme"])


# The non-GPU share's tier (RunPlan.cpu_tier): host memory, or NVMe (masters and state in swap
# files); per tier its path class (what it holds where: bytes_needed) and its builder.
_TIERS = {"host": (HostPath, _host_half), "nvme": (NVMePath, _nvme_half)}
_SIDES = ("dev", "cpu", "disk")  # the halves in the local space's order


class StoreSplitPath(TwoHalves):
    """The split over a store's local space (see the module docstring)."""

    @classmethod
    def bytes_needed(cls, plan, config, s) -> list:
        """TwoHalves' and the GPU share's fp32 gradient buffer, which stays allocated (the
        reducer lands its units there)."""
        return super().bytes_needed(plan, config, s) + [
            Need("gpu", "fp32 gradients of the GPU's share", 4 * cls.gpu_elems(s))]

    @staticmethod
    def _cpu_tier(plan) -> type:
        return _TIERS[plan.cpu_tier][0]

    def __init__(self, sm: ParamStore, name: str, params: dict, ratio: float, *, stage: int, reduce_overlap: bool,
                 comm: Collectives, comm_dtype: torch.dtype, pin_memory: bool, force_native: bool,
                 chunk_elems: int, num_threads: int | None, timing: str = "sync", auto: AutoSplit | None = None,
                 tier: str = "host", nvme: dict | None = None, host_elems: int = 0, grads_in_shards: bool = False):
        super().__init__(sm.local_layout, dict(dtype=sm.dtype, name=name, params=params, pin_memory=pin_memory,
                                               force_native=force_native, chunk_elems=chunk_elems,
                                               num_threads=num_threads, timing=timing, tier=tier, nvme=nvme,
                                               host_elems=int(host_elems)), auto)
        self.sm = sm
        self.comm = comm
        self._edited = False  # the tensor-fragment API wrote gradients (the reducer's norms are stale)
        self.reducer = GradReducer(sm, None, stage=stage, overlap=reduce_overlap, comm=comm, comm_dtype=comm_dtype)
        self.reducer.dest_of = self._dest_of
        # plan.grads_in_shards: the units off the GPU (host memory's and NVMe's) get their
        # gradients in their shards
        self.grads_in = None
        if grads_in_shards:
            self.grads_in = sm.grads_in = GradsInShards(sm)
            self.reducer.landed = self._landed
        self._build(ratio)
        self.optimizer = self._optimizer(sm.layout.groups)

    @property
    def sharded(self) -> ParamStore:
        return self.sm

    @property
    def pinned(self) -> bool:
        return any(h.pinned for h in (self.cpu, self.disk) if h is not None)

    def set_trace(self, tracer) -> None:
        super().set_trace(tracer)
        self.reducer.trace = tracer

    def _build(self, ratio: float) -> None:
        self._build_halves(tier_units(self.sm, ratio, self._args["host_elems"]))

    def _carve(self, cuts: list) -> dict:
        """The layouts of the halves for the unit cuts ``cuts`` (per group (k1, k2): units [0, k1)
        on the GPU, [k1, k2) on the CPU's tier, [k2, end) on the disk): per half ("dev", "cpu",
        "disk") its groups and the (store group, (first unit, end unit)) of each; sets the maps
        between the halves and the path's layout."""
        sm, layout = self.sm, self.layout
        units = sm.entry_units()
        out = {side: ([], []) for side in _SIDES}
        self._gmap, self._bounds, self._side_of = [], [], []
        for gi, (g, entries, (k1, k2)) in enumerate(zip(layout.groups, layout.params, cuts)):
            c1 = sum(1 for ui in units[gi] if ui < k1)  # entries of the GPU's units come first, ...
            c2 = sum(1 for ui in units[gi] if ui < k2)  # ... then the CPU tier's, then the disk's
            bounds = (0, c1, c2, len(entries))
            spans = ((0, k1), (k1, k2), (k2, len(sm.plan.groups[gi].units)))
            idx, side_of = [], []
            for t, side in enumerate(_SIDES):
                a, b = bounds[t], bounds[t + 1]
                groups, at = out[side]
                idx.append(len(groups) if a < b else None)
                if a < b:
                    groups.append({**g, "params": entries[a:b]})
                    at.append((gi, spans[t]))
                side_of += [(side, idx[-1])] * (b - a)
            self._bounds.append(bounds)  # where each half's entries of the group begin and end
            self._gmap.append(tuple(idx))
            self._side_of.append(side_of)
        self._ks = cuts
        ends = [(_end(sm.plan.groups[gi], k1), _end(sm.plan.groups[gi], k2)) for gi, (k1, k2) in enumerate(cuts)]
        self.gpu_elems = sum(e1 for e1, _ in ends)
        # With three tiers: the elements of the CPU's tier (host memory), the rest of the share on NVMe.
        self.kept_in_cpu = sum(e2 - e1 for e1, e2 in ends) if self._args["host_elems"] else 0
        total = sum(layout.totals)
        self.cpu_share = 1.0 - self.gpu_elems / total if total else 1.0
        return out

    def _build_halves(self, cuts: list, donor: HostShare | None = None) -> None:
        a, sm = self._args, self.sm
        carved = self._carve(cuts)
        dev_groups, dev_at = carved["dev"]
        self.dev = DeviceShare(sm, FlatLayout(dev_groups), [gi for gi, _ in dev_at], [k for _, (_, k) in dev_at],
                               a["name"], a["params"]) if dev_groups else None
        self.cpu = self.disk = self.buffers = self.disk_buffers = None
        # With part of an NVMe share in host memory (max_in_cpu), the CPU's tier is host memory and
        # the disk's the swap files; otherwise the CPU's tier is the configured one.
        kinds = {"cpu": _host_half if a["host_elems"] else _TIERS[a["tier"]][1], "disk": _nvme_half}
        for side in ("cpu", "disk"):
            groups, at = carved[side]
            if not groups:
                continue
            cl = FlatLayout(groups)
            buf = HostShare(sm, cl, [gi for gi, _ in at], [span for _, span in at], a["pin_memory"],
                            donor=donor if side == "cpu" else None,
                            grads_in=self.grads_in)
            setattr(self, {"cpu": "buffers", "disk": "disk_buffers"}[side], buf)
            setattr(self, side, kinds[side](cl, buf, a))
        self._finish_build()

    # -- "auto": a smaller CPU share without new host memory ------------------------------------
    def _shrinks(self, ratio: float) -> bool:
        """Whether ``ratio`` only moves units from the CPU half (in host memory) to the GPU's (what
        "auto" does)."""
        return self.cpu is not None and self.disk is None and self._args["tier"] == "host" and \
            all(k >= k0 for k, (k0, _) in zip(gpu_units(self.sm, ratio), self._ks))

    def resize_host_bytes(self, ratio: float) -> int:
        """A shrink adds no host buffer (the new CPU half takes over the old one's): only each
        moving piece's fp32 moments pass through host memory, one piece at a time."""
        if not self._shrinks(ratio):
            return super().resize_host_bytes(ratio)
        return 12 * max((n for row in self.layout.numels for n in row), default=0)

    def resize(self, ratio: float) -> None:
        """TwoHalves.resize, and for a smaller CPU share (the move "auto" makes) without new host
        memory: the units moving to the GPU go there piece by piece (their fp32 masters and
        moments, converted from the CPU's state dtype), and the new CPU half takes over the old
        one's buffers (their tails) and its optimizer states (the same tensors)."""
        if not self._shrinks(ratio):
            super().resize(ratio)
            return
        self.flush()
        masters = self.masters()                     # views: the old halves' own tensors
        dev_states = self.dev.entry_states() if self.dev is not None else []
        old_cpu, old_buf, old_dev = self.cpu, self.buffers, self.dev
        old_gmap, old_bounds = self._gmap, self._bounds
        cpu_state = old_cpu.optimizer.state
        for module, handles in self._hooked:
            for h in handles:
                h.remove()
        self._build_halves(tier_units(self.sm, ratio), donor=old_buf)
        self._each("set_trace", self.trace)
        self._hooked = [(m, self.cpu.hook_modules(m) if self.cpu is not None else []) for m, _ in self._hooked]
        host_masters = [list(g["params"]) for g in old_cpu.optimizer.param_groups]
        if self.dev is not None:  # every piece the GPU now steps: from the old GPU half or the old CPU half
            rows, srows = [], []
            for gi, (di, _ci, _ni) in enumerate(self._gmap):
                if di is None:
                    continue
                odi, oci, _ = old_gmap[gi]
                ocut, cut = old_bounds[gi][1], self._bounds[gi][1]
                rows.append(masters[gi][:cut])
                srow = []
                for ei in range(cut):
                    if ei < ocut:
                        srow.append(dev_states[odi][ei])
                    else:
                        srow.append(cpu_state.get(host_masters[oci][ei - ocut]))
                srows.append(srow)
            self.dev.load_masters(rows)
            self.dev.load_entry_states(srows)
        if self.cpu is not None:  # the remaining pieces' states move to the new CPU half as they are
            new_state = self.cpu.optimizer.state
            new_params = [list(g["params"]) for g in self.cpu.optimizer.param_groups]
            for gi, (_di, ci, _ni) in enumerate(self._gmap):
                if ci is None:
                    continue
                oci, shift = old_gmap[gi][1], self._bounds[gi][1] - old_bounds[gi][1]
                for ei, p in enumerate(new_params[ci]):
                    st = cpu_state.get(host_masters[oci][ei + shift])
                    if st is not None:
                        new_state[p] = st
        del masters, dev_states, cpu_state
        for h in (old_dev, old_cpu):
            if h is not None:
                h.close()

    def _landed(self, gi: int, ui: int) -> None:
        """A unit's summed shard goes to its destination: the CPU's units' is their shard."""
        if ui >= self._ks[gi][0]:
            self.grads_in.land(gi, ui)

    def _dest_of(self, gi: int, ui: int) -> torch.Tensor:
        di, ci, ni = self._gmap[gi]
        k1, k2 = self._ks[gi]
        if ui < k1:
            return self.dev.unit_dest(di, gi, ui)
        if ui < k2:
            return self.buffers.unit_dest(ci, gi, ui)
        return self.disk_buffers.unit_dest(ni, gi, ui)

    def _agree(self, ratio: float) -> float:
        """Every rank takes the largest CPU share any rank chose (the one whose GPU has least
        room), so that all split the same units."""
        return max(float(r) for r in self.comm.all_gather_object(float(ratio)))

    def _sides(self) -> list:
        return [s for row in self._side_of for s in row]

    def _offloaded(self) -> list:
        """The halves off the GPU, in the local space's order."""
        return [h for h in (self.cpu, self.disk) if h is not None]

    # -- the step -----------------------------------------------------------------------------
    def before_backward(self, boundary: bool) -> None:
        for h in self._offloaded():  # an overlapped CPU step finishes before its gradient buffers refill
            h.before_backward(boundary)
        self.reducer.before_backward(boundary)

    def after_backward(self) -> None:
        self.reducer.after_backward()

    def gather(self) -> None:
        self.reducer.gather()
        for h in self._offloaded():
            h.gather()

    def grad_stats(self, scale: float) -> tuple[float, bool]:
        """Over every half at once: the reducer's norms on the GPU, or each half's on the host."""
        if self.reducer.device_norms and not self._edited:
            return norms_stats(self.reducer.local_norms(), scale)
        total, bad = 0.0, False
        if self.dev is not None:
            total, bad = self.dev.grad_stats(scale)
        for h in self._offloaded():
            s, b = h.host_grad_stats(scale)
            total, bad = total + s, bad or b
        return total, bad

    def apply(self, factor: float) -> None:
        self.sm.mark_stale()  # ZeRO-3: what is gathered now holds the old weights
        super().apply(factor)

    def release(self) -> None:
        self._done = set()
        self._edited = False
        self._each("release")
        self.reducer.reset()
        self.zero_grad()

    def grad_rows(self, create: tuple | None = None) -> list:
        got = [h.grad_rows() if h is not None else None for h in (self.dev, self.cpu, self.disk)]
        return [[g for rows, i in zip(got, idx) if i is not None for g in rows[i]] for idx in self._gmap]

    def grads_edited(self) -> None:
        self._edited = True
        self._each("grads_edited")

    def zero_grad(self) -> None:
        self.sm.drop_grads()

    # -- masters and state, per entry of the local space --------------------------------------
    def masters(self) -> list:
        return self._join([h.masters() if h is not None else None for h in (self.dev, self.cpu, self.disk)])

    def saved_masters(self) -> list:
        return self._join([h.saved_masters() if h is not None else None for h in (self.dev, self.cpu, self.disk)])

    def saved_state(self) -> dict:
        return self.export_states(saved=True)

    def _join(self, got: list) -> list:
        """Per group of the layout, per entry: the halves' rows (``got``: dev's, cpu's, disk's) in order."""
        return [[m for rows, i in zip(got, idx) if i is not None for m in rows[i]] for idx in self._gmap]

    def _rows_of(self, per_entry: list) -> list:
        """Per half (dev, cpu, disk), the rows of ``per_entry`` (per group of the layout, per
        entry) that half holds, in its groups' order."""
        out = [[], [], []]
        for row, idx, bounds in zip(per_entry, self._gmap, self._bounds):
            for t in range(len(_SIDES)):
                if idx[t] is not None:
                    out[t].append(row[bounds[t]:bounds[t + 1]])
        return out

    def _first(self, gi: int, side: str) -> int:
        """The index in group gi of the first entry the half ``side`` holds."""
        return self._bounds[gi][_SIDES.index(side)]

    def load_masters(self, masters: list) -> None:
        for h, rows in zip((self.dev, self.cpu, self.disk), self._rows_of(masters)):
            if h is not None:
                h.load_masters(rows)

    takes_deferred = True  # each half's share: read as it goes, or first where the half cannot

    def check_states(self, state: dict) -> None:
        """ValueError for a torch-style ``state`` :meth:`import_states` would refuse (the halves'
        own checks, on each entry as it is converted to its half's state dtype: dtypes and
        shapes only, nothing is read or written)."""
        targets = self.state_dtypes()
        subs = {side: {} for side, h in (("cpu", self.cpu), ("disk", self.disk)) if h is not None}
        starts = {side: self._sub_index(side) for side in subs}
        idx = 0
        for gi, side_of in enumerate(self._side_of):
            numels = self.layout.numels[gi]
            for ei, (side, sg) in enumerate(side_of):
                st = state.get(idx)
                if side != "dev" and st is not None:
                    if "exp_avg" in st:
                        st = converted_like(st, targets[idx], numels[ei])
                    subs[side][starts[side][sg] + ei - self._first(gi, side)] = st
                idx += 1
        for side, sub in subs.items():
            check = getattr(self._half(side).optimizer, "validate_state_dict", None)
            if check is not None:
                check({"state": sub, "param_groups": indexed_groups(self._half(side).optimizer.param_groups)})

    def export_states(self, saved: bool = False) -> dict:
        """entry index (running over the local space) -> its state in CPUAdam's format (``saved``:
        the halves' as a save writes them, Deferred where they live in swap files)."""
        dev = self.dev.entry_states(saved) if self.dev is not None else None
        subs = {side: h.saved_state() if saved else h.optimizer.state_dict()["state"]
                for side, h in (("cpu", self.cpu), ("disk", self.disk)) if h is not None}
        starts = {side: self._sub_index(side) for side in subs}
        out, idx = {}, 0
        for gi, side_of in enumerate(self._side_of):
            for ei, (side, sg) in enumerate(side_of):
                if side == "dev":
                    st = dev[sg][ei]
                else:
                    st = subs[side].get(starts[side][sg] + ei - self._first(gi, side))
                    if st is not None:
                        st = {k: (int(v.item()) if k == "step" and torch.is_tensor(v) else v) for k, v in st.items()}
                if st is not None:
                    out[idx] = st
                idx += 1
        return out

    def import_states(self, state: dict) -> None:
        """The inverse of :meth:`export_states`: each entry's state converted to its half's dtype."""
        targets = self.state_dtypes()
        subs = {side: {} for side, h in (("cpu", self.cpu), ("disk", self.disk)) if h is not None}
        starts = {side: self._sub_index(side) for side in subs}
        per_entry, idx = [], 0
        for gi, side_of in enumerate(self._side_of):
            numels, row = self.layout.numels[gi], []
            for ei, (side, sg) in enumerate(side_of):
                st = state.get(idx)
                if st is not None and "exp_avg" in st:
                    st = convert_adam_state(st, targets[idx], numels[ei], (numels[ei],))
                row.append(st)
                if side != "dev" and st is not None:
                    subs[side][starts[side][sg] + ei - self._first(gi, side)] = st
                idx += 1
            per_entry.append(row)
        if self.dev is not None:
            self.dev.load_entry_states(self._rows_of(per_entry)[0])  # (reads Deferred ones as it goes)
        for side, sub in subs.items():
            h = self._half(side)
            sub = sub if h.takes_deferred else materialized(sub)
            h.optimizer.load_state_dict({"state": sub, "param_groups": indexed_groups(h.optimizer.param_groups)})
