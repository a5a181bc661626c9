"""The optimizer path: where the fp32 master weights and the optimizer state live
and how one optimizer step reaches them.

The engine chooses one path at start-up and drives every step through the same
few calls, so its step algorithm does not depend on where the optimizer runs:

  before_backward(boundary) / after_backward()   around each micro-batch's backward
  gather()                    the boundary's gradients into the place the step reads
  grad_stats(scale)           (sum of squares of scale*g, any inf/NaN) over the
                              gradients this path steps: a local result, which several
                              ranks would all-reduce before deciding on the step
  apply(factor)               one optimizer step with every gradient multiplied by
                              factor, then the updated weights written into the model
  release()                   drop the step's gradients (after apply or a skipped step)
  masters() / load_masters()  the fp32 masters, for checkpoints
  saved_masters() / saved_state()
                              what a save writes of them (Deferred tensors, read as
                              they are written, where they live in swap files)
  grad_rows() / grads_edited()
                              after gather(), the gradients the step reads, per entry of
                              masters()'s rows, and the note that they were written
                              (the tensor-fragment API, fragments.py)
  param_states() / state_dict_from()
                              the optimizer state per parameter of the path's layout
                              and back, for checkpoints of several ranks (whose
                              "parameters" are a rank's pieces, see dp.py)
  optimizer                   what LR schedulers, get_lr() and checkpoints see
                              (its state_dict is the checkpoint's optimizer state)
  stats(reset) / close()      I/O statistics; release what lives outside Python's memory

The paths: :class:`DevicePath` and :class:`DeviceMasterPath` (here: torch's optimizer on
the model's device, over the model's own parameters or fp32 masters of them),
dp.ShardedDevicePath (the same over a parameter store's local space),
:class:`~zspeed.runtime.cpu.HostPath` (zero_optimization.offload_optimizer.device cpu),
:class:`~zspeed.runtime.nvme.NVMePath` (device nvme) and split_store.StoreSplitPath (a
ratio or max_in_cpu: the local space cut between the device, host memory and NVMe). The
offloaded ones derive from :class:`~zspeed.runtime.offload.OffloadedPath`, whose
:class:`~zspeed.runtime.offload.HostBuffers` hold the host memory and make the copies.
A path over a store (store.py: several ranks, ZeRO-3, or an offloaded optimizer) steps
the store's local space, this rank's part of the flat parameter space of layout.py;
docs/ARCHITECTURE.md follows one step through them.
"""
from __future__ import annotations

import abc

import torch

from .checkpoint_files import real
from .layout import FlatLayout
from .memory import Need, Sizes, state_bytes
from .trace import OFF
from .optimizers import build_device_optimizer, rebuild_like, torch_grad_stats

__all__ = ["OptimizerPath", "NoOptimizerPath", "DevicePath", "DeviceMasterPath", "device_path", "device_path_class", "copy_masters", "indexed_groups"]


def indexed_groups(param_groups: list) -> list:
    """``param_groups`` as a torch state_dict lists them: each group's settings, with "params"
    the running indices of its parameters."""
    out, start = [], 0
    for g in param_groups:
        n = len(g["params"])
        out.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(start, start + n))})
        start += n
    return out


class OptimizerPath(abc.ABC):
    """The interface the engine steps through (see the module docstring)."""

    optimizer: torch.optim.Optimizer
    # fp32 masters held in host memory, per group, per parameter (flat views);
    # None where they live elsewhere (on the device, on NVMe).
    host_masters: list | None = None

    def __init__(self, layout: FlatLayout):
        self.layout = layout

    @property
    def pinned(self) -> bool:
        """Whether the path's host buffers are page-locked (False without host buffers)."""
        return False

    def before_backward(self, boundary: bool) -> None:
        """Called before each micro-batch's backward; boundary: the step follows it."""

    def after_backward(self) -> None:
        """Called after each micro-batch's backward, also when it raised."""

    @abc.abstractmethod
    def gather(self) -> None:
        """Moves the boundary's gradients to where the step reads them."""

    @abc.abstractmethod
    def grad_stats(self, scale: float) -> tuple[float, bool]:
        """(sum of squares of scale*g, any non-finite value) over the gathered gradients."""

    @abc.abstractmethod
    def apply(self, factor: float) -> None:
        """One optimizer step over grad*factor; the updated weights go into the model. When it
        raises (an NVMe I/O error), the gradients are kept and calling it again, before the
        next backward, completes the step exactly once for every parameter."""

    def release(self) -> None:
        """The step is over (applied or skipped): drop its gradients."""
        self.zero_grad()

    def zero_grad(self) -> None:
        """Drops the model's gradients (engine.zero_grad() when no backward ran since the last step)."""
        for ps in self.layout.params:
            for p in ps:
                p.grad = None

    def drop_grads(self) -> None:
        """engine.zero_grad() after a backward that no step has read: every gradient this path
        holds for the next step (the model's .grad, reduced shards, host copies, gradients held
        in the parameter shards) is dropped, as if no backward had run since the last step. No
        step is under way then (the engine completes one in the background first, and refuses
        while one that raised partway is pending), so this is what the end of a step does."""
        self.release()

    @abc.abstractmethod
    def masters(self) -> list:
        """Per group, per parameter fp32 masters (flat or shaped like the parameter)."""

    @abc.abstractmethod
    def load_masters(self, masters: list) -> None:
        """Replaces every fp32 master (per group, per parameter tensors shaped like the
        parameters) and refreshes the model's weights from them."""

    def follow_edits(self, states: list) -> None:
        """ZeRO-3: parameters edited whole under GatheredParameters(modifier_rank=...) had their
        shards written (``states``: the fetcher's states of those parameters); the fp32 masters,
        and through them the optimizer's weights, follow."""
        sm = self.sharded
        self.flush()
        new = {(st.gi, st.pi): st.p.detach().reshape(-1) for st in states}
        rows = []
        for gi, (entries, ms) in enumerate(zip(sm.pieces, self.masters())):
            row = []
            for (pc, _at, n), m in zip(entries, ms):
                v = new.get((gi, pc.param)) if pc is not None else None
                row.append(v[pc.offset:pc.offset + n].to("cpu", torch.float32) if v is not None
                           else m.detach().reshape(-1).to("cpu", torch.float32, copy=True))
            rows.append(row)
        self.load_masters(rows)

    def grad_rows(self, create: tuple | None = None) -> list:
        """After gather(): per group, per entry of :meth:`masters`' rows, the gradient tensor the
        step reads (written in place by the tensor-fragment API), or None for a parameter without
        one this step; ``create=(group, entry)``: that entry gets a zero gradient first, which the
        step then applies."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its gradients")

    def grads_edited(self) -> None:
        """grad_rows()' tensors were written: statistics taken earlier (on the device, while the
        gradients were copied) are stale."""

    @property
    def sharded(self):
        """The parameter store (store.py) whose local space this path steps (several ranks,
        ZeRO-3, or an offloaded optimizer at any stage), else None."""
        return getattr(getattr(self, "buffers", None), "sm", None)

    # Whether load_masters() and the optimizer's load_state_dict() take checkpoint_files.Deferred
    # tensors (a checkpoint load's, read when used) and read them one at a time; otherwise the
    # load reads them all first.
    takes_deferred = False

    def saved_masters(self) -> list:
        """:meth:`masters` as a checkpoint save writes them: a path that keeps them in swap files
        returns checkpoint_files.Deferred tensors, read when the writer reaches each one."""
        return self.masters()

    def saved_state(self) -> dict:
        """The optimizer's torch-style state (index -> dict) as a checkpoint save writes it: a
        path that keeps it in swap files returns checkpoint_files.Deferred tensors."""
        return self.optimizer.state_dict()["state"]

    def param_states(self, saved: bool = False) -> list:
        """Per group, per parameter of this path's layout, the optimizer's state as a dict
        (tensors as the optimizer holds them), or None where it has none. With several ranks
        the layout's parameters are the rank's pieces and padding (ParamStore.pieces).
        ``saved``: as a save writes it (:meth:`saved_state`)."""
        state = self.saved_state() if saved else self.optimizer.state_dict()["state"]
        out, idx = [], 0
        for ps in self.layout.params:
            out.append([state.get(idx + i) for i in range(len(ps))])
            idx += len(ps)
        return out

    def state_dict_from(self, rows: list, groups: list) -> dict:
        """The optimizer state_dict holding ``rows`` (the shape :meth:`param_states` returns)
        and ``groups`` (param_groups with their "params" indices). ValueError for rows that
        do not fit this path."""
        if [len(r) for r in rows] != [len(ps) for ps in self.layout.params]:
            raise ValueError("the optimizer state does not have one entry per parameter of this path")
        state, idx = {}, 0
        for row in rows:
            for st in row:
                if st is not None:
                    state[idx] = st
                idx += 1
        return {"state": state, "param_groups": groups}

    @property
    def checkpoint_class(self) -> str:
        """The optimizer's class as checkpoints record it."""
        return getattr(self.optimizer, "checkpoint_class", type(self.optimizer).__name__)

    def stats(self, reset: bool = False) -> list:
        """Per parameter group, statistics of the path's I/O ([] where it has none)."""
        return []

    trace = OFF

    def set_trace(self, tracer) -> None:
        """The engine's timeline (trace.py); the path records its own phases into it."""
        self.trace = tracer
        buffers = getattr(self, "buffers", None)
        if buffers is not None:
            buffers.trace = tracer

    def flush(self) -> None:
        """Completes any optimizer work still in flight (the delayed update of cpu.py), so that
        the masters, the optimizer state and the model agree."""

    def step_failed(self) -> bool:
        """Whether an optimizer step running in the background stopped partway (flush() raised
        its error, and the next flush() completes it)."""
        return False

    def abandon_step(self) -> None:
        """Forgets a step that stopped partway, before a checkpoint load replaces the masters
        and the optimizer state it touched (a step still running is waited for first)."""
        self.flush()

    def step_done(self) -> None:
        """Called after each completed (not skipped) optimizer step."""

    def hook_modules(self, module: torch.nn.Module) -> list:
        """Hooks the path needs on the model's modules (offload_optimizer.overlap_forward: cpu.py);
        returns their handles."""
        return []

    def close(self) -> None:
        """Releases what the path holds outside Python's memory (idempotent)."""


class NoOptimizerPath(OptimizerPath):
    """The path of an engine built without an optimizer (inference: zspeed.initialize with no
    optimizer= and no 'optimizer' section, DeepSpeed's ZeRO-Inference). Nothing is trained: the
    layout is empty, there are no masters and no optimizer state; a gradient step raises."""

    optimizer = None

    def __init__(self, layout: FlatLayout):
        super().__init__(layout)

    @staticmethod
    def refuse(what: str, fix: str = ""):
        """The NoOptimizerError of a training call ``what`` (``fix``: what to do instead, if not
        to build the engine with an optimizer)."""
        from .errors import NoOptimizerError
        return NoOptimizerError(
            f"{what}: this engine was built without an optimizer (neither optimizer= nor an 'optimizer' section "
            f"in the config), so it runs the model's forward only (inference, as DeepSpeed's ZeRO-Inference). "
            f"{fix or 'To train, build the engine with an optimizer'}: add e.g. \"optimizer\": {{\"type\": "
            f"\"AdamW\", \"params\": {{\"lr\": 1e-4}}}} to the config, or pass optimizer= to zspeed.initialize.")

    def gather(self) -> None:
        raise self.refuse("engine.backward()")

    def grad_stats(self, scale: float) -> tuple[float, bool]:
        raise self.refuse("engine.step()")

    def apply(self, factor: float) -> None:
        raise self.refuse("engine.step()")

    def masters(self) -> list:
        return []

    def load_masters(self, masters: list) -> None:
        if any(masters):
            raise self.refuse("loading master weights")

    @property
    def checkpoint_class(self) -> str:
        return "none"


class DevicePath(OptimizerPath):
    """torch's optimizer on the model's device (offload_optimizer.device none) over an fp32
    model's parameters themselves (bf16/fp16 models: DeviceMasterPath)."""

    def __init__(self, layout: FlatLayout, device: torch.device, dtype: torch.dtype, name: str | None,
                 params: dict, client: torch.optim.Optimizer | None):
        super().__init__(layout)
        self._masters = self._make_masters(layout)
        if client is not None:
            self.optimizer = self._client_over_masters(client)
        else:
            self.optimizer = build_device_optimizer(name, params, layout.with_params(self._masters), device)
        self._grads: list = []
        self._scaled = False  # the gradients of the step under way were multiplied by its factor

    @classmethod
    def bytes_needed(cls, plan, config, s: Sizes) -> list:
        """What this path holds (memory.py): the whole model's gradients and the optimizer's state
        on the device (an fp32 model's parameters are their own masters)."""
        sd, per = state_bytes(config)
        return [Need("gpu", "gradients", s.esize * s.total),
                Need("gpu", f"{cls._MASTERS_LABEL}optimizer state ({sd})", int((cls._MASTER_BYTES + per) * s.total))]

    _MASTERS_LABEL, _MASTER_BYTES = "", 0

    def _make_masters(self, layout: FlatLayout) -> list:
        return [list(ps) for ps in layout.params]  # the parameters are their own masters

    def _client_over_masters(self, client):
        return client

    def _grad_of(self, p, m):
        """The gradient the optimizer reads for parameter p (its master m), or None."""
        return p.grad

    def gather(self) -> None:
        self._grads = []
        for ps, ms in zip(self.layout.params, self._masters):
            for p, m in zip(ps, ms):
                g = None if p.grad is None else self._grad_of(p, m)
                if g is not None:
                    self._grads.append(g)

    def grad_stats(self, scale: float) -> tuple[float, bool]:
        return torch_grad_stats(self._grads, scale)

    def grad_rows(self, create: tuple | None = None) -> list:
        rows = []
        for gi, (ps, ms) in enumerate(zip(self.layout.params, self._masters)):
            row = []
            for pi, (p, m) in enumerate(zip(ps, ms)):
                g = self._held_grad(p, m)
                if g is None and create == (gi, pi):
                    g = self._new_grad(p, m)
                    self._grads.append(g)
                row.append(g)
            rows.append(row)
        return rows

    def _held_grad(self, p, m):
        """After gather(): the gradient the optimizer reads for parameter p (master m), or None."""
        return p.grad

    def _new_grad(self, p, m):
        p.grad = torch.zeros_like(p)
        return p.grad

    def apply(self, factor: float) -> None:
        # Called again after it raised: the gradients are scaled once.
        if factor != 1.0 and self._grads and not self._scaled:
            torch._foreach_mul_(self._grads, factor)
        self._scaled = True
        self.optimizer.step()
        self._copy_to_model()
        self._scaled = False

    def abandon_step(self) -> None:
        self._scaled = False

    def release(self) -> None:
        self._grads = []
        self._scaled = False
        self.zero_grad()

    def masters(self) -> list:
        return self._masters

    def load_masters(self, masters: list) -> None:
        copy_masters(self._masters, masters)
        self._copy_to_model()

    def _copy_to_model(self) -> None:
        """The optimizer's weights into the model (nothing to do: they are the model's)."""


class DeviceMasterPath(DevicePath):
    """DevicePath for a bf16/fp16 model: the optimizer updates fp32 copies (the masters) from
    fp32 copies of the gradients, and the parameters are refreshed from the masters after
    each step."""

    _MASTERS_LABEL, _MASTER_BYTES = "fp32 masters and ", 4

    def _make_masters(self, layout: FlatLayout) -> list:
        return [[p.detach().clone().float() for p in ps] for ps in layout.params]

    def _client_over_masters(self, client):
        return rebuild_like(client, self._masters)

    def _grad_of(self, p, m):
        m.grad = p.grad.detach().float()
        return m.grad

    def _held_grad(self, p, m):
        return m.grad

    def _new_grad(self, p, m):
        m.grad = torch.zeros_like(m)
        return m.grad

    def gather(self) -> None:
        for ms in self._masters:  # a parameter without a gradient this time: its master has none
            for m in ms:
                m.grad = None
        super().gather()

    def zero_grad(self) -> None:
        super().zero_grad()
        for ms in self._masters:
            for m in ms:
                m.grad = None

    def _copy_to_model(self) -> None:
        with torch.no_grad():
            for ps, ms in zip(self.layout.params, self._masters):
                for p, m in zip(ps, ms):
                    p.data.copy_(m)


def device_path(layout: FlatLayout, device: torch.device, dtype: torch.dtype, name: str | None, params: dict,
                client) -> DevicePath:
    """The device path for a model of ``dtype``: over the parameters themselves (fp32), or
    over fp32 masters (bf16/fp16)."""
    return device_path_class(dtype)(layout, device, dtype, name, params, client)


def device_path_class(dtype: torch.dtype) -> type:
    """DevicePath for an fp32 model, DeviceMasterPath for a bf16/fp16 one."""
    return DevicePath if dtype == torch.float32 else DeviceMasterPath


def copy_masters(dst: list, src: list) -> None:
    """Copies per group, per parameter tensors ``src`` into the masters ``dst`` (any shape of
    the same number of elements, any device)."""
    with torch.no_grad():
        for ms, srcs in zip(dst, src):
            for m, s in zip(ms, srcs):
                m.copy_(real(s).to(m.device).reshape(m.shape))
