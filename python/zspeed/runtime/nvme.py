"""ZeRO-Infinity optimizer offload to NVMe (offload_optimizer.device = nvme).

The engine's offloaded step is unchanged (offload.py moves the gradients into
host buffers and the new weights back into the model); only the "host
optimizer step" differs: instead of a CPU optimizer over fp32 masters in RAM,
one :class:`~zspeed.ops.swap.NVMeOptimizerSwapper` per parameter group streams
masters and optimizer state from a file under ``nvme_path`` through its
pipeline (read partition i+1 || step partition i || write partition i-1) and
writes the updated weights, in the model's dtype, into offload.py's flat out
buffer. Nothing else of the state stays in RAM: per group, the flat gradient
and weight buffers (2 or 4 bytes per parameter each) plus the swapper's
``buffer_count`` pipeline buffers.

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
and optim.safetensors by parameter name; the optimizer's class recorded as
CPUAdam / CPUAdagrad / CPULion), so a checkpoint moves between cpu and nvme
offload; 8-bit states go through the raw partition images, bit for bit. Saving and loading materialize the masters and states in RAM for the
duration of the call (safetensors writes whole files).
"""
from __future__ import annotations

import weakref

import numpy as np
import torch

from .config import ConfigError

__all__ = ["NVMeHostOptimizer", "NVMeOptimizer", "PARTITION_CAP"]

PARTITION_CAP = 1 << 23  # elements per swapper partition at most (see the module docstring)
# config optimizer name -> (swapper kind, class of the CPU path recorded in checkpoints)
_KINDS = {"Adagrad": ("adagrad", "CPUAdagrad"), "Lion": ("lion", "CPULion")}


class NVMeOptimizer(torch.optim.Optimizer):
    """The engine's ``optimizer`` for nvme offload: param groups and hyperparameters
    (what LR schedulers and ``get_lr()`` touch) over the model's parameters; the
    step and the state are the swappers'. ``state_dict()`` / ``load_state_dict()``
    speak the CPU path's format (per-parameter tensors), so checkpoints interchange."""

    def __init__(self, groups: list, defaults: dict, host: "NVMeHostOptimizer", checkpoint_class: str):
        super().__init__(groups, defaults)
        self.checkpoint_class = checkpoint_class
        self._host_ref = weakref.ref(host)

    def step(self, closure=None):  # noqa: D401 - the engine steps through NVMeHostOptimizer
        raise RuntimeError("with offload_optimizer.device 'nvme' the optimizer step runs inside "
                           "engine.step(); do not call optimizer.step() yourself.")

    def state_dict(self):
        sd = {"state": self._host_ref().export_states(),
              "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": []}
                               for g in self.param_groups]}
        start = 0
        for g, src in zip(sd["param_groups"], self.param_groups):
            g["params"] = list(range(start, start + len(src["params"])))
            start += len(src["params"])
        return sd

    def load_state_dict(self, state_dict):
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self._host_ref().import_states(state_dict["state"])


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


class NVMeHostOptimizer:
    """The host optimizer of the nvme path: the same ``grad_stats`` / ``step`` calls as
    :class:`~zspeed.runtime.optimizers.HostOptimizer`, over swappers."""

    def __init__(self, name: str, params: dict, groups: list, offload, offload_cfg: dict, aio: dict,
                 sub_group_size: int, *, client=None):
        if client is not None:
            raise ConfigError("a client optimizer was passed to zspeed.initialize with offload_optimizer.device "
                              "'nvme': configure the optimizer in the config's 'optimizer' section instead "
                              "(nvme offload runs zspeed's own Adam/AdamW/Adagrad/Lion kernels).")
        if params.get("torch_adam"):
            raise ConfigError("optimizer.params.torch_adam cannot be used with offload_optimizer.device 'nvme': "
                              "the NVMe swapper runs zspeed's own kernels; remove torch_adam.")
        from ..ops.swap import NVMeOptimizerSwapper
        from ..ops import grad_stats
        from .._signatures.optim import OPTIM_QBLOCK
        self._grad_stats = grad_stats
        self.offload = offload
        if name in ("Adam", "AdamW"):
            kind = "adamw" if params["adam_w_mode"] else "adam"
            cls = "CPUAdam"
            defaults = dict(lr=params["lr"], bias_correction=params["bias_correction"],
                            betas=tuple(params["betas"]), eps=params["eps"],
                            weight_decay=params["weight_decay"], amsgrad=False)
            state_dtype = params["state_dtype"]
        else:
            kind, cls = _KINDS[name]
            if name == "Adagrad":
                if params["lr_decay"] != 0:
                    raise ConfigError("optimizer.params.lr_decay must be 0 with offloaded Adagrad; use an "
                                      "lr scheduler instead.")
                defaults = dict(lr=params["lr"], lr_decay=0, weight_decay=params["weight_decay"],
                                eps=params["eps"], initial_accumulator_value=params["initial_accumulator_value"])
            else:
                defaults = dict(lr=params["lr"], betas=tuple(params["betas"]),
                                weight_decay=params["weight_decay"])
            state_dtype = "fp32"
        self.kind, self.state_dtype = kind, state_dtype
        self.optimizer = NVMeOptimizer([dict(g) for g in groups], defaults, self, cls)
        cap = max(1, min(int(sub_group_size), PARTITION_CAP))
        self.numels = [[p.numel() for p in g["params"]] for g in self.optimizer.param_groups]
        self.qblock = OPTIM_QBLOCK
        self.parts = [_partitions(ns, cap, state_dtype == "int8", OPTIM_QBLOCK) for ns in self.numels]
        self.swappers: list = []
        self._finalizer = weakref.finalize(self, _close_all, self.swappers)
        for gi, group in enumerate(self.optimizer.param_groups):
            sw = NVMeOptimizerSwapper(
                [p.n for p in self.parts[gi]], offload_cfg["nvme_path"], optimizer=kind,
                lr=group["lr"], betas=group.get("betas"), eps=group.get("eps"),
                weight_decay=group["weight_decay"], bias_correction=group.get("bias_correction", True),
                state_dtype=state_dtype, buffer_count=max(2, int(offload_cfg["buffer_count"])),
                block_size=int(aio["block_size"]), queue_depth=int(aio["queue_depth"]),
                intra_op_parallelism=int(aio["intra_op_parallelism"]),
                single_submit=bool(aio["single_submit"]), overlap_events=bool(aio["overlap_events"]))
            self.swappers.append(sw)
            params_g = group["params"]
            for i, part in enumerate(self.parts[gi]):
                sw.init_partition(i, self._assemble(
                    part, lambda pi: params_g[pi].detach().reshape(-1).to("cpu", torch.float32)))
            self._reset_states(gi)

    # -- the step (HostOptimizer's interface) ---------------------------------------------------
    def grad_stats(self, tensors: list, scale: float) -> tuple[float, bool]:
        """The CPU path's call on the same per-parameter tensors, so the norm is identical."""
        s, bad = self._grad_stats(tensors, scale=scale)
        return float(s), bool(bad)

    def step(self, grads: list, grad_scale: float, lowp_out: list | None) -> None:
        """One step of every swapper; ``grads`` / ``lowp_out`` are views into offload.py's flat
        buffers, which the swappers read and write directly, partition by partition."""
        del grads, lowp_out
        for gi, (group, sw) in enumerate(zip(self.optimizer.param_groups, self.swappers)):
            fg, fo = self.offload.flat_grads[gi], self.offload.flat_out[gi]
            sw.set_hparams(betas=group.get("betas"), eps=group.get("eps"),
                           weight_decay=group["weight_decay"])
            sw.step([fg[p.start:p.start + p.n] for p in self.parts[gi]], float(grad_scale),
                    out=[fo[p.start:p.start + p.n] for p in self.parts[gi]], lr=float(group["lr"]))

    # -- state access (checkpoints) -----------------------------------------------------------------
    @staticmethod
    def _assemble(part: _Part, fetch) -> torch.Tensor:
        """A partition's fp32 values from per-parameter flat fp32 tensors (``fetch(pi)``)."""
        buf = torch.empty(part.n, dtype=torch.float32)
        for pi, off, at, n in part.pieces:
            buf[at:at + n].copy_(fetch(pi)[off:off + n])
        return buf

    def _state_keys(self) -> tuple:
        return self.swappers[0].state_keys

    def _reset_states(self, gi: int) -> None:
        """Fresh state as the CPU path creates it: zeros, Adagrad's sum = initial_accumulator_value."""
        iav = float(self.optimizer.param_groups[gi].get("initial_accumulator_value", 0.0))
        sw = self.swappers[gi]
        if iav:
            for i, part in enumerate(self.parts[gi]):
                st = sw.get_state(i)
                sw.set_state(i, st["param"], sum=np.full(part.n, iav, np.float32))
        sw.steps = 0

    def _gather(self, gi: int, keys: tuple) -> dict:
        """key -> per-parameter flat fp32 tensors of group gi, read from the swapper."""
        out = {k: [torch.empty(n, dtype=torch.float32) for n in self.numels[gi]] for k in keys}
        for i, part in enumerate(self.parts[gi]):
            st = self.swappers[gi].get_state(i)
            for k in keys:
                src = torch.from_numpy(st[k])
                for pi, off, at, n in part.pieces:
                    out[k][pi][off:off + n].copy_(src[at:at + n])
        return out

    def masters(self) -> list:
        """Per group, per parameter fp32 masters (fresh tensors read from disk)."""
        return [self._gather(gi, ("param",))["param"] for gi in range(len(self.swappers))]

    def load_masters(self, masters: list) -> None:
        """Replaces the masters (per group, per parameter fp32 tensors), keeping the states bit for
        bit (the raw image is rewritten, so 8-bit states are not requantized)."""
        for gi, sw in enumerate(self.swappers):
            for i, part in enumerate(self.parts[gi]):
                img, lay = sw.read_image(i), sw.layout(i)
                new = self._assemble(part, lambda pi: masters[gi][pi].reshape(-1).float())
                img[lay["param"]:lay["param"] + 4 * part.n] = new.numpy().view(np.uint8)
                sw.write_image(i, img)

    # int8 states: CPUAdam's tensors (int8 exp_avg, uint8 exp_avg_sq, one fp32 scale per block of
    # each) copied to and from the raw images; partitions hold one parameter's block-aligned range.
    _Q8 = (("exp_avg", "m", torch.int8, 1), ("exp_avg_sq", "v", torch.uint8, 1),
           ("exp_avg_scale", "m_scale", torch.float32, 0), ("exp_avg_sq_scale", "v_scale", torch.float32, 0))

    def _q8_export(self, gi: int) -> list:
        from ..ops._kernels import qblocks
        group = self.optimizer.param_groups[gi]
        rows = [{k: torch.zeros(p.numel() if per_elem else qblocks(p.numel()), dtype=dt)
                 for k, _, dt, per_elem in self._Q8} for p in group["params"]]
        for i, part in enumerate(self.parts[gi]):
            img, lay = self.swappers[gi].read_image(i), self.swappers[gi].layout(i)
            (pi, off, _, n), = part.pieces
            for key, region, dt, per_elem in self._Q8:
                cnt = n if per_elem else qblocks(n)
                at = off if per_elem else off // self.qblock
                nbytes = cnt * (1 if per_elem else 4)
                raw = torch.from_numpy(img[lay[region]:lay[region] + nbytes].copy()).view(dt)
                rows[pi][key][at:at + cnt].copy_(raw)
        return rows

    def _q8_import(self, gi: int, rows: list) -> None:
        from ..ops._kernels import qblocks
        for i, part in enumerate(self.parts[gi]):
            sw = self.swappers[gi]
            img, lay = sw.read_image(i), sw.layout(i)
            (pi, off, _, n), = part.pieces
            for key, region, dt, per_elem in self._Q8:
                src = rows[pi].get(key)
                if src is None or src.dtype != dt:
                    raise ConfigError(f"the checkpoint's optimizer state has no {dt} '{key}' for a parameter; "
                                      f"it was not saved with state_dtype 'int8'. Load with "
                                      f"load_optimizer_states=False or use the state dtype it was saved with.")
                cnt = n if per_elem else qblocks(n)
                at = off if per_elem else off // self.qblock
                nbytes = cnt * (1 if per_elem else 4)
                img[lay[region]:lay[region] + nbytes] = \
                    src.reshape(-1)[at:at + cnt].contiguous().view(torch.uint8).numpy()
            sw.write_image(i, img)

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
                    if self.kind != "lion":
                        st["step"] = steps
                    state[idx] = st
                idx += 1
        return state

    def import_states(self, state: dict) -> None:
        """Inverse of :meth:`export_states` (a CPU-path checkpoint's state works too)."""
        idx = 0
        for gi, group in enumerate(self.optimizer.param_groups):
            sw = self.swappers[gi]
            keys = self._state_keys()
            rows = [state.get(idx + pi) for pi in range(len(group["params"]))]
            idx += len(group["params"])
            if all(r is None for r in rows):
                self._reset_states(gi)
                continue
            if any(r is None for r in rows):
                raise ConfigError("the checkpoint's optimizer state covers only some parameters of a group; "
                                  "nvme offload steps every parameter together. Load with "
                                  "load_optimizer_states=False.")
            if self.state_dtype == "int8":
                self._q8_import(gi, rows)
            else:
                if any(not r[k].is_floating_point() for r in rows for k in keys if k in r):
                    raise ConfigError("the checkpoint holds 8-bit optimizer states (state_dtype 'int8'); this "
                                      "engine runs state_dtype '" + self.state_dtype + "'. Set the same "
                                      "state_dtype or load with load_optimizer_states=False.")
                for i, part in enumerate(self.parts[gi]):
                    st = sw.get_state(i)
                    new = {k: self._assemble(part, lambda pi, k=k: rows[pi][k].reshape(-1).float())
                           for k in keys}
                    sw.set_state(i, st["param"], **new)
            steps = {int(r["step"]) for r in rows if "step" in r}
            if len(steps) > 1:
                raise ConfigError(f"the checkpoint's parameters were stepped different numbers of times "
                                  f"({sorted(steps)[:4]}); nvme offload keeps one step count per group.")
            sw.steps = steps.pop() if steps else 0

    def stats(self) -> list:
        return [sw.stats() for sw in self.swappers]

    def close(self) -> None:
        """Closes the swappers, which deletes their files (idempotent)."""
        self._finalizer()


def _close_all(swappers: list) -> None:
    for sw in swappers:
        try:
            sw.close()
        except Exception:  # noqa: BLE001 - closing everything matters more than one error
            pass
