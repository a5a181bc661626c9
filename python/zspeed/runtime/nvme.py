"""ZeRO-Infinity optimizer offload to NVMe (offload_optimizer.device = nvme).

The nvme optimizer path: the gradients and the updated weights take the cpu
path's way through host memory (:class:`~zspeed.runtime.offload.HostBuffers`,
one flat gradient buffer and one flat weight buffer per group, in the model's
dtype), but the fp32 masters and the optimizer state live only in a file under
``nvme_path``: one :class:`~zspeed.ops.swap.NVMeOptimizerSwapper` per parameter
group streams them through its pipeline (read partition i+1 || step partition
i || write partition i-1), reading its partitions' gradients from the flat
gradient buffer and writing the updated weights into the flat weight buffer.
Nothing else of the state stays in RAM: per group, those two buffers (2 or 4
bytes per parameter each) plus the swapper's ``buffer_count`` pipeline buffers.
At ZeRO-3 with the parameter shards in host memory there is no weight buffer:
the swappers write the new weights into the shards themselves, and with the
gradients in the shards (offload_param.grads_in_shards) read the gradients
from there too, so host memory holds 2 bytes per parameter (the 16-bit
shards). Their steps are then resumable (include/zspeed/swap.h): a partition
whose gradient became its weight is never stepped again, and a failed step is
completed by the next apply() or abandoned (abandon_step) as on the other paths.
Those swap files are compact (swap.h, "Compact layout"): the state once plus a
few spare slots on disk instead of twice, as each partition's new image goes to
a free slot and the old one is freed when the write succeeded. An abandoned
step then drops the stepped partitions' state, which is why the engine abandons
only for a checkpoint load that writes every partition again (or when it
closes).

Partitions: each group's flat parameter space is cut into swapper partitions
of about ``zero_optimization.sub_group_size`` elements, capped at 2^23
(32 MiB of fp32 master) so that the pipeline has several partitions to
overlap; partitions end at parameter boundaries unless a parameter alone is
larger, which is then split. With ``state_dtype: "int8"`` every parameter
starts its own partition (and is split at block multiples), so that the
8-bit blocks fall exactly where the CPU path's per-tensor blocks do.

The kernels are the CPU path's, elementwise, so the result is bit for bit the
one of device=cpu with the same optimizer and state dtype (the tests check
it). Checkpoints store the same tensors as the CPU path (master.safetensors
and optim.safetensors by parameter name, or with several ranks each rank's
pieces in its partition files; the optimizer's class recorded as
CPUAdam / CPUAdagrad / CPULion), so a checkpoint moves between cpu and nvme
offload; 8-bit states move as their codes and block scales, bit for bit, and
loading masters keeps the states' stored bytes. Saves and loads stream them:
a save reads each piece's master and states from the swap file when the
writer reaches them (:meth:`NVMePath.saved_masters` /
:meth:`NVMePath.saved_state`, one partition in memory at a time), and a load
reads each piece from the checkpoint as the partitions that hold it are
written, so neither needs host memory of the tier's size.

Swap files: ``<nvme_path>/zspeed_swap_<random>_<group>.swap``, a fresh random
name per engine, so a restarted job never meets its predecessor's file (in a
container a restarted job often gets the same PID). A live swapper holds its
file (include/zspeed/swap.h, "Ownership"); a file nobody holds was left by a
process that died, and the engine removes such files from ``nvme_path`` when
it starts (:func:`reclaim_stale_swap_files`), never one a live run holds. In a
shared scratch folder the sweep touches only regular files owned by this user:
anything else of such a name (a FIFO, a device, a folder, a symbolic link,
another user's file) is skipped, never opened or deleted.
"""
from __future__ import annotations

import bisect
import errno
import functools
import logging
import os
import secrets
import stat
import weakref

import numpy as np
import torch

from .._optimizers import ALGORITHMS
from .._signatures.optim import OPTIM_QBLOCK
from .checkpoint_files import Deferred, real
from .config import ConfigError
from .layout import FlatLayout
from .memory import Need, Sizes, state_bytes
from .offload import HostBuffers, OffloadedPath
from .optimizers import refuse_lr_decay
from .paths import indexed_groups

__all__ = ["NVMePath", "NVMeOptimizer", "PARTITION_CAP", "nvme_tiers", "reclaim_stale_swap_files"]

log = logging.getLogger("zspeed.nvme")

PARTITION_CAP = 1 << 23  # elements per swapper partition at most (see the module docstring)


class NVMeOptimizer(torch.optim.Optimizer):
    """The engine's ``optimizer`` for nvme offload: param groups and hyperparameters
    (what LR schedulers and ``get_lr()`` touch) over the model's parameters; the
    step and the state are the swappers'. ``state_dict()`` / ``load_state_dict()``
    speak the CPU path's format (per-parameter tensors), so checkpoints interchange."""

    def __init__(self, groups: list, defaults: dict, path: "NVMePath", checkpoint_class: str):
        super().__init__(groups, defaults)
        self.checkpoint_class = checkpoint_class
        self._path_ref = weakref.ref(path)  # the path owns this optimizer: no cycle

    def step(self, closure=None):  # noqa: D401 - the engine steps through NVMePath.apply
        raise RuntimeError("with offload_optimizer.device 'nvme' the optimizer step runs inside "
                           "engine.step(); do not call optimizer.step() yourself.")

    def state_dict(self):
        return {"state": self._path_ref().export_states(), "param_groups": indexed_groups(self.param_groups)}

    def validate_state_dict(self, state_dict) -> None:
        """ValueError for a state :meth:`load_state_dict` cannot take; reads and writes nothing."""
        self._path_ref().check_states(state_dict["state"])

    def load_state_dict(self, state_dict):
        self.validate_state_dict(state_dict)
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self._path_ref().import_states(state_dict["state"])


def nvme_tiers(path) -> list:
    """The parts of an optimizer path (itself, or a split's GPU / host / disk tiers) that keep
    their masters and state in swap files (they have ``swappers``)."""
    parts = [path] + [getattr(path, k, None) for k in ("dev", "cpu", "disk")]
    return [p for p in parts if p is not None and getattr(p, "swappers", None)]


class _Part:
    __slots__ = ("start", "n", "pieces")

    def __init__(self, start: int):
        self.start, self.n = start, 0
        self.pieces: list = []  # (param index, offset in the param, offset in the partition, length)


def _partitions(numels: list, cap: int, per_param: bool, align: int) -> list:
    """Cuts a group's flat space into partitions of at most ``cap`` elements."""
    if per_param:
        cap = max(align, cap // align * align)
    parts: list = []
    start = 0
    for pi, n in enumerate(numels):
        off = 0
        while off < n:
            if not parts or parts[-1].n >= cap or (per_param and off == 0) or \
                    (off == 0 and parts[-1].n + n > cap and parts[-1].n > 0):
                parts.append(_Part(start + off))
            p = parts[-1]
            take = min(n - off, cap - p.n)
            p.pieces.append((pi, off, p.n, take))
            p.n += take
            off += take
        start += n
    return parts


class NVMePath(OffloadedPath):
    """The optimizer path of offload_optimizer.device nvme (see the module docstring)."""

    @classmethod
    def bytes_needed(cls, plan, config, s: Sizes) -> list:
        """What this path holds (memory.py): the reduced gradients in host memory; the fp32 masters
        and the optimizer state in the swap files under nvme_path."""
        sd, per = state_bytes(config)
        n = int(s.local * s.cpu_share)  # all of the rank's part, or a split's non-GPU share
        kept = min(n, int(s.host_elems))  # ... of which offload_optimizer.max_in_cpu stays in host memory
        on_disk = n - kept
        host = [Need("host", "fp32 masters (max_in_cpu)", 4 * kept),
                Need("host", f"optimizer state ({sd}, max_in_cpu)", int(per * kept))] if kept else []
        # The reduced gradients in host memory (none: in the shards' place, plan.grads_in_shards);
        # the new weights go into the shards (ZeRO-3 with the shards in host memory) or a buffer.
        # Writing into the shards makes the steps resumable, and those use compact swap files:
        # one slot per partition plus up to buffer_count spares per partition size (a GPT's
        # layout has a handful of sizes: counted as four of the largest); otherwise two slots
        # per partition.
        shards_out = plan.store == "partitioned" and (plan.param_medium == "host" or plan.device.type == "cpu")
        if shards_out:
            cap = max(1, min(config.sub_group_size, PARTITION_CAP))
            spare = min(on_disk, 4 * max(2, config.nvme_buffer_count) * cap)
            disk = int((4 + per) * (on_disk + spare))
            what = (f"once, plus spare slots for {spare:,} elements: a failed write loses nothing, as each "
                    f"partition's new image goes to a free slot")
        else:
            disk = int(2 * (4 + per) * on_disk)
            what = "twice: two slots per swap partition, so a failed write loses nothing"
        return [Need("host", "gradients", 0 if plan.grads_in_shards else s.esize * n),
                Need("host", "weights out", 0 if shards_out else s.esize * n), *host,
                Need("nvme", f"offload_optimizer ({on_disk:,} elements x {4 + per:.1f} bytes of fp32 masters and "
                     f"{sd} optimizer state, {what})", disk if on_disk else 0, where=config.nvme_path)]

    def __init__(self, layout: FlatLayout, buffers: HostBuffers, name: str, params: dict, *, client,
                 offload_cfg: dict, aio: dict, sub_group_size: int):
        super().__init__(layout, buffers)
        # A client optimizer of another kind was refused by the run plan (plan.py); torch_adam has no
        # effect here (the config warns).
        from ..ops.swap import NVMeOptimizerSwapper
        from ..ops import grad_stats
        self._grad_stats = grad_stats
        # The swappers write the new weights into the store's host shards when those are the
        # weights (ZeRO-3 with offload_param): no weight buffer of the model's size. Their steps
        # are then resumable (a step that fails partway is completed by the next call, each
        # partition stepped once), as what they wrote is in the model's place -- and with the
        # gradients in the shards (plan.grads_in_shards) it is where the gradients were.
        own = buffers.shard_storage()
        self._resumable = own is not None
        if own is not None:
            self._out_flat, self._out = own, [layout.views(f, gi) for gi, f in enumerate(own)]
        else:
            self._out_flat, self._out = buffers.alloc(buffers.model_dtype)
        self._stepped: set = set()  # groups whose swapper has stepped on the current gradients
        kind, cls = ALGORITHMS[name].kernel, ALGORITHMS[name].cpu_class
        if name in ("Adam", "AdamW"):
            kind = "adamw" if params["adam_w_mode"] else "adam"
            defaults = dict(lr=params["lr"], bias_correction=params["bias_correction"],
                            betas=tuple(params["betas"]), eps=params["eps"],
                            weight_decay=params["weight_decay"], amsgrad=False)
            state_dtype = params["state_dtype"]
        else:
            if name == "Adagrad":
                refuse_lr_decay(params)
                defaults = dict(lr=params["lr"], lr_decay=0, weight_decay=params["weight_decay"],
                                eps=params["eps"], initial_accumulator_value=params["initial_accumulator_value"])
            elif name == "Lion":
                defaults = dict(lr=params["lr"], betas=tuple(params["betas"]),
                                weight_decay=params["weight_decay"])
            else:
                raise ConfigError(f"offload_optimizer.device nvme has no hyperparameters for optimizer {name!r} "
                                  f"(its branch in NVMePath is missing: docs/ARCHITECTURE.md)")
            state_dtype = "fp32"
        self.kind, self.state_dtype, self._counts_steps = kind, state_dtype, ALGORITHMS[name].steps
        defaults["state_dtype"] = state_dtype  # as CPUAdam's groups say it (checkpoints convert to it)
        self.optimizer = NVMeOptimizer([dict(g) for g in layout.groups], defaults, self, cls)
        cap = max(1, min(int(sub_group_size), PARTITION_CAP))
        self.parts = [_partitions(ns, cap, state_dtype == "int8", OPTIM_QBLOCK) for ns in layout.numels]
        self.swappers: list = []
        self._finalizer = weakref.finalize(self, _close_all, self.swappers)
        reclaim_stale_swap_files(offload_cfg["nvme_path"])
        run = secrets.token_hex(8)
        for gi, group in enumerate(self.optimizer.param_groups):
            sw = NVMeOptimizerSwapper(
                [p.n for p in self.parts[gi]], offload_cfg["nvme_path"], name=f"{SWAP_PREFIX}{run}_{gi}",
                optimizer=kind,
                lr=group["lr"], betas=group.get("betas"), eps=group.get("eps"),
                weight_decay=group["weight_decay"], bias_correction=group.get("bias_correction", True),
                state_dtype=state_dtype, buffer_count=max(2, int(offload_cfg["buffer_count"])),
                block_size=int(aio["block_size"]), queue_depth=int(aio["queue_depth"]),
                intra_op_parallelism=int(aio["intra_op_parallelism"]),
                single_submit=bool(aio["single_submit"]), overlap_events=bool(aio["overlap_events"]),
                compact=self._resumable)
            self.swappers.append(sw)
            params_g = group["params"]
            for i, part in enumerate(self.parts[gi]):
                sw.init_partition(i, _assemble(part, lambda pi: params_g[pi].detach().reshape(-1)))
            iav = float(group.get("initial_accumulator_value", 0.0))
            if iav:  # init_partition zeroed the states; Adagrad's sum starts at this value
                self._reset_states(gi)
        self._starts = [[p.start for p in parts] for parts in self.parts]
        buffers.use_master_readers([functools.partial(self._read_masters, gi) for gi in range(len(self.parts))])

    # -- the step ----------------------------------------------------------------------------------
    def _host_grad_stats(self, tensors: list, scale: float) -> tuple[float, bool]:
        """The CPU path's kernel on the same per-parameter tensors, so the norm is identical."""
        s, bad = self._grad_stats(tensors, scale=scale)
        return float(s), bool(bad)

    def before_backward(self, boundary: bool) -> None:
        self._stepped.clear()  # new gradients: a new step
        super().before_backward(boundary)

    def apply(self, factor: float) -> None:
        """One step of every swapper, each reading its partitions' gradients from the flat
        gradient buffer and writing the updated weights into the flat weight buffer (or the
        shards); then the weights go into the model. A swapper that raises keeps its previous
        step (a resumable one: the partitions it stepped), and apply called again steps only
        what was not stepped: not the groups stepped before it, nor (resumable) its stepped
        partitions."""
        self.buffers.wait_host_buffers()
        self.buffers.step_started()
        for gi, (group, sw) in enumerate(zip(self.optimizer.param_groups, self.swappers)):
            if gi in self._stepped:  # its new weights wait in its flat weight buffer
                continue
            fg, fo = self.buffers.flat_grads[gi], self._out_flat[gi]
            sw.set_hparams(betas=group.get("betas"), eps=group.get("eps"),
                           weight_decay=group["weight_decay"])
            sw.step([fg[p.start:p.start + p.n] for p in self.parts[gi]], float(factor),
                    out=[fo[p.start:p.start + p.n] for p in self.parts[gi]], lr=float(group["lr"]),
                    resumable=self._resumable)
            self._stepped.add(gi)
            self.buffers.chunk_stepped([(gi, ei) for ei in range(len(self.layout.params[gi]))])
        self.buffers.write_back(self._out, self.layout.keys)
        self.buffers.end_write_back()

    def _read_masters(self, gi: int, off: int, n: int, cache: dict) -> torch.Tensor:
        """Group gi's fp32 masters at layout offsets [off, off + n), read from its swap file
        (``cache``: partition -> its masters, filled here, so that a caller reading many ranges
        reads each partition once)."""
        out = torch.empty(n, dtype=torch.float32)
        parts, starts = self.parts[gi], self._starts[gi]
        i = max(0, bisect.bisect_right(starts, off) - 1)
        while n and i < len(parts) and parts[i].start < off + n:
            p = parts[i]
            key = (gi, i)
            if key not in cache:
                cache[key] = torch.from_numpy(self.swappers[gi].read_arrays(i, ("param",))["param"])
            lo, hi = max(off, p.start), min(off + n, p.start + p.n)
            if lo < hi:
                out[lo - off:hi - off].copy_(cache[key][lo - p.start:hi - p.start])
            i += 1
        return out

    def release(self) -> None:
        self._stepped.clear()
        super().release()

    def abandon_step(self) -> None:
        """Forgets a step that stopped partway (before a checkpoint load replaces what it touched):
        a resumable swapper's stepped partitions return to the last step (compact files: their
        state is dropped, the load writes it again), and gradients held in the shards give way
        to the weights (compact: each partition's committed ones, stepped or not)."""
        # First the shards get their partitions' committed masters, while the stepped ones are
        # still readable (a compact file drops them next; gradients sit in the shards only with
        # compact files, so for two-slot ones this does nothing).
        self.buffers.abandoned()
        for sw in self.swappers:
            sw.abandon_step()
        self._stepped.clear()

    # -- masters and state (checkpoints) ----------------------------------------------------------
    def _state_keys(self) -> tuple:
        return self.swappers[0].state_keys

    def _reset_states(self, gi: int) -> None:
        """Fresh state as the CPU path creates it: zeros (8-bit: zero codes and scales), and
        Adagrad's sum = initial_accumulator_value. The masters stay."""
        iav = float(self.optimizer.param_groups[gi].get("initial_accumulator_value", 0.0))
        sw = self.swappers[gi]
        for i in range(len(self.parts[gi])):
            if not sw.holds_state(i):  # dropped by an abandoned step: a load writes its masters next
                sw.init_partition(i, np.zeros(self.parts[gi][i].n, np.float32))
            fresh = {k: np.zeros_like(a) for k, a in sw.read_arrays(i).items() if k != "param"}
            if "sum" in fresh:
                fresh["sum"][:] = iav
            sw.write_arrays(i, **fresh)
        sw.steps = 0

    def _gather(self, gi: int, keys: tuple) -> dict:
        """key -> per-parameter flat fp32 tensors of group gi (states converted to fp32)."""
        out = {k: [torch.empty(n, dtype=torch.float32) for n in self.layout.numels[gi]] for k in keys}
        for i, part in enumerate(self.parts[gi]):
            sw = self.swappers[gi]
            st = sw.read_arrays(i, keys) if keys == ("param",) else sw.get_state(i)
            for k in keys:
                src = torch.from_numpy(st[k])
                for pi, off, at, n in part.pieces:
                    out[k][pi][off:off + n].copy_(src[at:at + n])
        return out

    def masters(self) -> list:
        """Per group, per parameter fp32 masters (fresh tensors read from disk)."""
        return [self._gather(gi, ("param",))["param"] for gi in range(len(self.swappers))]

    # -- what a save writes: read from the swap files when the writer reaches each tensor --------
    def _spans(self, gi: int) -> list:
        """Per entry of group gi, where its elements lie: [(partition, offset in the entry,
        offset in the partition, count)] in order."""
        out = [[] for _ in self.layout.numels[gi]]
        for i, part in enumerate(self.parts[gi]):
            for pi, off, at, n in part.pieces:
                out[pi].append((i, off, at, n))
        return out

    def _reads(self):
        """A reader of partitions that keeps the last one read (its arrays for one set of keys):
        the entries of one partition, and an entry's keys, are written one after another."""
        last: dict = {}

        def read(gi: int, i: int, keys: tuple) -> dict:
            if last.get("at") != (gi, i, keys):
                last.clear()
                sw = self.swappers[gi]
                last["arrays"] = sw.get_state(i) if keys == ("state",) else sw.read_arrays(i, keys)
                last["at"] = (gi, i, keys)
            return last["arrays"]
        return read

    def saved_masters(self) -> list:
        """:meth:`masters` as :class:`Deferred` tensors, each read from the swap file when a
        save writes it."""
        read = self._reads()

        def load(gi, spans, n):
            out = torch.empty(n, dtype=torch.float32)
            for i, off, at, cnt in spans:
                out[off:off + cnt].copy_(torch.from_numpy(read(gi, i, ("param",))["param"][at:at + cnt]))
            return out
        return [[Deferred(torch.float32, (n,), functools.partial(load, gi, spans, n))
                 for spans, n in zip(self._spans(gi), self.layout.numels[gi])] for gi in range(len(self.swappers))]

    def saved_state(self) -> dict:
        """:meth:`export_states` with :class:`Deferred` tensors (same keys, dtypes and shapes),
        each read from the swap file when a save writes it: one partition in memory at a time."""
        read = self._reads()
        q8 = self.state_dtype == "int8"
        dt = torch.bfloat16 if self.state_dtype == "bf16" else torch.float32
        keys = self._state_keys()

        def load_q8(gi, spans, key, dtype, per_elem, numel):
            out = torch.zeros(numel, dtype=dtype)
            for i, off, _at, n in spans:
                at, cnt = _q8_span(off, n, per_elem)
                out[at:at + cnt].copy_(torch.from_numpy(read(gi, i, tuple(k for k, _, _ in self._Q8))[key]))
            return out

        def load(gi, spans, key, numel, shape):
            out = torch.empty(numel, dtype=torch.float32)
            for i, off, at, n in spans:
                out[off:off + n].copy_(torch.from_numpy(read(gi, i, ("state",))[key][at:at + n]))
            return out.view(shape).to(dt)

        state, idx = {}, 0
        for gi, group in enumerate(self.optimizer.param_groups):
            steps = self.swappers[gi].steps
            spans = self._spans(gi)
            for pi, p in enumerate(group["params"]):
                if steps:
                    n = p.numel()
                    if q8:
                        st = {}
                        for key, dtype, per_elem in self._Q8:
                            numel = n if per_elem else qblocks(n)
                            shape = p.shape if numel == n and key in keys else (numel,)
                            st[key] = Deferred(dtype, shape, functools.partial(
                                lambda *a, shape=shape: load_q8(*a).view(shape), gi, spans[pi], key, dtype,
                                per_elem, numel))
                    else:
                        st = {k: Deferred(dt, p.shape, functools.partial(load, gi, spans[pi], k, n, p.shape))
                              for k in keys}
                    if self._counts_steps:
                        st["step"] = steps
                    state[idx] = st
                idx += 1
        return state

    takes_deferred = True  # a checkpoint load's tensors are read partition by partition

    def load_masters(self, masters: list) -> None:
        """Replaces the masters, keeping every state byte (8-bit states are not requantized),
        and refreshes the model's weights from them. Deferred masters (a checkpoint load) are
        read one at a time, each once, as the partitions that hold it are written."""
        self.buffers.refresh_begin()
        for gi, sw in enumerate(self.swappers):
            take = _Entries(masters[gi], lambda t: t.detach().reshape(-1).to("cpu", torch.float32),
                            functools.partial(self.buffers.refresh_entry, gi, outs=self._out))
            for i, part in enumerate(self.parts[gi]):
                sw.write_arrays(i, param=_assemble(part, take))
            take.finish()
        self.buffers.refresh_end(self._out)

    # 8-bit states: CPUAdam's tensors (int8 exp_avg, uint8 exp_avg_sq, one fp32 scale per block of
    # each), moved as the swapper stores them; a partition holds one parameter's block-aligned range.
    _Q8 = (("exp_avg", torch.int8, True), ("exp_avg_sq", torch.uint8, True),
           ("exp_avg_scale", torch.float32, False), ("exp_avg_sq_scale", torch.float32, False))

    def _q8_export(self, gi: int) -> list:
        group = self.optimizer.param_groups[gi]
        rows = [{k: torch.zeros(p.numel() if per_elem else qblocks(p.numel()), dtype=dt)
                 for k, dt, per_elem in self._Q8} for p in group["params"]]
        for i, part in enumerate(self.parts[gi]):
            arrays = self.swappers[gi].read_arrays(i, [k for k, _, _ in self._Q8])
            (pi, off, _, n), = part.pieces
            for key, _, per_elem in self._Q8:
                at, cnt = _q8_span(off, n, per_elem)
                rows[pi][key][at:at + cnt].copy_(torch.from_numpy(arrays[key]))
        return rows

    def _q8_import(self, gi: int, rows: list) -> None:
        for key, dt, _ in self._Q8:
            for r in rows:
                src = r.get(key)
                if src is None or src.dtype != dt:
                    raise ConfigError(f"the checkpoint's optimizer state has no {dt} '{key}' for a parameter; "
                                      f"it was not saved with state_dtype 'int8'. Load with "
                                      f"load_optimizer_states=False or use the state dtype it was saved with.")
        takes = {key: _Entries([r[key] for r in rows], lambda t: t.reshape(-1)) for key, _, _ in self._Q8}
        for i, part in enumerate(self.parts[gi]):
            (pi, off, _, n), = part.pieces
            arrays = {}
            for key, dt, per_elem in self._Q8:
                at, cnt = _q8_span(off, n, per_elem)
                arrays[key] = takes[key](pi)[at:at + cnt].contiguous()
            self.swappers[gi].write_arrays(i, **arrays)

    def export_states(self) -> dict:
        """torch-style ``state``: param index -> {step, <state keys>} shaped like the parameters,
        in the CPU path's dtypes (fp32, or bf16 for state_dtype bf16: the values are exact)."""
        state, idx = {}, 0
        dt = torch.bfloat16 if self.state_dtype == "bf16" else torch.float32
        for gi, group in enumerate(self.optimizer.param_groups):
            steps = self.swappers[gi].steps
            vals = None
            if steps and self.state_dtype == "int8":
                vals = self._q8_export(gi)
            elif steps:
                g = self._gather(gi, self._state_keys())
                vals = [{k: g[k][pi].view(p.shape).to(dt) for k in self._state_keys()}
                        for pi, p in enumerate(group["params"])]
            for pi, p in enumerate(group["params"]):
                if vals is not None:
                    st = {k: (v.view(p.shape) if v.numel() == p.numel() and k in self._state_keys() else v)
                          for k, v in vals[pi].items()}
                    if self._counts_steps:
                        st["step"] = steps
                    state[idx] = st
                idx += 1
        return state

    def _rows(self, state: dict) -> list:
        """Per group, the per-parameter states of ``state`` (None where a parameter has none)."""
        out, idx = [], 0
        for group in self.optimizer.param_groups:
            out.append([state.get(idx + pi) for pi in range(len(group["params"]))])
            idx += len(group["params"])
        return out

    def check_states(self, state: dict) -> None:
        """ValueError for a torch-style ``state`` that :meth:`import_states` cannot take: a
        group with state for only some of its parameters, parameters stepped different numbers
        of times, or states not in this path's state dtype (checkpoint loads convert them
        first). Reads and writes nothing."""
        q8 = {k: dt for k, dt, _ in self._Q8}
        for gi, rows in enumerate(self._rows(state)):
            if all(r is None for r in rows):
                continue
            if any(r is None for r in rows):
                raise ValueError(f"the optimizer state covers only some parameters of group {gi}; nvme offload "
                                 f"steps every parameter of a group together. Load with "
                                 f"load_optimizer_states=False.")
            for r in rows:
                if self.state_dtype == "int8":
                    bad = [k for k, dt in q8.items() if not hasattr(r.get(k), "dtype") or r[k].dtype != dt]
                else:
                    bad = [k for k in self._state_keys()
                           if not hasattr(r.get(k), "is_floating_point") or not r[k].is_floating_point()]
                if bad:
                    raise ValueError(f"the optimizer state has no state_dtype '{self.state_dtype}' value for "
                                     f"'{bad[0]}' (it was saved with another state_dtype and not converted).")
            steps = {int(r["step"]) for r in rows if "step" in r}
            if len(steps) > 1:
                raise ValueError(f"the parameters of group {gi} were stepped different numbers of times "
                                 f"({sorted(steps)[:4]}); nvme offload keeps one step count per group.")

    def import_states(self, state: dict) -> None:
        """Inverse of :meth:`export_states` (a CPU-path state works too); checked first
        (:meth:`check_states`), so a state it refuses writes nothing."""
        try:
            self.check_states(state)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        keys = self._state_keys()
        for gi, rows in enumerate(self._rows(state)):
            sw = self.swappers[gi]
            if all(r is None for r in rows):
                self._reset_states(gi)
                continue
            if self.state_dtype == "int8":
                self._q8_import(gi, rows)
            else:
                # (Deferred states, of a checkpoint load, are read one at a time, each once)
                takes = {k: _Entries([r[k] for r in rows], lambda t: t.reshape(-1).float()) for k in keys}
                for i, part in enumerate(self.parts[gi]):
                    # The masters stay; one an abandoned step dropped is written by the load next.
                    param = (sw.read_arrays(i, ("param",))["param"] if sw.holds_state(i)
                             else np.zeros(part.n, np.float32))
                    new = {k: _assemble(part, takes[k]) for k in keys}
                    sw.set_state(i, param, **new)
            steps = {int(r["step"]) for r in rows if "step" in r}
            sw.steps = steps.pop() if steps else 0

    def stats(self, reset: bool = False) -> list:
        """Per group, the swapper's cumulative statistics (see NVMeOptimizerSwapper.stats)."""
        return [sw.stats(reset=reset) for sw in self.swappers]

    def close(self) -> None:
        """Closes the swappers, which deletes their files (idempotent)."""
        self._finalizer()


SWAP_PREFIX = "zspeed_swap_"


def reclaim_stale_swap_files(nvme_path) -> tuple[int, int]:
    """Deletes the swap files (``zspeed_swap_*.swap``) in ``nvme_path`` that no live swapper
    holds: files left by processes that died. Returns (files removed, bytes freed). A file a
    live swapper holds, or that this process may not remove, is left alone."""
    removed = freed = 0
    try:
        names = os.listdir(nvme_path)
    except OSError:
        return 0, 0
    for name in names:
        if not (name.startswith(SWAP_PREFIX) and name.endswith(".swap")):
            continue
        path = os.path.join(nvme_path, name)
        size = _remove_if_unheld(path)
        if size is not None:
            removed += 1
            freed += size
            log.warning("zspeed: removed %s (%.3f GiB), a swap file left by a process that died", path,
                        size / 2 ** 30)
    return removed, freed


def _ours(st: os.stat_result) -> bool:
    """Whether a swap-file name's entry is one the sweep may touch: a regular file (not a
    FIFO, device, folder or symbolic link) owned by this user. Whoever can write a shared
    scratch folder can plant such names; opening a FIFO would block the start, and deleting
    another user's file is not this job's call."""
    if not stat.S_ISREG(st.st_mode):
        return False
    return os.name == "nt" or not hasattr(os, "geteuid") or st.st_uid == os.geteuid()


def _remove_if_unheld(path: str) -> int | None:
    """The size of the swap file at path if it was removed because no live swapper holds it,
    else None (see include/zspeed/swap.h, "Ownership"). Only a regular file of this user is
    opened (without following a symbolic link, and non-blocking) or removed: see _ours."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if not _ours(named):
        log.debug("zspeed: %s is not a regular file of this user; the stale swap file sweep skips it", path)
        return None
    if os.name == "nt":  # a live swapper's handle refuses deletion
        try:
            os.remove(path)
            return named.st_size
        except OSError:
            return None
    import fcntl
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        held = os.fstat(fd)
        if not _ours(held) or (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            return None  # replaced since the stat above
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        named = os.stat(path, follow_symlinks=False)
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            return None
        os.unlink(path)
        return held.st_size
    except OSError as e:  # EWOULDBLOCK: a live swapper holds it
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.ENOENT, errno.EACCES, errno.EPERM):
            log.warning("zspeed: cannot check swap file %s: %s", path, e)
        return None
    finally:
        os.close(fd)


def qblocks(n: int) -> int:
    """8-bit blocks (one scale each) of n elements."""
    return (n + OPTIM_QBLOCK - 1) // OPTIM_QBLOCK


def _q8_span(off: int, n: int, per_elem: bool) -> tuple[int, int]:
    """(start, count) in a parameter's 8-bit tensor (codes or block scales) of the partition
    that covers the parameter's elements [off, off + n)."""
    return (off, n) if per_elem else (off // OPTIM_QBLOCK, qblocks(n))


def _assemble(part: _Part, fetch) -> torch.Tensor:
    """A partition's fp32 values from per-parameter flat tensors (``fetch(pi)``, of any float dtype
    and device: only the partition's slice of each is converted)."""
    buf = torch.empty(part.n, dtype=torch.float32)
    for pi, off, at, n in part.pieces:
        buf[at:at + n].copy_(fetch(pi)[off:off + n])
    return buf


class _Entries:
    """``fetch(pi)`` for :func:`_assemble`: entry pi of ``row`` (tensors or checkpoint_files.Deferred
    ones, read when first asked for) through ``conv``, the last one kept, as the partitions ask
    for the entries in order (an entry split over partitions is read once). ``done(pi, t)`` is
    told of each entry when the next is asked for, and of the last by :meth:`finish`."""

    def __init__(self, row: list, conv, done=None):
        self.row, self.conv, self.done = row, conv, done
        self.pi, self.t = None, None

    def __call__(self, pi: int) -> torch.Tensor:
        if pi != self.pi:
            self.finish()
            self.pi, self.t = pi, self.conv(real(self.row[pi]))
        return self.t

    def finish(self) -> None:
        if self.pi is not None and self.done is not None:
            self.done(self.pi, self.t)
        self.pi = self.t = None


def _close_all(swappers: list) -> None:
    for sw in swappers:
        try:
            sw.close()
        except Exception:  # noqa: BLE001 - closing everything matters more than one error
            pass
