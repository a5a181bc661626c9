"""DeepSpeed's activation checkpointing API (``deepspeed.checkpointing``), with the saved
layer inputs optionally kept in host memory.

``checkpoint(function, *args)`` runs ``function`` without keeping its intermediate
activations and runs it again during backward to rebuild them, as
torch.utils.checkpoint does; only its inputs are kept. With ``cpu_checkpointing``
(``configure(checkpoint_in_cpu=True)`` or the config section
``activation_checkpointing.cpu_checkpointing``) those inputs live in page-locked host
memory instead of on the GPU: they are copied out on a side stream during forward, and
copied back ahead of their recomputation: when the backward of one checkpointed call
starts, the inputs of the call before it (the next to be recomputed) start their
host-to-device copy on the side stream, so the copy overlaps that backward.

The random state is restored for the recomputation (dropout draws the same mask twice):
the CPU and CUDA generators and the states in the RNG tracker (``get_cuda_rng_tracker``).
The recomputed forward therefore gives the same values as the first one, and the
gradients are those of an uncheckpointed run.

Differences from DeepSpeed, on purpose: ``partition_activations`` splits saved inputs
across model-parallel ranks in DeepSpeed; zspeed has no model parallelism, so the key is
accepted and changes nothing. DeepSpeed moves checkpoints to the CPU only together with
``partition_activations``; zspeed's ``cpu_checkpointing`` works on its own.
``contiguous_memory_optimization`` and ``number_checkpoints`` (a preallocated buffer for
partitioned checkpoints) are accepted and have no effect; ``synchronize_checkpoint_boundary``
synchronizes the device around each call, and ``profile`` logs each call's forward and
backward time.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import time
from typing import Any

import torch

log = logging.getLogger("zspeed.checkpointing")

__all__ = ["configure", "is_configured", "reset", "checkpoint", "set_num_layers",
           "partition_activations_in_checkpoint", "get_cuda_rng_tracker", "model_parallel_cuda_manual_seed",
           "CudaRNGStatesTracker", "non_reentrant_checkpoint", "detach_variable"]

_MODEL_PARALLEL_RNG = "model-parallel-rng"

_cfg: dict = {}
_defaults = dict(partition_activations=False, contiguous_memory_optimization=False, number_checkpoints=None,
                 cpu_checkpointing=False, synchronize_checkpoint_boundary=False, profile=False)
_num_layers = None


def configure(mpu_=None, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None) -> None:
    """DeepSpeed's ``configure``: settings from ``deepspeed_config`` (a config dict, JSON path or a
    parsed zspeed config) and then from the keyword arguments, which win. ``mpu_`` (model
    parallelism) must be None: zspeed has none."""
    if mpu_ is not None:
        from .runtime.config import ConfigError
        raise ConfigError("activation checkpointing with a model-parallel unit (mpu) needs model parallelism, "
                          "which zspeed does not have; pass mpu_=None.")
    new = dict(_defaults)
    if deepspeed_config is not None:
        from .runtime.config import parse_config
        c = deepspeed_config if hasattr(deepspeed_config, "activation_checkpointing") else \
            parse_config(deepspeed_config)
        new.update(c.activation_checkpointing)
    for key, value in (("partition_activations", partition_activations),
                       ("contiguous_memory_optimization", contiguous_checkpointing),
                       ("number_checkpoints", num_checkpoints), ("cpu_checkpointing", checkpoint_in_cpu),
                       ("synchronize_checkpoint_boundary", synchronize), ("profile", profile)):
        if value is not None:
            new[key] = value
    _cfg.clear()
    _cfg.update(new)


def is_configured() -> bool:
    return bool(_cfg)


def reset() -> None:
    """Forget what configure() set and the host copies' prefetch state."""
    _cfg.clear()
    _Prefetch.pending.clear()


def detach_variable(inputs, device=None) -> tuple:
    """DeepSpeed's helper: a tuple of ``inputs`` with each tensor detached (moved to ``device``
    when given) and keeping its requires_grad; other items as they are. Only a tuple is
    accepted (RuntimeError otherwise, as DeepSpeed)."""
    if not isinstance(inputs, tuple):
        raise RuntimeError(f"detach_variable takes a tuple of tensors, got {type(inputs).__name__}.")
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = (x if device is None else x.to(device=device)).detach()
            y.requires_grad = x.requires_grad
            x = y
        out.append(x)
    return tuple(out)


def set_num_layers(nlayers) -> None:
    global _num_layers
    _num_layers = nlayers


def partition_activations_in_checkpoint(partition_activation) -> None:
    _cfg["partition_activations"] = bool(partition_activation)


def _setting(key):
    return _cfg.get(key, _defaults[key])


# -- random states ---------------------------------------------------------------------------------
class CudaRNGStatesTracker:
    """Named CUDA random states (DeepSpeed's tracker): ``add(name, seed)`` creates one, ``fork(name)``
    runs a block with it and keeps what the block drew."""

    def __init__(self):
        self.states_: dict = {}
        self.seeds_: set = set()

    def reset(self) -> None:
        self.states_, self.seeds_ = {}, set()

    def get_states(self) -> dict:
        return copy.copy(self.states_)

    def set_states(self, states: dict) -> None:
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} is already tracked")
        if name in self.states_:
            raise ValueError(f"random state {name!r} is already tracked")
        self.seeds_.add(seed)
        dev = _rng_device()
        saved = dev.get_rng_state()
        dev.manual_seed(seed)
        self.states_[name] = dev.get_rng_state()
        dev.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG):
        if name not in self.states_:
            raise ValueError(f"random state {name!r} is not tracked (add it first)")
        dev = _rng_device()
        saved = dev.get_rng_state()
        dev.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = dev.get_rng_state()
            dev.set_rng_state(saved)


class _CpuRng:
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)
    manual_seed = staticmethod(torch.manual_seed)


def _rng_device():
    """The generator the tracker manages: CUDA's when torch sees a GPU, else the CPU's."""
    return torch.cuda if torch.cuda.is_available() else _CpuRng


_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker() -> CudaRNGStatesTracker:
    return _TRACKER


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """DeepSpeed's seeding: the default generator gets ``seed``; the tracked model-parallel state
    gets ``seed + 2718`` (plus the tensor-parallel rank, always 0 here)."""
    _TRACKER.reset()
    _rng_device().manual_seed(seed)
    _TRACKER.add(_MODEL_PARALLEL_RNG, seed + 2718)


def _rng_snapshot(devices) -> tuple:
    cuda = {d: torch.cuda.get_rng_state(d) for d in devices}
    return torch.get_rng_state(), cuda, _TRACKER.get_states()


def _rng_restore(snap) -> None:
    cpu, cuda, tracked = snap
    torch.set_rng_state(cpu)
    for d, st in cuda.items():
        torch.cuda.set_rng_state(st, d)
    _TRACKER.set_states({k: v.clone() for k, v in tracked.items()})


# -- host copies of the saved inputs ----------------------------------------------------------------
class _HostCopy:
    """A tensor input kept in page-locked host memory between forward and recomputation."""

    def __init__(self, t: torch.Tensor, stream):
        self.device, self.requires_grad = t.device, t.requires_grad
        self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        # The producer is the stream current here, outside the side stream's context (inside it,
        # current_stream() would be the side stream itself and the copy could read t before the
        # kernel writing it has run: seen as wrong gradients once the page-locked blocks were
        # reused, i.e. when no fresh cudaHostAlloc synchronized the device any more).
        producer = torch.cuda.current_stream(t.device)
        stream.wait_stream(producer)
        with torch.cuda.stream(stream):
            self.host.copy_(t.detach(), non_blocking=True)
            t.record_stream(stream)
        self.back = None
        self.ready = None

    def prefetch(self, stream) -> None:
        """Starts the copy back to the device on the side stream (once)."""
        if self.back is not None:
            return
        with torch.cuda.stream(stream):
            self.back = torch.empty(self.host.shape, dtype=self.host.dtype, device=self.device)
            self.back.copy_(self.host, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record(stream)

    def get(self, stream) -> torch.Tensor:
        """The input back on the device, for this recomputation only: the copy is not kept (the
        autograd context holding this object lives until the whole backward ends, and keeping
        every block's copy would bring all the inputs back to the GPU by then)."""
        self.prefetch(stream)
        back, ready, self.back, self.ready = self.back, self.ready, None, None
        cur = torch.cuda.current_stream(self.device)
        cur.wait_event(ready)
        back.record_stream(cur)
        return back


class _Saved:
    """What a checkpointed call keeps for its recomputation (held by its autograd context, so
    it goes away with the graph, backward or not)."""
    __slots__ = ("items", "__weakref__")

    def __init__(self, items):
        self.items = items


class _Prefetch:
    """The checkpointed calls of the current forward whose inputs are on the host, in order (weak
    references: a graph dropped without backward takes its host copies with it); the backward of
    a call prefetches the inputs of the live call before it."""
    pending: list = []
    stream = None

    @classmethod
    def add(cls, saved: "_Saved") -> int:
        import weakref
        cls.pending = [r for r in cls.pending if r() is not None]
        cls.pending.append(weakref.ref(saved))
        return len(cls.pending) - 1

    @classmethod
    def before(cls, saved: "_Saved"):
        """The live call recorded just before ``saved`` (None if it is the first)."""
        prev = None
        for r in cls.pending:
            s = r()
            if s is saved:
                return prev
            if s is not None:
                prev = s
        return None

    @classmethod
    def side(cls, device):
        if cls.stream is None or cls.stream.device != device:
            cls.stream = torch.cuda.Stream(device=device)
        return cls.stream


def _detach(x):
    if torch.is_tensor(x):
        d = x.detach()
        d.requires_grad_(x.requires_grad)
        return d
    return x


class _Checkpoint(torch.autograd.Function):
    """Forward without keeping activations; backward recomputes them (see the module docstring)."""

    @staticmethod
    def forward(ctx, run_function, outputs_box, *args):
        ctx.run_function = run_function
        ctx.sync, ctx.profile = _setting("synchronize_checkpoint_boundary"), _setting("profile")
        devices = sorted({a.device.index for a in args if torch.is_tensor(a) and a.is_cuda})
        ctx.devices = devices
        ctx.rng = _rng_snapshot(devices)
        ctx.grad_enabled = torch.is_grad_enabled()
        if ctx.sync and devices:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            outputs = run_function(*args)
        if ctx.profile:
            log.info("checkpoint forward: %.3f ms", 1e3 * (time.perf_counter() - t0))
        on_host = _setting("cpu_checkpointing") and devices
        saved, kinds = [], []
        for a in args:
            if torch.is_tensor(a) and on_host and a.is_cuda:
                saved.append(_HostCopy(a, _Prefetch.side(a.device)))
                kinds.append("host")
            elif torch.is_tensor(a):
                saved.append(a)
                kinds.append("tensor")
            else:
                saved.append(a)
                kinds.append("other")
        ctx.saved, ctx.kinds = _Saved(saved), kinds
        ctx.on_host = bool(on_host)
        if on_host:
            _Prefetch.add(ctx.saved)
        if ctx.sync and devices:
            torch.cuda.synchronize()
        outs = outputs if isinstance(outputs, tuple) else (outputs,)
        outputs_box.extend(outs)
        ctx.n_out = len(outs)
        tensors = [o for o in outs if torch.is_tensor(o)]
        ctx.mark_non_differentiable(*[o for o in tensors if not o.is_floating_point()])
        return tuple(tensors)

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("zspeed.checkpointing.checkpoint does not work with torch.autograd.grad(); "
                               "use .backward() (engine.backward).")
        if ctx.on_host:  # the next call to recompute: start its copy back now
            prev = _Prefetch.before(ctx.saved)
            for s in prev.items if prev is not None else ():
                if isinstance(s, _HostCopy):
                    s.prefetch(_Prefetch.side(s.device))
        args = []
        for s, kind in zip(ctx.saved.items, ctx.kinds):
            if kind == "host":
                t = s.get(_Prefetch.side(s.device))
                t.requires_grad_(s.requires_grad)
                args.append(t)
            else:
                args.append(_detach(s))
        if ctx.sync and ctx.devices:
            torch.cuda.synchronize()
        now = _rng_snapshot(ctx.devices)
        _rng_restore(ctx.rng)
        t0 = time.perf_counter()
        try:
            with torch.enable_grad():
                outputs = ctx.run_function(*args)
        finally:
            _rng_restore(now)
        outs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip([o for o in outs if torch.is_tensor(o)], grads)
                 if o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        if ctx.profile:
            log.info("checkpoint backward: %.3f ms", 1e3 * (time.perf_counter() - t0))
        if ctx.sync and ctx.devices:
            torch.cuda.synchronize()
        return (None, None) + tuple(a.grad if torch.is_tensor(a) else None for a in args)


def checkpoint(function, *args, **kwargs) -> Any:
    """DeepSpeed's ``checkpoint(function, *args)``: ``function(*args, **kwargs)`` with its
    activations recomputed during backward (and its tensor inputs on the host with
    cpu_checkpointing). Returns what ``function`` returns."""
    if not torch.is_grad_enabled():  # no backward will come: nothing to save or recompute
        return function(*args, **kwargs)
    if kwargs:
        keys, n = tuple(kwargs), len(args)
        fn = function

        def function(*all_args):
            return fn(*all_args[:n], **dict(zip(keys, all_args[n:])))
        args = args + tuple(kwargs.values())
    box: list = []
    tensors = _Checkpoint.apply(function, box, *args)
    # Non-tensor outputs come from the box; tensor outputs from autograd (they carry the graph).
    it = iter(tensors)
    outs = [next(it) if torch.is_tensor(o) else o for o in box]
    return outs[0] if len(outs) == 1 else tuple(outs)


def non_reentrant_checkpoint(function, *args):
    """DeepSpeed's non-reentrant variant: torch.utils.checkpoint without reentrancy (no host copies)."""
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
