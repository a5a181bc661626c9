"""The optimizer split between the GPU and the CPU (``offload_optimizer.ratio`` < 1).

:class:`TwoHalves` here is what the split does whatever holds its halves; split_store.StoreSplitPath,
over a parameter store's local space (every stage, any number of ranks), says how they are built.

``ratio`` is the fraction of the parameters (by elements) whose optimizer step runs on the
CPU (as near as whole parameters allow), as with ``offload_optimizer.device "cpu"``; the others keep their fp32 masters and
Adam's moments on the GPU and step there with torch's fused AdamW. The GPU's share is the
first parameters in the model's order: the next forward needs them first, and they are
ready as soon as the GPU's step is, while the CPU's weights are still being copied back.

A step: the gradient norm and the overflow flag are reduced over both halves (clipping
and fp16 loss scaling see the whole model, exactly as on one path); then the GPU's step is
queued (its kernels run on the GPU while the Python thread goes on) and the CPU's step
runs at the same time, so the step costs about the longer of the two instead of their sum.

Both halves run Adam/AdamW with the same hyperparameters: the engine's optimizer
(:class:`SplitOptimizer`) holds the param groups that LR schedulers change and hands them
to both before each step. The GPU's half keeps fp32 moments; the CPU's half keeps the
configured ``state_dtype`` (fp32, bf16 or 8-bit). The state_dict speaks the CPU path's
format (CPUAdam: an integer step and the moments per parameter, in the dtype its half
keeps), and on load each parameter's state is converted to its half's dtype
(:meth:`SplitOptimizer.state_dtypes`), so a checkpoint moves between a split engine, a
CPU-offloaded one and any ratio or state dtype.

``"auto"`` (:class:`AutoSplit`): the first step runs with the whole optimizer on the CPU (it
cannot run out of GPU memory where ratio 1 fits); then the split is sized from that step's
peak GPU memory: the GPU's share is the largest whose fp32 masters, moments and gradient
copies (16 bytes per element) fit in what the process may use (free memory, within
torch.cuda.set_per_process_memory_fraction) less the peak and a margin (8%, at least 512
MiB), and the CPU's at least the share that makes both sides finish together given their
measured step rates (:func:`choose_ratio`); every master and state moves to its new half
(:meth:`TwoHalves.resize`; with several ranks every rank takes the largest CPU share any chose).
On a CPU-only run it is 1 (nothing to split).
"""
from __future__ import annotations

import logging
import math
import time
import weakref

import torch

from .._optimizers import ALGORITHMS
from .cpu import HostPath
from .layout import FlatLayout
from .memory import Need, Sizes
from .optimizers import convert_adam_state
from .paths import OptimizerPath, indexed_groups

log = logging.getLogger("zspeed.split")

__all__ = ["TwoHalves", "SplitOptimizer", "AutoSplit", "choose_ratio", "device_memory"]

# Per element on the GPU for its share: fp32 master, exp_avg, exp_avg_sq, fp32 gradient copy.
GPU_BYTES_PER_ELEM = 16
# Group keys that choose how an optimizer runs, not the training's trajectory: not copied.
_OWN = {"params", "fused", "foreach", "capturable", "differentiable", "state_dtype", "torch_adam", "maximize"}


def choose_ratio(elems: int, gpu_budget: int | None, cpu_s_per_elem: float | None,
                 gpu_s_per_elem: float | None) -> float:
    """The CPU share for ``"auto"``: the smallest whose GPU share fits in ``gpu_budget`` bytes
    (GPU_BYTES_PER_ELEM per element), and at least the share that makes both sides finish
    together given their measured step rates; 1.0 without a budget (no GPU)."""
    if gpu_budget is None or elems <= 0:
        return 1.0
    fits = min(1.0, max(0.0, gpu_budget / (GPU_BYTES_PER_ELEM * elems)))  # GPU share that fits
    r = 1.0 - fits
    if cpu_s_per_elem and gpu_s_per_elem:
        # Both finish together when r * cpu = (1 - r) * gpu.
        r = max(r, gpu_s_per_elem / (gpu_s_per_elem + cpu_s_per_elem))
    return min(1.0, max(r, 1e-3))


# What "auto" leaves free on the GPU besides the measured peak: allocator fragmentation and
# batches a little larger than the first.
MARGIN_FRACTION = 0.08
MARGIN_MIN = 512 << 20


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(bytes this process may use on ``device``, the peak the caching allocator held since the
    last reset), or None where the device has no such accounting (the CPU). The peak is of
    reserved memory, not allocated: what step 1 needed includes the allocator's fragmentation
    (blocks cached but too small to reuse), which later steps need again."""
    from .memory import gpu_room
    limit = gpu_room(device)
    if limit is None:
        return None
    return limit, max(torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device))


def _allocator_setter():
    """torch's switch of the caching allocator's settings: the accelerator one of newer torch
    (torch.cuda's is deprecated there), else torch.cuda's; None in a torch without either."""
    new = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    return new if new is not None else getattr(getattr(torch.cuda, "memory", None), "_set_allocator_settings", None)


def _expandable_segments() -> bool:
    """Asks torch's caching allocator for expandable segments (new segments grow in place
    instead of leaving unusable gaps between a step's activations and the GPU share's long-lived
    buffers), where this torch has the switch and the user did not configure the allocator
    (PYTORCH_CUDA_ALLOC_CONF). True when they are on."""
    import os
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
    if "expandable_segments" in conf:
        return "expandable_segments:true" in conf.replace(" ", "").lower()
    setter = _allocator_setter()
    if setter is None:
        return False
    try:
        setter("expandable_segments:True")
    except Exception:  # noqa: BLE001 - a torch without the switch (a CPU build): the margin stays
        return False
    return True


class AutoSplit:
    """``ratio: "auto"``: the first step runs with the whole optimizer on the CPU, so it cannot
    run out of GPU memory where ratio 1 fits; its peak GPU memory (the model, its gradients,
    the activations of a real batch) then sizes the GPU's share: what the process may use, less
    that peak and a margin, holds the share's fp32 masters, moments and gradient copies."""

    def __init__(self, device: torch.device, cpu_s: float | None, gpu_s: float | None):
        self.device, self.cpu_s, self.gpu_s = device, cpu_s, gpu_s
        try:  # the first step's peak, not start-up's
            torch.cuda.reset_peak_memory_stats(device)
        except (RuntimeError, ValueError, AssertionError):
            pass  # a device without allocator statistics: nothing to reset

    def choose(self, path: "TwoHalves", elems: int) -> float:
        got = device_memory(self.device)
        if got is None:
            return 1.0
        limit, peak = got
        # The GPU share's buffers are allocated next: from fresh segments (the cache of step 1's
        # activations released first, and with expandable segments where torch has them), so that
        # they do not split the blocks the next steps' activations need.
        self.expandable = _expandable_segments()  # (the caching allocator's setting: for every GPU)
        torch.cuda.empty_cache()
        margin = max(MARGIN_MIN, int(MARGIN_FRACTION * limit))
        budget = max(0, limit - peak - margin)
        ratio = choose_ratio(elems, budget, self.cpu_s, self.gpu_s)
        rates = (f"; CPU {self.cpu_s * 1e9:.2f} ns/element, GPU {self.gpu_s * 1e9:.3f} ns/element"
                 if self.cpu_s and self.gpu_s else "")
        log.warning("zspeed: offload_optimizer.ratio \"auto\" -> %.3f after step 1: the CPU steps %.1f%% of the "
                    "parameters, the GPU %.1f%% (GPU limit %.2f GiB, peak of step 1 %.2f GiB reserved, margin %.2f GiB: "
                    "%.2f GiB for the GPU share at %d bytes/element%s%s)", ratio, 100 * ratio, 100 * (1 - ratio),
                    limit / 2**30, peak / 2**30, margin / 2**30, budget / 2**30, GPU_BYTES_PER_ELEM, rates,
                    "; expandable segments" if self.expandable else "")
        return ratio


class SplitOptimizer(torch.optim.Optimizer):
    """The engine's ``optimizer`` for a split step: param groups over the model's parameters
    (what LR schedulers and ``get_lr()`` touch); the step and the state are the halves'."""

    checkpoint_class = ALGORITHMS["Adam"].cpu_class  # both halves run Adam/AdamW

    def __init__(self, groups: list, defaults: dict, path: "TwoHalves"):
        super().__init__(groups, defaults)
        self._path_ref = weakref.ref(path)

    def step(self, closure=None):  # noqa: D401 - the engine steps through TwoHalves.apply
        raise RuntimeError("with offload_optimizer.ratio < 1 the optimizer step runs inside engine.step(); "
                           "do not call optimizer.step() yourself.")

    def state_dict(self):
        return {"state": self._path_ref().export_states(), "param_groups": indexed_groups(self.param_groups)}

    def state_dtypes(self) -> list:
        """Per parameter of the path's layout (in state_dict order), the state dtype its half
        keeps: "fp32" on the GPU (torch's AdamW), the configured state_dtype on the CPU. A
        checkpoint's states are converted to these on load."""
        return self._path_ref().state_dtypes()

    def group_state_dtypes(self) -> list:
        """Per group: None, as a group's parameters may lie on both halves; the path converts
        each state to its half's dtype when it is loaded (import_states)."""
        return [None] * len(self.param_groups)

    def validate_state_dict(self, state_dict) -> None:
        """ValueError for a state :meth:`load_state_dict` would refuse (the path's check_states,
        where it has one); reads and writes nothing."""
        check = getattr(self._path_ref(), "check_states", None)
        if check is not None:
            check(state_dict["state"])

    def load_state_dict(self, state_dict):
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params" and k not in _OWN})
        self._path_ref().import_states(state_dict["state"])


_HALF_SPANS = {"dev": "gpu step (split)", "disk": "nvme share (split)"}  # each half's span on the trace


class TwoHalves(OptimizerPath):
    """The split whatever holds its halves (split_store.StoreSplitPath builds them over a store's
    local space): a GPU half ``dev``, a CPU half
    ``cpu`` and, for the store split's three tiers, an NVMe half ``disk`` after it (any may be
    None), rebuilt by :meth:`_build` for a CPU share, the hyperparameters
    handed to both before each step, the GPU's step queued before the CPU's runs, and the
    resize of ``"auto"``. Subclasses say how the halves are built, how gradients reach them and
    how their masters and states map to the path's layout (:meth:`masters`,
    :meth:`export_states` keyed by the layout's running parameter index)."""

    @classmethod
    def bytes_needed(cls, plan, config, s: Sizes) -> list:
        """What this path holds (memory.py): the CPU's share as HostPath holds it, and on the GPU
        the GPU share's fp32 masters and fp32 Adam moments, whatever the CPU's state dtype
        (``s.cpu_share``: 1 until "auto" has chosen, the most the host can be asked for)."""
        return cls._cpu_tier(plan).bytes_needed(plan, config, s) + [
            Need("gpu", "fp32 masters and Adam moments of the GPU's share", 12 * cls.gpu_elems(s))]

    @staticmethod
    def _cpu_tier(plan) -> type:
        """The path class of the non-GPU share (what it holds where)."""
        return HostPath

    @staticmethod
    def gpu_elems(s: Sizes) -> int:
        """The elements of the rank's part the GPU steps."""
        return s.local - int(s.local * s.cpu_share)

    def __init__(self, layout: FlatLayout, args: dict, auto: "AutoSplit | None"):
        super().__init__(layout)
        self._args = args
        self.auto = auto          # "auto": sized after the first step (see step_done)
        self._hooked: list = []   # (module, the CPU half's hook handles) of hook_modules
        self._done: set = set()   # the halves (indices in _halves) whose part of the step under way ran
        self.dev = self.cpu = self.disk = None
        self._halves: list = []
        self._gmap: list = []     # per group: its index among the GPU half's groups, the CPU's (, the disk's) or None

    def _build(self, ratio: float) -> None:
        """The two halves for a CPU share of ``ratio`` (sets dev, cpu, _halves, _gmap, gpu_elems, cpu_share)."""
        raise NotImplementedError

    def _agree(self, ratio: float) -> float:
        """The CPU share every rank takes (one rank: its own)."""
        return ratio

    def _finish_build(self) -> None:
        self._halves = [h for _, h in self._named_halves()]
        self._done = set()

    def _optimizer(self, groups: list) -> "SplitOptimizer":
        defaults = (self.cpu or self.disk or self.dev).optimizer.defaults
        return SplitOptimizer([dict(g) for g in groups], dict(defaults), self)

    def state_dtypes(self) -> list:
        """Per parameter of the layout (in state_dict order), the state dtype its half keeps."""
        return [("fp32" if s == "dev" else self._half(s).optimizer.param_groups[sg].get("state_dtype", "fp32"))
                for s, sg in self._sides()]

    def _sides(self) -> list:
        """Per parameter of the layout, in order: ("dev" | "cpu" | "disk", its group in that half)."""
        raise NotImplementedError

    # -- "auto" ------------------------------------------------------------------------------
    def resize(self, ratio: float) -> None:
        """Moves the split to a CPU share of ``ratio``, between steps: every fp32 master and
        optimizer state goes to its new half (states converted to what that half keeps: fp32 on
        the GPU, the configured state_dtype on the CPU), the hyperparameters stay the engine's."""
        self.flush()
        # The old halves' masters and states stay referenced (not copied) until the new halves
        # hold them; the GPU's masters come to host memory on the way.
        masters = [[m.detach().to("cpu", torch.float32).reshape(-1) for m in row] for row in self.masters()]
        states = self.export_states()
        for module, handles in self._hooked:
            for h in handles:
                h.remove()
        old = self._halves
        self._build(ratio)
        self._each("set_trace", self.trace)
        self._hooked = [(m, self.cpu.hook_modules(m) if self.cpu is not None else []) for m, _ in self._hooked]
        targets = self.state_dtypes()
        shapes = [p.shape for ps in self.layout.params for p in ps]
        for idx, st in states.items():
            if "exp_avg" in st:
                states[idx] = convert_adam_state(st, targets[idx], math.prod(shapes[idx]), shapes[idx])
        self.load_masters(masters)
        self.import_states(states)
        del masters, states
        for h in old:
            h.close()

    def resize_host_bytes(self, ratio: float) -> int:
        """Host memory :meth:`resize` takes while the old halves still hold theirs: the new CPU
        half's fp32 masters, moments in the configured state dtype, gradient and weight buffers
        in the training dtype, and the GPU's new share on its way through host memory (fp32
        masters and fp32 moments, as they are converted for torch's AdamW)."""
        from .memory import moment_bytes
        total = sum(self.layout.totals)
        n = int(total * ratio)
        esize = torch.empty((), dtype=self._args["dtype"]).element_size()
        cpu = n * (4 + 2 * moment_bytes((self._args["params"] or {}).get("state_dtype", "fp32")) + 2 * esize)
        return int(cpu + (total - n) * 12)

    def step_done(self) -> None:
        """After a completed step: with ``"auto"``, the first one sizes the split (AutoSplit); with
        several ranks every rank takes the largest CPU share any of them chose."""
        auto, self.auto = self.auto, None
        if auto is not None:
            ratio = auto.choose(self, sum(self.layout.totals))
            from .memory import available_host_bytes
            need, avail = self.resize_host_bytes(ratio), available_host_bytes()
            if ratio < self.cpu_share and avail is not None and need > 0.9 * avail:
                log.warning("zspeed: offload_optimizer.ratio \"auto\": the split stays at %.3f: moving the state "
                            "to ratio %.3f needs %.2f GiB of host memory for a moment and %.2f GiB is available "
                            "(set \"ratio\": %.3f yourself to start with that split, which needs no move)",
                            self.cpu_share, ratio, need / 2**30, avail / 2**30, ratio)
                ratio = self.cpu_share
            ratio = self._agree(ratio)
            if ratio < self.cpu_share:
                with self.trace.span("auto split: resize", ratio=round(ratio, 4)):
                    self.resize(ratio)

    # -- the step -----------------------------------------------------------------------------
    @property
    def pinned(self) -> bool:
        return self.cpu.pinned if self.cpu is not None else False

    def _each(self, method: str, *args) -> None:
        """Calls ``method`` on both halves (the GPU's first)."""
        for h in self._halves:
            getattr(h, method)(*args)

    def _sync_groups(self) -> None:
        """The engine's hyperparameters (an LR schedule's lr) into both halves' groups."""
        for g, idx in zip(self.optimizer.param_groups, self._gmap):
            for h, i in zip((self.dev, self.cpu, self.disk), idx):
                if i is None:
                    continue
                target = h.optimizer.param_groups[i]
                for k, v in g.items():
                    if k not in _OWN and k in target:
                        target[k] = v

    def apply(self, factor: float) -> None:
        """The GPU's half queued first (its kernels run while the CPU steps the others), then the
        CPU's and the disk's; called again after a half raised, the halves that ran are not
        stepped again."""
        self._sync_groups()
        for i, (side, h) in enumerate(self._named_halves()):
            if i in self._done:
                continue
            span = _HALF_SPANS.get(side)  # the CPU's half has its own chunk spans
            if span is None:
                h.apply(factor)
            else:
                with self.trace.span(span):
                    h.apply(factor)
            self._done.add(i)
        self._done = set()

    def step_failed(self) -> bool:
        return any(h.step_failed() for h in self._halves)

    def abandon_step(self) -> None:
        self._done = set()
        self._each("abandon_step")

    # -- masters and state --------------------------------------------------------------------
    def _half(self, side: str):
        return {"dev": self.dev, "cpu": self.cpu, "disk": self.disk}[side]

    def _named_halves(self) -> list:
        """(side, half) of each half there is, in the order of ``_halves``."""
        return [(side, h) for side, h in (("dev", self.dev), ("cpu", self.cpu), ("disk", self.disk)) if h is not None]

    def _sub_index(self, side: str) -> list:
        """Per group of the half ``side``, the index of its first parameter in its optimizer's state_dict."""
        out, start = [], 0
        for ps in self._half(side).layout.params:
            out.append(start)
            start += len(ps)
        return out

    @property
    def checkpoint_class(self) -> str:
        return SplitOptimizer.checkpoint_class

    # -- the rest -----------------------------------------------------------------------------
    def stats(self, reset: bool = False) -> list:
        return [st for h in (self.cpu, self.disk) if h is not None for st in h.stats(reset)]

    def set_trace(self, tracer) -> None:
        self.trace = tracer
        self._each("set_trace", tracer)

    def flush(self) -> None:
        self._each("flush")

    def hook_modules(self, module: torch.nn.Module) -> list:
        handles = self.cpu.hook_modules(module) if self.cpu is not None else []
        self._hooked.append((module, handles))
        return [_Unhook(self, len(self._hooked) - 1)]

    def unhook_module(self, i: int) -> None:
        """Removes the hooks the CPU half holds now on the i-th module given to hook_modules."""
        module, handles = self._hooked[i]
        for h in handles:
            h.remove()
        self._hooked[i] = (module, [])

    def close(self) -> None:
        self._each("close")


class _Unhook:
    """The handle hook_modules returns: removes the hooks the CPU half holds now (a resize
    replaces them)."""

    def __init__(self, path: TwoHalves, i: int):
        self._path, self._i = weakref.ref(path), i

    def remove(self) -> None:
        path = self._path()
        if path is not None:
            path.unhook_module(self._i)


def measure_rates(device: torch.device, name: str, params: dict, force_native: bool,
                  num_threads: int | None, cpu_elems: int = 1 << 22,
                  repeats: int = 1, model_dtype: torch.dtype = torch.float32) -> tuple[float | None, float | None]:
    """(CPU, GPU) seconds per element of one Adam step (None where a side cannot be measured).

    The CPU's is the offloaded step as the engine runs it: gradients in the model's dtype in,
    the fp32 masters and state updated, and for a 16-bit model the new weights written out in
    that dtype (two bytes more read and written per element than an fp32 step), on
    ``cpu_elems`` elements, the median of ``repeats`` steps after a first (a buffer larger than
    the caches gives the rate of a real model's step; zspeed plan uses one)."""
    from .optimizers import build_device_optimizer, build_host_optimizer
    cpu_s = gpu_s = None
    n = int(cpu_elems)
    try:
        p = torch.zeros(n)
        g = [[torch.full((n,), 1e-3, dtype=model_dtype)]]
        out = [[torch.empty(n, dtype=model_dtype)]] if model_dtype in (torch.bfloat16, torch.float16) else None
        host = build_host_optimizer(name, params, [{"params": [p]}], client=None, force_native=force_native,
                                    num_threads=num_threads)
        host.step(g, 1.0, out)
        times = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            host.step(g, 1.0, out)
            times.append(time.perf_counter() - t0)
        cpu_s = sorted(times)[len(times) // 2] / n
    except Exception as e:  # noqa: BLE001 - the measurement only guides "auto"
        log.debug("zspeed: could not time the CPU step: %s", e)
    if device.type == "cuda":
        m = 1 << 24
        w = torch.zeros(m, device=device, requires_grad=True)
        w.grad = torch.full((m,), 1e-3, device=device)
        opt = build_device_optimizer(name, params, [{"params": [w]}], device)
        opt.step()
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.step()
        torch.cuda.synchronize(device)
        gpu_s = (time.perf_counter() - t0) / m
        del opt, w
    return cpu_s, gpu_s
