"""ZeRO-Offload's optimizer path: fp32 masters and optimizer state in CPU memory
(zero_optimization.offload_optimizer.device = cpu).

Per parameter group, host buffers (flat, views per parameter; offload.py):
  grads    gradients in the model's dtype (HostBuffers; on the CPU-only path the
           optimizer reads them where autograd left them)
  masters  fp32 master weights, the CPU optimizer's parameters
  out      updated weights in the model's dtype, copied back into the model; for an
           fp32 model the masters themselves
On a CPU-only machine with contiguous parameters the buffers that can be the
parameters' own storage are: an fp32 model's parameters are its masters, and a
bf16/fp16 model's parameters are the out buffer the optimizer writes into, so
nothing is copied back.

The step runs in chunks of about zero_optimization.sub_group_size elements
(capped, whole parameters), each followed by the copy of its weights back into
the model, so that on CUDA the H2D copy of one chunk overlaps the CPU work of
the next. Every parameter's update is independent, so the chunking changes no bit.

Delayed update (offload_optimizer.delayed_update, off by default; the ZeRO-Offload
paper's one-step delayed parameter update): apply() starts the CPU step in a
background thread and returns, so the step of boundary t runs while the GPU does
forward and backward of boundary t+1 on the weights it has (those of t-1). At the
next gather() the thread is joined and its weights are written into the model; the
gradients of t+1 (computed on the older weights) are then applied to the newer
masters: every update is one step stale. The optimizer's hyperparameters are
captured when the step starts (a scheduler step afterwards does not change it), the
gradients of the next backward go into a second host buffer, and the step writes
its weights into its own buffers, never into the model's. Anything that reads or
replaces the masters or the optimizer state (checkpoints, GatheredParameters edits)
first finishes the step in flight and writes its weights back (:meth:`flush`).

Overlap with the next forward (offload_optimizer.overlap_forward, off by default; exact):
apply() starts the CPU step in a background thread and returns. The thread steps the
chunks in the model's parameter order and queues each chunk's weights to the model as soon
as the chunk is done (on CUDA on a copy stream, with an event per chunk). The next forward
waits, module by module, only for the chunk holding that module's last parameter
(:meth:`wait_chunk`, called from forward pre-hooks that :meth:`hook_modules` registers), so
the first layers compute while the CPU still steps the last. The gradients, the decision to
step (overflow) and the clipping factor are all known before the thread starts: every update
equals the synchronous step's. The next backward, checkpoints and anything reading the
masters wait for the whole step first (:meth:`flush`).
"""
from __future__ import annotations

import contextlib
import copy
import threading
import weakref

import torch

from .hooks import EngineHook
from .layout import FlatLayout
from .offload import HostBuffers, OffloadedPath
from .optimizers import build_host_optimizer
from .paths import copy_masters

__all__ = ["HostPath", "CHUNK_CAP"]

CHUNK_CAP = 1 << 26  # elements per optimizer chunk at most


class HostPath(OffloadedPath):
    """The CPU optimizer over fp32 masters in host memory."""

    def __init__(self, layout: FlatLayout, buffers: HostBuffers, name: str | None, params: dict, *,
                 client: torch.optim.Optimizer | None, force_native: bool, chunk_elems: int,
                 num_threads: int | None = None, timing: str = "sync"):
        super().__init__(layout, buffers)
        lowp = buffers.model_dtype != torch.float32
        if timing not in ("sync", "overlap", "delayed"):
            raise ValueError(f"timing {timing!r} is not sync, overlap or delayed")
        self.timing = timing
        delayed = self.delayed = timing == "delayed"
        overlap = self.overlap = timing == "overlap"
        self._inflight: _InFlight | None = None  # overlap: the step running in the background
        self._copy_stream = torch.cuda.Stream(device=buffers.device) if overlap and buffers.cuda else None
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        # The step under way (see _advance): running in the background, or stopped partway.
        self._pending: _Pending | None = None
        # Host parameters (a CPU model, or ZeRO-3 shards offloaded to host memory) can be the
        # buffers the optimizer writes (not with the delayed update: the model trains meanwhile).
        shared = not delayed and all(p.device.type == "cpu" and p.is_contiguous()
                                     for ps in layout.params for p in ps)
        own = [[p.data.view(-1) for p in ps] for ps in layout.params] if shared else None
        if own is not None and not lowp:
            self.host_masters = own
        else:
            _, self.host_masters = buffers.alloc(torch.float32)
            with torch.no_grad():
                for ps, ms in zip(layout.params, self.host_masters):
                    for p, m in zip(ps, ms):
                        m.copy_(p.detach().reshape(-1).to("cpu", torch.float32))
        if not lowp:
            self._out = self.host_masters
        elif own is not None:
            self._out = own
        else:
            _, self._out = buffers.alloc(buffers.model_dtype)
        # What the optimizer writes besides the masters: the low-precision weights.
        self._lowp_out = self._out if lowp else None
        self.host = build_host_optimizer(name, params, layout.with_params(self.host_masters), client=client,
                                         force_native=force_native, num_threads=num_threads)
        self.optimizer = self.host.optimizer
        self.chunks = _chunks(layout, chunk_elems)
        self._chunk_of = {k: i for i, c in enumerate(self.chunks) for k in c}
        self._waits: list = []
        if overlap:
            self._plan_waits()

    def _plan_waits(self) -> None:
        """overlap: what the next forward can wait for, in the order the background step makes
        it ready. One rank: each chunk (its weights copied into the model). Several ranks: each
        unit of the partition plan, all-gathered (on a process group of the step's own) once the
        chunks holding this rank's shard of it are stepped; units come in local order, so each
        needs a chunk no earlier than the one before."""
        sm = self.sharded
        self._bg_group = None
        if sm is None:
            self._waits = [(i, None) for i in range(len(self.chunks))]
            return
        self._bg_group = sm.comm.new_group()
        units = sm.entry_units()
        last: dict = {}
        for (gi, ei), ci in self._chunk_of.items():
            key = (gi, units[gi][ei])
            last[key] = max(last.get(key, -1), ci)
        self._waits = [(last[(gi, ui)], (gi, ui)) for gi, gp in enumerate(sm.plan.groups)
                       for ui in range(len(gp.units))]

    def _wait_index(self, p: torch.Tensor) -> int | None:
        """overlap: the wait (see _plan_waits) after which the model parameter p holds this
        step's weights; None for a parameter this path does not step."""
        sm = self.sharded
        if sm is None:
            key = self.layout.index.get(id(p))
            return None if key is None else self._chunk_of[key]
        key = sm.layout.index.get(id(p))
        if key is None:
            return None
        gi, pi = key
        unit = sm.plan.groups[gi].unit_of[pi]
        return sum(len(gp.units) for gp in sm.plan.groups[:gi]) + unit

    def _host_grad_stats(self, tensors: list, scale: float) -> tuple[float, bool]:
        return self.host.grad_stats(tensors, scale)

    def gather(self) -> None:
        if self.delayed:
            self.flush()
        super().gather()

    def apply(self, factor: float) -> None:
        if self.delayed:
            self._start_delayed(factor)
            return
        if self.overlap:
            self._start_overlapped(factor)
            return
        pend = self._pending
        if pend is None:  # a new step (else: the retry of one that raised partway, see _advance)
            with self.trace.span("wait for last step's copies"):
                self.buffers.wait_host_buffers()
            pend = self._pending = _Pending("sync", self.host, [self._select(c) for c in self.chunks], factor)
        self._advance(pend)
        self.buffers.end_write_back()
        self._pending = None

    # -- steps in the background (delayed update, overlap with the next forward) --------------
    def _twin(self):
        """The host optimizer with the hyperparameters as they are now (an LR scheduler steps
        right after apply() returns): a shallow twin sharing the state, with its own
        param_groups dicts (torch's Optimizer pickles only some attributes, so copy.copy of the
        optimizer itself would lose the others)."""
        host = copy.copy(self.host)
        src = self.host.optimizer
        opt = object.__new__(type(src))
        opt.__dict__.update(src.__dict__)
        opt.param_groups = [dict(g) for g in src.param_groups]
        host.optimizer = opt
        return host

    def _start_overlapped(self, factor: float) -> None:
        self.flush()
        # release() drops self._grads next: the step keeps its own selection of them.
        pend = self._pending = _Pending("overlap", self._twin(), [self._select(c) for c in self.chunks], factor)
        inf = pend.inflight = _InFlight(len(self._waits))
        if self.buffers.cuda:
            # The copies into the parameters come after everything queued so far (the backward
            # that read them).
            inf.start = torch.cuda.Event()
            inf.start.record(torch.cuda.current_stream(self.buffers.device))

        def body():
            if inf.start is not None:
                self._copy_stream.wait_event(inf.start)
            self.buffers.wait_host_buffers()
            self._advance(pend)
        self._inflight = inf
        self._in_background("zspeed-overlapped-step", body, inf.finish)

    def _advance(self, pend: "_Pending") -> None:
        """Runs the step ``pend`` from where it stands to its last chunk. Each chunk is stepped
        exactly once: when this raises (a failing kernel, a copy, a collective, a second Ctrl-C),
        ``pend`` records how far it got (chunks stepped, chunks whose weights went out, units
        all-gathered), and calling it again, from the training thread, completes the step
        without repeating any of it. The per-chunk weight copies are repeated (they are copies)."""
        cuda, side = self.buffers.cuda, self._copy_stream
        waits, sharded = self._waits, self.sharded is not None
        for i in range(pend.next, len(self.chunks)):
            if pend.stepped <= i:
                with self.trace.span(_STEP_SPAN[pend.mode], chunk=i, params=len(self.chunks[i])):
                    pend.host.step(pend.grads[i], pend.factor, self._lowp_out)
                pend.stepped = i + 1
            if pend.mode == "sync":
                with self.trace.span("copy back (queue)", chunk=i):
                    self.buffers.write_back(self._out, self.chunks[i])
            elif pend.mode == "overlap":
                with self.trace.span("copy back (queue)", chunk=i), \
                        (torch.cuda.stream(side) if cuda else contextlib.nullcontext()), \
                        (self.trace.cuda_span("weights to GPU", side, chunk=i) if cuda else contextlib.nullcontext()):
                    self.buffers.write_back(self._out, self.chunks[i])
                    while pend.k < len(waits) and waits[pend.k][0] <= i:
                        if sharded:  # every rank's new shard of this unit into every rank's model
                            self.buffers.gather_unit(*waits[pend.k][1], self._out, self._bg_group)
                        ev = None
                        if cuda:
                            ev = torch.cuda.Event()
                            ev.record(side)
                            pend.last_event = ev
                        pend.k += 1
                        if pend.inflight is not None:
                            pend.inflight.finish_chunk(pend.k - 1, ev)
            pend.next = i + 1

    def _in_background(self, name: str, body, done=None) -> None:
        """Runs body() in a thread; an exception it raises is kept for flush() (or wait_chunk())
        to raise in the training thread; done() runs at its end either way."""
        self._thread_error = None

        def run():
            try:
                body()
            except BaseException as e:  # noqa: BLE001 - re-raised in the training thread
                self._thread_error = e
            finally:
                if done is not None:
                    done()
        # Not a daemon: at interpreter exit Python waits for the step in flight (at most one
        # CPU step) instead of tearing the runtime down under the C kernels and CUDA calls.
        self._thread = threading.Thread(target=run, name=name, daemon=False)
        self._thread.start()

    def wait_chunk(self, k: int) -> None:
        """Before a module's forward: wait k (a chunk, or with several ranks a unit; and so every
        earlier one) is stepped and its weights are queued to the model, ahead of the compute
        stream's next kernels."""
        inf = self._inflight
        if inf is None:
            if self._pending is not None:  # a step that failed in the background: complete it first
                self.flush()
            return
        if not inf.wait(k):  # the step failed (or ended early): flush() raises its error
            self.flush()
            return
        ev = inf.events[k]
        if ev is not None:
            torch.cuda.current_stream(self.buffers.device).wait_event(ev)

    def hook_modules(self, module: torch.nn.Module) -> list:
        """overlap: forward pre-hooks on every module holding parameters of this path, each waiting
        for the chunk of its last parameter, and state_dict pre-hooks that finish the step first.
        Returns the hook handles."""
        if not self.overlap:
            return []
        ref = weakref.ref(self)
        handles = []
        for m in module.modules():
            ks = [k for k in (self._wait_index(p) for p in m.parameters(recurse=False)) if k is not None]
            if ks:
                handles.append(m.register_forward_pre_hook(_WaitChunk(ref, max(ks))))
        handles.append(module.register_state_dict_pre_hook(_FlushFirst(ref)))
        return handles

    def _start_delayed(self, factor: float) -> None:
        self.flush()
        pend = self._pending = _Pending("delayed", self._twin(), [self._select(c) for c in self.chunks], factor)
        self.buffers.swap_grads()  # the next backward must not overwrite what the step reads

        def body():
            self.buffers.wait_host_buffers()
            self._advance(pend)
        self._in_background("zspeed-delayed-step", body)

    @property
    def step_pending(self) -> bool:
        """Whether a step has started and not yet reached every chunk's weights (running in the
        background, or stopped partway by an error until a retry completes it)."""
        return self._pending is not None

    def flush(self) -> None:
        """Finishes a step running in the background (delayed or overlapped) and puts its
        weights into the model (no-op otherwise). A step that failed in the background raises
        its error here once and stays pending; the next call completes it in this thread (the
        retry), so no caller ever sees a half-applied step."""
        t, self._thread = self._thread, None
        if t is not None:
            with self.trace.span("wait for delayed step" if self.delayed else "wait for overlapped step"):
                t.join()
        self._inflight = None
        pend = self._pending
        if pend is None or pend.mode == "sync":
            return  # a synchronous step that raised is completed by engine.step() (HostPath.apply)
        if self._thread_error is not None:
            err, self._thread_error = self._thread_error, None
            pend.inflight = None  # the retry runs in this thread: nothing waits on it
            _note(err, f"the optimizer step running in the background stopped after {pend.stepped} of "
                       f"{len(self.chunks)} chunks; the next forward, backward, engine.finish_step() or "
                       f"save_checkpoint() completes it first (load_checkpoint discards it)")
            raise err
        if pend.next < len(self.chunks):
            with self.trace.span("complete the interrupted step"):
                if pend.stepped == 0:
                    self.buffers.wait_host_buffers()
                self._advance(pend)
        self._pending = None
        if pend.last_event is not None:  # what follows (the next backward, a checkpoint) sees every new weight
            torch.cuda.current_stream(self.buffers.device).wait_event(pend.last_event)
            self.buffers.set_h2d_done(pend.last_event)
        if pend.mode == "delayed":
            keys = [k for c in self.chunks for k in c]
            with self.trace.span("copy back (queue)"):
                self.buffers.write_back(self._out, keys)
            self.buffers.end_write_back()

    def step_failed(self) -> bool:
        """Whether a step stopped partway (waiting first for one running in the background)."""
        if self._thread is not None:
            self._thread.join()
        pend = self._pending
        return pend is not None and (pend.mode == "sync" or self._thread_error is not None
                                     or pend.next < len(self.chunks))

    def abandon_step(self) -> None:
        """Drops a step that stopped partway (a checkpoint load replaces what it touched); a
        step that ran to its end in the background is finished as flush() finishes it."""
        if not self.step_failed():
            self.flush()
            return
        t, self._thread = self._thread, None
        if t is not None:
            t.join()
        self._inflight = None
        self._thread_error = None
        pend, self._pending = self._pending, None
        if pend is not None and pend.last_event is not None:  # copies it queued end before anything else
            torch.cuda.current_stream(self.buffers.device).wait_event(pend.last_event)
            self.buffers.set_h2d_done(pend.last_event)

    def before_backward(self, boundary: bool) -> None:
        if self.overlap:  # the backward reads every weight; its gradients overwrite the host buffers
            self.flush()
        super().before_backward(boundary)

    def param_states(self) -> list:
        self.flush()
        return super().param_states()

    def close(self) -> None:
        t, self._thread = self._thread, None
        if t is not None:
            t.join()
        self._inflight = None
        self._pending = None
        super().close()

    def _select(self, chunk: list) -> list:
        """The gradients restricted to one chunk: None (skipped by the optimizer) elsewhere."""
        if len(self.chunks) == 1:
            return self._grads
        out = [[None] * len(row) for row in self._grads]
        for gi, pi in chunk:
            out[gi][pi] = self._grads[gi][pi]
        return out

    def masters(self) -> list:
        self.flush()
        return self.host_masters

    def load_masters(self, masters: list) -> None:
        self.flush()
        copy_masters(self.host_masters, masters)
        self.buffers.refresh(self.host_masters, self._lowp_out)


_STEP_SPAN = {"sync": "cpu step", "overlap": "cpu step (overlapped)", "delayed": "cpu step (delayed)"}


def _note(err: BaseException, text: str) -> None:
    if hasattr(err, "add_note"):  # Python 3.11+
        err.add_note("zspeed: " + text)


class _Pending:
    """One optimizer step of the host path from its start until every chunk's weights are out:
    how it runs ("sync", "overlap", "delayed"), the optimizer with the hyperparameters of its
    start, each chunk's gradients, the factor, and how far it got (see HostPath._advance)."""

    def __init__(self, mode: str, host, grads: list, factor: float):
        self.mode, self.host, self.grads, self.factor = mode, host, grads, factor
        self.stepped = 0       # chunks whose optimizer step ran
        self.next = 0          # chunks whose weights also went to the model
        self.k = 0             # overlap: waits made ready (units all-gathered with several ranks)
        self.last_event = None  # overlap on CUDA: the copy event of the last wait made ready
        self.inflight: _InFlight | None = None  # overlap in the background: what forwards wait on


class _InFlight:
    """overlap: how far the background step has come (chunks done, each with its copy's CUDA
    event or None), shared by the step's thread and the training thread."""

    def __init__(self, n: int):
        self.cond = threading.Condition()
        self.done = 0
        self.ended = False
        self.events: list = [None] * n
        self.start = None

    def finish_chunk(self, i: int, event) -> None:
        with self.cond:
            self.events[i] = event
            self.done = i + 1
            self.cond.notify_all()

    def finish(self) -> None:
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def wait(self, k: int) -> bool:
        """Waits until chunk k is done (True) or the step ended without it (False)."""
        with self.cond:
            while self.done <= k and not self.ended:
                self.cond.wait()
            return self.done > k


class _WaitChunk(EngineHook):
    """A forward pre-hook: the module's weights are this step's (weak reference to the path, so
    the hooks do not keep an engine alive)."""

    def __init__(self, path_ref, k: int):
        self.path_ref, self.k = path_ref, k

    def __call__(self, module, args):
        path = self.path_ref()
        if path is not None and (path._inflight is not None or path._pending is not None):
            with path.trace.span("wait for weights", chunk=self.k):
                path.wait_chunk(self.k)


class _FlushFirst(EngineHook):
    """A state_dict pre-hook: module.state_dict() sees the finished step's weights."""

    def __init__(self, path_ref):
        self.path_ref = path_ref

    def __call__(self, module, prefix, keep_vars):
        path = self.path_ref()
        if path is not None:
            path.flush()


def _chunks(layout: FlatLayout, chunk_elems: int) -> list:
    """Consecutive parameters, (group, parameter) keys, cut into chunks of at most
    chunk_elems elements (a larger parameter is a chunk of its own)."""
    chunks: list[list[tuple[int, int]]] = [[]]
    filled = 0
    for gi, pi in layout.keys:
        n = layout.numels[gi][pi]
        if filled and filled + n > chunk_elems:
            chunks.append([])
            filled = 0
        chunks[-1].append((gi, pi))
        filled += n
    return chunks
