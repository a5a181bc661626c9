"""The GPU/CPU optimizer split over a parameter store's local space (``offload_optimizer.ratio``
< 1 or ``"auto"`` at ZeRO-3 on any number of ranks, and at stages 1-2 on several).

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

One gradient reducer (dp.GradReducer) serves both: it lands each unit's summed shard on its
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

from .collectives import Collectives
from .cpu import HostPath
from .dp import GradReducer, ShardedBuffers, phased_step
from .layout import FlatLayout
from .memory import Need
from .offload import HostBuffers
from .optimizers import build_device_optimizer, convert_adam_state, norms_stats, torch_grad_stats
from .paths import OptimizerPath, copy_masters, indexed_groups
from .split import AutoSplit, TwoHalves
from .store import ParamStore, flat_base
from .streams import streams_for

log = logging.getLogger("zspeed.split")

__all__ = ["StoreSplitPath", "DeviceShare", "HostShare", "gpu_units"]


def gpu_units(sm: ParamStore, ratio: float) -> list:
    """Per group, how many of its first units the GPU steps for a CPU share of ``ratio`` (of this
    rank's local elements, as near as whole units allow): a prefix in (group, unit) order."""
    groups = sm.plan.groups
    total = sum(u.shard for gp in groups for u in gp.units)
    left = (1.0 - float(ratio)) * total
    out = []
    for gp in groups:
        k = 0
        for u in gp.units:
            if left <= 0 or left < u.shard / 2:
                left = 0  # the GPU's share ends here: the rest of the model is the CPU's
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
        self._phase = 0  # of the step under way: 1 gradients scaled, 2 stepped (see apply)
        self._streams = streams_for(dev)
        self._written = None  # CUDA event after the copies of the new weights into host shards

    def unit_dest(self, i: int, gi: int, ui: int) -> torch.Tensor:
        """Where the reducer puts unit ui's summed shard: its range of the fp32 gradient buffer."""
        start, n = self.sm.local_range(gi, ui)
        return self._gflat[i][start:start + n]

    def grad_stats(self, scale: float) -> tuple[float, bool]:
        return torch_grad_stats(self._gflat, scale)

    def gather(self) -> None:
        pass  # the store split's reducer put the gradients in place

    def apply(self, factor: float) -> None:
        # Called again after the CPU half raised: the phases that ran are not repeated. On the
        # trace: the GPU's own time for its half (a CUDA span on the compute stream).
        with getattr(self.trace, _SPANS.get(self.sm.device.type, "span"))("gpu half: AdamW and new weights"):
            phased_step(self, factor)
            self._publish()
        self._phase = 0

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
        self._phase = 0

    def release(self) -> None:
        self._phase = 0

    def zero_grad(self) -> None:
        pass  # the model's gradients are the store split's

    def masters(self) -> list:
        return self._views

    def load_masters(self, masters: list) -> None:
        copy_masters(self._views, masters)
        self._publish()

    def entry_states(self) -> list:
        """Per group of the half, per entry: its Adam state in CPUAdam's format (an int step,
        fp32 moments in host memory), or None before the first step."""
        out = []
        for i, f in enumerate(self._flat):
            st = self.optimizer.state.get(f)
            if not st:
                out.append([None] * len(self._views[i]))
                continue
            step = st["step"]
            step = int(step.item()) if torch.is_tensor(step) else int(step)
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
                mv.copy_(st["exp_avg"].reshape(-1))
                vv.copy_(st["exp_avg_sq"].reshape(-1))
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


class HostShare(HostBuffers):
    """The CPU half's host buffers: units [k, end) of each group in ``gis`` (``ks``). Gradients
    arrive from the store split's reducer; new weights are published unit by unit through the
    store (dp.ShardedBuffers does the same for a whole local space)."""

    def __init__(self, sm: ParamStore, layout: FlatLayout, gis: list, ks: list, pin_memory: bool,
                 donor: "HostShare | None" = None):
        self.sm, self.gis, self.ks = sm, gis, ks
        self._base = [_end(sm.plan.groups[gi], k) for gi, k in zip(gis, ks)]
        self._pending_src = None
        self._bases_of = None  # (weight views, their flat buffers) of the last publish
        # A shrunk CPU half (StoreSplitPath.resize to a smaller CPU share) takes over the buffers
        # of the half it replaces: each of its alloc() calls gets the tail of that half's buffers
        # of the same call, so nothing is copied and no host memory is added.
        self._donor, self._calls = donor, 0
        self.prefilled = donor is not None
        super().__init__(layout, sm.device, sm.dtype, pin_memory, 0, flat_grads=True)
        if donor is not None:  # the page-locked registrations move with the buffers
            self._pinned_ptrs.extend(donor._pinned_ptrs)
            donor._pinned_ptrs.clear()
            self._pinned_any = donor._pinned_any

    def alloc(self, dtype: torch.dtype) -> tuple[list, list]:
        d = self._donor
        if d is None:
            flats, views = super().alloc(dtype)
            for t in flats:
                t.zero_()  # the padding of the local space stays zero
            return flats, views
        call, self._calls = self._calls, self._calls + 1
        row = d._flats[call * len(d.gis):(call + 1) * len(d.gis)]
        flats = []
        for i, gi in enumerate(self.gis):
            j = d.gis.index(gi)
            src = row[j]
            if src.dtype != dtype:
                raise AssertionError(f"a shrunk CPU half's buffer {call} is {src.dtype}, not {dtype}")
            flats.append(src[self._base[i] - d._base[j]:])
        self._flats.extend(flats)
        return flats, [self.layout.views(f, i) for i, f in enumerate(flats)]

    def _gradient_source(self, bucket_elems: int):
        return _Given(self.grads)

    def unit_dest(self, i: int, gi: int, ui: int) -> torch.Tensor:
        start, n = self.sm.local_range(gi, ui)
        return self.flat_grads[i][start - self._base[i]:start - self._base[i] + n]

    def entry_units(self) -> list:
        units = self.sm.entry_units()
        return [[(gi, ui) for ui in units[gi] if ui >= k] for gi, k in zip(self.gis, self.ks)]

    def release(self) -> None:
        pass  # the store split drops the model's gradients and resets the reducer

    def _bases(self, src: list | None) -> list | None:
        """Per group, the flat buffer the path's weight views ``src`` are views of (None where the
        path writes the shards' own storage), found once per set of views."""
        if src is None:
            return None
        if self._bases_of is None or self._bases_of[0] is not src:
            self._bases_of = (src, flat_base(src, self._flats))
        return self._bases_of[1]

    def _new(self, bases: list | None, i: int, gi: int, ui: int) -> torch.Tensor:
        """Unit ui's new shard: in ``bases`` (the path's weight buffers), or in the shard itself
        when the path writes the shards' own storage."""
        if bases is None:
            return self.sm.shard(gi, ui)
        start, n = self.sm.local_range(gi, ui)
        return bases[i][start - self._base[i]:start - self._base[i] + n]

    def write_back(self, src: list, keys: list) -> None:
        self._pending_src = src

    def gather_unit(self, gi: int, ui: int, src: list, group) -> None:
        self.sm.publish_shard(gi, ui, self._new(self._bases(src), self.gis.index(gi), gi, ui), group)

    def end_write_back(self) -> None:
        src, self._pending_src = self._pending_src, None
        bases = self._bases(src)
        for i, (gi, k) in enumerate(zip(self.gis, self.ks)):
            for ui in range(k, len(self.sm.plan.groups[gi].units)):
                self.sm.publish_shard(gi, ui, self._new(bases, i, gi, ui))
        super().end_write_back()

    # After a load replaced the masters: the shards, the weight buffers and the model follow
    # (the same steps as a whole local space's).
    refresh = ShardedBuffers.refresh


def _host_half(layout: FlatLayout, buffers: HostShare, a: dict) -> HostPath:
    return HostPath(layout, buffers, a["name"], a["params"], client=None, force_native=a["force_native"],
                    chunk_elems=a["chunk_elems"], num_threads=a["num_threads"], timing=a["timing"])


def _nvme_half(layout: FlatLayout, buffers: HostShare, a: dict):
    from .nvme import NVMePath
    return NVMePath(layout, buffers, a["name"], a["params"], client=None, **a["nvme"])


# The non-GPU share's tier (RunPlan.cpu_tier): host memory, or NVMe (masters and state in swap files).
_TIERS = {"host": _host_half, "nvme": _nvme_half}


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
        from .nvme import NVMePath
        return {"host": HostPath, "nvme": NVMePath}[plan.cpu_tier]

    def __init__(self, sm: ParamStore, name: str, params: dict, ratio: float, *, stage: int, reduce_overlap: bool,
                 comm: Collectives, comm_dtype: torch.dtype, pin_memory: bool, force_native: bool,
                 chunk_elems: int, num_threads: int | None, timing: str = "sync", auto: AutoSplit | None = None,
                 tier: str = "host", nvme: dict | None = None):
        super().__init__(sm.local_layout, dict(dtype=sm.dtype, name=name, params=params, pin_memory=pin_memory,
                                               force_native=force_native, chunk_elems=chunk_elems,
                                               num_threads=num_threads, timing=timing, tier=tier, nvme=nvme), auto)
        self.sm = sm
        self.comm = comm
        self.reducer = GradReducer(sm, None, stage=stage, overlap=reduce_overlap, comm=comm, comm_dtype=comm_dtype)
        self.reducer.dest_of = self._dest_of
        self._build(ratio)
        self.optimizer = self._optimizer(sm.layout.groups)

    @property
    def sharded(self) -> ParamStore:
        return self.sm

    def _build(self, ratio: float) -> None:
        self._build_halves(gpu_units(self.sm, ratio))

    def _carve(self, ks: list) -> tuple:
        """The layouts of both halves for GPU unit counts ``ks``: (GPU groups, CPU groups, and
        per half the (store group, k) of each of its groups); sets the maps between them."""
        sm, layout = self.sm, self.layout
        units = sm.entry_units()
        dev_groups, cpu_groups, dev_at, cpu_at = [], [], [], []
        self._gmap, self._cut, self._side_of = [], [], []
        for gi, (g, entries, k) in enumerate(zip(layout.groups, layout.params, ks)):
            cut = sum(1 for ui in units[gi] if ui < k)  # entries of the GPU's units come first
            self._cut.append(cut)
            di = ci = None
            if cut:
                di = len(dev_groups)
                dev_groups.append({**g, "params": entries[:cut]})
                dev_at.append((gi, k))
            if cut < len(entries):
                ci = len(cpu_groups)
                cpu_groups.append({**g, "params": entries[cut:]})
                cpu_at.append((gi, k))
            self._gmap.append((di, ci))
            self._side_of.append([("dev", di)] * cut + [("cpu", ci)] * (len(entries) - cut))
        self._ks = ks
        self.gpu_elems = sum(_end(sm.plan.groups[gi], k) for gi, k in dev_at)
        total = sum(layout.totals)
        self.cpu_share = 1.0 - self.gpu_elems / total if total else 1.0
        return dev_groups, cpu_groups, dev_at, cpu_at

    def _build_halves(self, ks: list, donor: HostShare | None = None) -> None:
        a, sm = self._args, self.sm
        dev_groups, cpu_groups, dev_at, cpu_at = self._carve(ks)
        self.dev = DeviceShare(sm, FlatLayout(dev_groups), [gi for gi, _ in dev_at], [k for _, k in dev_at],
                               a["name"], a["params"]) if dev_groups else None
        self.cpu = self.buffers = None
        if cpu_groups:
            cl = FlatLayout(cpu_groups)
            self.buffers = HostShare(sm, cl, [gi for gi, _ in cpu_at], [k for _, k in cpu_at], a["pin_memory"],
                                     donor=donor)
            self.cpu = _TIERS[a["tier"]](cl, self.buffers, a)
        self._finish_build()

    # -- "auto": a smaller CPU share without new host memory ------------------------------------
    def _shrinks(self, ratio: float) -> bool:
        """Whether ``ratio`` only moves units from the CPU half (in host memory) to the GPU's (what
        "auto" does)."""
        return self.cpu is not None and self._args["tier"] == "host" and \
            all(k >= k0 for k, k0 in zip(gpu_units(self.sm, ratio), self._ks))

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
        old_gmap, old_cut = self._gmap, self._cut
        cpu_state = old_cpu.optimizer.state
        for module, handles in self._hooked:
            for h in handles:
                h.remove()
        self._build_halves(gpu_units(self.sm, ratio), donor=old_buf)
        self._each("set_trace", self.trace)
        self._hooked = [(m, self.cpu.hook_modules(m) if self.cpu is not None else []) for m, _ in self._hooked]
        host_masters = [list(g["params"]) for g in old_cpu.optimizer.param_groups]
        if self.dev is not None:  # every piece the GPU now steps: from the old GPU half or the old CPU half
            rows, srows = [], []
            for gi, (di, _ci) in enumerate(self._gmap):
                if di is None:
                    continue
                odi, oci = old_gmap[gi]
                ocut = old_cut[gi]
                rows.append(masters[gi][:self._cut[gi]])
                srow = []
                for ei in range(self._cut[gi]):
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
            for gi, (_di, ci) in enumerate(self._gmap):
                if ci is None:
                    continue
                oci, shift = old_gmap[gi][1], self._cut[gi] - old_cut[gi]
                for ei, p in enumerate(new_params[ci]):
                    st = cpu_state.get(host_masters[oci][ei + shift])
                    if st is not None:
                        new_state[p] = st
        del masters, dev_states, cpu_state
        for h in (old_dev, old_cpu):
            if h is not None:
                h.close()

    def _dest_of(self, gi: int, ui: int) -> torch.Tensor:
        di, ci = self._gmap[gi]
        if ui < self._ks[gi]:
            return self.dev.unit_dest(di, gi, ui)
        return self.buffers.unit_dest(ci, gi, ui)

    def _agree(self, ratio: float) -> float:
        """Every rank takes the largest CPU share any rank chose (the one whose GPU has least
        room), so that all split the same units."""
        return max(float(r) for r in self.comm.all_gather_object(float(ratio)))

    def _sides(self) -> list:
        return [s for row in self._side_of for s in row]

    # -- the step -----------------------------------------------------------------------------
    def before_backward(self, boundary: bool) -> None:
        if self.cpu is not None:  # an overlapped CPU step finishes before its gradient buffers refill
            self.cpu.before_backward(boundary)
        self.reducer.before_backward(boundary)

    def after_backward(self) -> None:
        self.reducer.after_backward()

    def gather(self) -> None:
        self.reducer.gather()
        if self.cpu is not None:
            self.cpu.gather()

    def grad_stats(self, scale: float) -> tuple[float, bool]:
        """Over both halves at once: the reducer's norms on the GPU, or each half's on the host."""
        if self.reducer.device_norms:
            return norms_stats(self.reducer.local_norms(), scale)
        total, bad = 0.0, False
        if self.dev is not None:
            total, bad = self.dev.grad_stats(scale)
        if self.cpu is not None:
            s, b = self.cpu._host_grad_stats([g for row in self.cpu._grads for g in row], scale)
            total, bad = total + s, bad or b
        return total, bad

    def apply(self, factor: float) -> None:
        self.sm.mark_stale()  # ZeRO-3: what is gathered now holds the old weights
        super().apply(factor)

    def release(self) -> None:
        self._dev_done = False
        self._each("release")
        self.reducer.reset()
        self.zero_grad()

    def zero_grad(self) -> None:
        self.sm.drop_grads()

    # -- masters and state, per entry of the local space --------------------------------------
    def masters(self) -> list:
        dev = self.dev.masters() if self.dev is not None else None
        cpu = self.cpu.masters() if self.cpu is not None else None
        return [(dev[di] if di is not None else []) + (cpu[ci] if ci is not None else [])
                for di, ci in self._gmap]

    def load_masters(self, masters: list) -> None:
        dev_rows = [masters[gi][:cut] for gi, ((di, _), cut) in enumerate(zip(self._gmap, self._cut)) if di is not None]
        cpu_rows = [masters[gi][cut:] for gi, ((_, ci), cut) in enumerate(zip(self._gmap, self._cut))
                    if ci is not None]
        if self.dev is not None:
            self.dev.load_masters(dev_rows)
        if self.cpu is not None:
            self.cpu.load_masters(cpu_rows)

    def export_states(self) -> dict:
        """entry index (running over the local space) -> its state in CPUAdam's format."""
        dev = self.dev.entry_states() if self.dev is not None else None
        cpu_state = self.cpu.optimizer.state_dict()["state"] if self.cpu is not None else {}
        starts = self._sub_index("cpu") if self.cpu is not None else []
        out, idx = {}, 0
        for gi, ((di, ci), cut) in enumerate(zip(self._gmap, self._cut)):
            n = len(self.layout.params[gi])
            for ei in range(n):
                if ei < cut:
                    st = dev[di][ei]
                else:
                    st = cpu_state.get(starts[ci] + ei - cut)
                    if st is not None:
                        st = {k: (int(v.item()) if k == "step" and torch.is_tensor(v) else v) for k, v in st.items()}
                if st is not None:
                    out[idx] = st
                idx += 1
        return out

    def import_states(self, state: dict) -> None:
        """The inverse of :meth:`export_states`: each entry's state converted to its half's dtype."""
        targets = self.state_dtypes()
        dev_rows, cpu_sub = [], {}
        starts = self._sub_index("cpu") if self.cpu is not None else []
        idx = 0
        for gi, ((di, ci), cut) in enumerate(zip(self._gmap, self._cut)):
            numels = self.layout.numels[gi]
            row = []
            for ei, n in enumerate(numels):
                st = state.get(idx)
                if st is not None and "exp_avg" in st:
                    st = convert_adam_state(st, targets[idx], n, (n,))
                if ei < cut:
                    row.append(st)
                elif st is not None:
                    cpu_sub[starts[ci] + ei - cut] = st
                idx += 1
            if di is not None:
                dev_rows.append(row)
        if self.dev is not None:
            self.dev.load_entry_states(dev_rows)
        if self.cpu is not None:
            opt = self.cpu.optimizer
            opt.load_state_dict({"state": cpu_sub, "param_groups": indexed_groups(opt.param_groups)})
