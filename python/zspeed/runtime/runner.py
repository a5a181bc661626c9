"""Step runners: when the host path's CPU optimizer step runs (cpu.py's HostPath holds the
masters, the chunks and the optimizer; a runner times their step). Chosen once from the run
plan's ``timing``:

:class:`SyncRunner` ("sync")
    engine.step() runs the step: chunk by chunk, each unit of the store published as soon as
    the chunk holding its last piece is stepped (on CUDA its copy, with several ranks its
    all-gather, overlaps the CPU work of the next chunks).
:class:`OverlapRunner` ("overlap", offload_optimizer.overlap_forward; exact)
    engine.step() starts the step in a background thread and returns. The thread steps the
    chunks in the model's parameter order and queues each chunk's weights to the model as
    soon as the chunk is done (on CUDA on a copy stream, with an event per unit): each unit
    of the store's partition is published (all-gathered, on a process group of the step's
    own; on one rank copied) once this rank's shard of it is stepped. The next forward waits,
    module by module, only for the unit holding that module's last parameter
    (forward pre-hooks), so the first layers compute while the CPU still steps the last.
    The gradients, the decision to step (overflow) and the clipping factor are all known
    before the thread starts: every update equals the synchronous step's. The next backward,
    checkpoints and anything reading the masters wait for the whole step first.
:class:`DelayedRunner` ("delayed", offload_optimizer.delayed_update; one step stale)
    the ZeRO-Offload paper's delayed parameter update: the step of boundary t runs while the
    GPU does forward and backward of boundary t+1 on the weights it has (those of t-1). At
    the next gather its weights are written into the model; the gradients of t+1 (computed
    on the older weights) are then applied to the newer masters. The optimizer's
    hyperparameters are captured when the step starts, the gradients of the next backward
    go into a second host buffer, and the step writes its weights into its own buffers,
    never into the model's.

A step is all or nothing (:class:`Pending`): each chunk is stepped exactly once. When a step
raises partway (a failing kernel, a copy, a collective, a second Ctrl-C) the record says how
far it got, and running it again completes it without repeating any of it: the synchronous
step through engine.step(), a background step through the next flush (its error is raised
once first).
"""
from __future__ import annotations

import contextlib
import threading
import weakref

import torch

from .hooks import EngineHook

__all__ = ["SyncRunner", "OverlapRunner", "DelayedRunner", "RUNNERS", "Pending"]


def _note(err: BaseException, text: str) -> None:
    if hasattr(err, "add_note"):  # Python 3.11+
        err.add_note("zspeed: " + text)


class Pending:
    """One optimizer step from its start until every chunk's weights are out: the optimizer
    with the hyperparameters of its start, each chunk's gradients, the factor, and how far it
    got."""

    def __init__(self, host, grads: list, factor: float):
        self.host, self.grads, self.factor = host, grads, factor
        self.stepped = 0       # chunks whose optimizer step ran
        self.next = 0          # chunks whose weights also went to the model
        self.k = 0             # overlap: waits made ready (units published with several ranks)
        self.last_event = None  # overlap on CUDA: the copy event of the last wait made ready
        self.inflight: InFlight | None = None  # overlap in the background: what forwards wait on


class InFlight:
    """overlap: how far the background step has come (waits done, each with its copy's CUDA
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
        """Waits until wait k is done (True) or the step ended without it (False)."""
        with self.cond:
            while self.done <= k and not self.ended:
                self.cond.wait()
            return self.done > k


class SyncRunner:
    """The step runs inside engine.step() (see the module docstring)."""

    span = "cpu step"
    # Whether the optimizer may write straight into host parameters (a CPU model, ZeRO-3 host
    # shards): not while the model trains on during the step (delayed).
    writes_model_storage = True

    def __init__(self, path):
        self.path = path
        self.pending: Pending | None = None
        self.inflight: InFlight | None = None

    def start(self, factor: float) -> None:
        path = self.path
        pend = self.pending
        if pend is None:  # a new step (else: the retry of one that raised partway)
            with path.trace.span("wait for last step's copies"):
                path.buffers.wait_host_buffers()
            pend = self.pending = Pending(path.host, [path.chunk_grads(c) for c in path.chunks], factor)
        self.advance(pend)
        path.buffers.end_write_back()
        self.pending = None

    def advance(self, pend: Pending) -> None:
        """Runs ``pend`` from where it stands to its last chunk (see the module docstring); the
        per-chunk weight copies are repeated on a retry (they are copies)."""
        path = self.path
        for i in range(pend.next, len(path.chunks)):
            if pend.stepped <= i:
                with path.trace.span(self.span, chunk=i, params=len(path.chunks[i])):
                    pend.host.step(pend.grads[i], pend.factor, path.lowp_out)
                pend.stepped = i + 1
                path.buffers.chunk_stepped(path.chunks[i])
            self.after_chunk(pend, i)
            pend.next = i + 1

    def after_chunk(self, pend: Pending, i: int) -> None:
        with self.path.trace.span("copy back (queue)", chunk=i):
            self.path.buffers.write_back(self.path.weights_out, self.path.chunks[i])

    # What the path forwards to its runner.
    def flush(self) -> None:
        """A synchronous step that raised is completed by engine.step(): nothing runs here."""

    def failed(self) -> bool:
        return self.pending is not None

    def abandon(self) -> None:
        self.pending = None

    def before_backward(self) -> None:
        pass

    def before_gather(self) -> None:
        pass

    def hooks(self, module: torch.nn.Module) -> list:
        return []

    def wait(self, k: int) -> None:
        pass

    def wait_index(self, p: torch.Tensor) -> int | None:
        return None

    def close(self) -> None:
        self.pending = None


class _BackgroundRunner(SyncRunner):
    """What the overlapped and the delayed step share: a step in a thread of its own, whose
    error is kept for the training thread, and the completion of a failed step there."""

    thread_name = ""

    def __init__(self, path):
        super().__init__(path)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _twin(self):
        """The host optimizer with the hyperparameters as they are now (an LR scheduler steps
        right after apply() returns): a shallow twin sharing the state, with its own
        param_groups dicts (torch's Optimizer pickles only some attributes, so copy.copy of the
        optimizer itself would lose the others)."""
        import copy
        host = copy.copy(self.path.host)
        src = self.path.host.optimizer
        opt = object.__new__(type(src))
        opt.__dict__.update(src.__dict__)
        opt.param_groups = [dict(g) for g in src.param_groups]
        host.optimizer = opt
        return host

    def _in_background(self, body, done=None) -> None:
        """Runs body() in a thread; an exception it raises is kept for flush() (or wait()) to raise
        in the training thread; done() runs at its end either way."""
        self._error = None

        def run():
            try:
                body()
            except BaseException as e:  # noqa: BLE001 - re-raised in the training thread
                self._error = e
            finally:
                if done is not None:
                    done()
        # Not a daemon: at interpreter exit Python waits for the step in flight (at most one
        # CPU step) instead of tearing the runtime down under the C kernels and CUDA calls.
        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=False)
        self._thread.start()

    def _join(self) -> None:
        t, self._thread = self._thread, None
        if t is not None:
            with self.path.trace.span(f"wait for {self.thread_name.split('-')[1]} step"):
                t.join()

    def flush(self) -> None:
        """Finishes the step running in the background and puts its weights into the model
        (no-op without one). A step that failed in the background raises its error here once
        and stays pending; the next call completes it in this thread (the retry), so no
        caller ever sees a half-applied step."""
        self._join()
        self.inflight = None
        pend = self.pending
        if pend is None:
            return
        path = self.path
        if self._error is not None:
            err, self._error = self._error, None
            pend.inflight = None  # the retry runs in this thread: nothing waits on it
            _note(err, f"the optimizer step running in the background stopped after {pend.stepped} of "
                       f"{len(path.chunks)} chunks; the next forward, backward, engine.finish_step() or "
                       f"save_checkpoint() completes it first (load_checkpoint discards it)")
            raise err
        if pend.next < len(path.chunks):
            with path.trace.span("complete the interrupted step"):
                if pend.stepped == 0:
                    path.buffers.wait_host_buffers()
                self.advance(pend)
        self.pending = None
        self._copies_done(pend)
        self.finish(pend)

    def _copies_done(self, pend: Pending) -> None:
        """What follows (the next backward, a checkpoint) is ordered after every copy the step queued."""
        if pend.last_event is not None:
            torch.cuda.current_stream(self.path.buffers.device).wait_event(pend.last_event)
            self.path.buffers.set_h2d_done(pend.last_event)

    def finish(self, pend: Pending) -> None:
        """The step ran to its end: its weights go where they still have to go."""

    def failed(self) -> bool:
        if self._thread is not None:
            self._thread.join()
        pend = self.pending
        return pend is not None and (self._error is not None or pend.next < len(self.path.chunks))

    def abandon(self) -> None:
        """Drops a step that stopped partway (a checkpoint load replaces what it touched); a step
        that ran to its end is finished as flush() finishes it."""
        if not self.failed():
            self.flush()
            return
        t, self._thread = self._thread, None
        if t is not None:
            t.join()
        self.inflight = None
        self._error = None
        pend, self.pending = self.pending, None
        if pend is not None:  # copies it queued end before anything else
            self._copies_done(pend)

    def close(self) -> None:
        t, self._thread = self._thread, None
        if t is not None:
            t.join()
        self.inflight = None
        self.pending = None


class OverlapRunner(_BackgroundRunner):
    """offload_optimizer.overlap_forward (see the module docstring)."""

    span = "cpu step (overlapped)"
    thread_name = "zspeed-overlapped-step"

    def __init__(self, path):
        super().__init__(path)
        buffers = path.buffers
        self._copy_stream = torch.cuda.Stream(device=buffers.device) if buffers.cuda else None
        self._plan_waits()

    def _plan_waits(self) -> None:
        """What the next forward can wait for, in the order the background step makes it ready:
        each unit of the store's partition plan that this path steps (all of the store's, or the
        CPU's share of a split), published (on a process group of the step's own) once the chunk
        holding this rank's last piece of it is stepped."""
        path = self.path
        self._group = path.sharded.comm.new_group()
        # (chunk, (group of the path's layout, (store group, unit))), in the order the step goes
        self.waits = [(ci, done) for ci, c in enumerate(path.chunks) for done in path.buffers.completed_units(c)]
        self._wait_of = {done[1]: k for k, (_ci, done) in enumerate(self.waits)}

    def wait_index(self, p: torch.Tensor) -> int | None:
        """The wait after which the model parameter p holds this step's weights; None for a
        parameter this path does not step."""
        sm = self.path.sharded
        key = sm.layout.index.get(id(p))
        if key is None:
            return None
        gi, pi = key
        return self._wait_of.get((gi, sm.plan.groups[gi].unit_of[pi]))

    def unit_ready(self, gi: int, ui: int, block: bool) -> bool:
        """ZeRO-3: whether this rank's shard of unit ui (group gi) holds this step's weights, so
        that the fetcher may gather it; with ``block`` it waits until it does (True then)."""
        k = self._wait_of.get((gi, ui))
        if k is None:
            return True
        inf = self.inflight
        if inf is None:
            if self.pending is None:
                return True
            if block:  # a step that failed in the background: flush() raises its error or completes it
                self.flush()
            return block
        if not block:
            with inf.cond:
                return inf.done > k
        with self.path.trace.span("wait for weights", unit=f"{gi}.{ui}"):
            self.wait(k)
        return True

    def start(self, factor: float) -> None:
        self.flush()
        path = self.path
        path.sharded.mark_stale()  # ZeRO-3: the gathered copies are stale from here on (the fetcher waits per unit)
        # release() drops the path's gradients next: the step keeps its own selection of them.
        pend = self.pending = Pending(self._twin(), [path.chunk_grads(c) for c in path.chunks], factor)
        inf = pend.inflight = InFlight(len(self.waits))
        if self._copy_stream is not None:
            # The copies into the parameters come after everything queued so far (the backward
            # that read them).
            inf.start = torch.cuda.Event()
            inf.start.record(torch.cuda.current_stream(path.buffers.device))

        def body():
            if inf.start is not None:
                self._copy_stream.wait_event(inf.start)
            path.buffers.wait_host_buffers()
            self.advance(pend)
        self.inflight = inf
        self._in_background(body, inf.finish)

    def after_chunk(self, pend: Pending, i: int) -> None:
        path, side = self.path, self._copy_stream
        on_stream = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
        copy_span = path.trace.cuda_span("weights to GPU", side, chunk=i) if side is not None \
            else contextlib.nullcontext()
        with path.trace.span("copy back (queue)", chunk=i), on_stream, copy_span:
            while pend.k < len(self.waits) and self.waits[pend.k][0] <= i:
                # every rank's new shard of this unit into every rank's model
                path.buffers.gather_unit(*self.waits[pend.k][1], path.weights_out, self._group)
                ev = None
                if side is not None:
                    ev = torch.cuda.Event()
                    ev.record(side)
                    pend.last_event = ev
                pend.k += 1
                if pend.inflight is not None:
                    pend.inflight.finish_chunk(pend.k - 1, ev)

    def wait(self, k: int) -> None:
        """Before a module's forward: wait k (and so every earlier one) is done and its weights
        are queued to the model, ahead of the compute stream's next kernels."""
        inf = self.inflight
        if inf is None:
            if self.pending is not None:  # a step that failed in the background: complete it first
                self.flush()
            return
        if not inf.wait(k):  # the step failed (or ended early): flush() raises its error
            self.flush()
            return
        ev = inf.events[k]
        if ev is not None:
            torch.cuda.current_stream(self.path.buffers.device).wait_event(ev)

    def before_backward(self) -> None:
        self.flush()  # the backward reads every weight; its gradients overwrite the host buffers

    def hooks(self, module: torch.nn.Module) -> list:
        """Forward pre-hooks on every module holding parameters of this path, each waiting for the
        wait of its last parameter, and a state_dict pre-hook that finishes the step first."""
        ref = weakref.ref(self)
        handles = []
        sm = self.path.sharded
        fetcher = getattr(sm, "fetcher", None)
        if fetcher is not None:
            # ZeRO-3: the fetcher gathers each module's parameters (and prefetches the next
            # ones) from their shards; it asks before each gather whether the shard is stepped.
            handles.append(fetcher.add_gate(sm, _UnitReady(ref)))
            handles.append(module.register_state_dict_pre_hook(_FlushFirst(ref)))
            return handles
        for m in module.modules():
            ks = [k for k in (self.wait_index(p) for p in m.parameters(recurse=False)) if k is not None]
            if ks:
                handles.append(m.register_forward_pre_hook(_WaitChunk(ref, max(ks))))
        handles.append(module.register_state_dict_pre_hook(_FlushFirst(ref)))
        return handles


class DelayedRunner(_BackgroundRunner):
    """offload_optimizer.delayed_update (see the module docstring)."""

    span = "cpu step (delayed)"
    thread_name = "zspeed-delayed-step"
    writes_model_storage = False

    def start(self, factor: float) -> None:
        self.flush()
        path = self.path
        pend = self.pending = Pending(self._twin(), [path.chunk_grads(c) for c in path.chunks], factor)
        path.buffers.swap_grads()  # the next backward must not overwrite what the step reads

        def body():
            path.buffers.wait_host_buffers()
            self.advance(pend)
        self._in_background(body)

    def after_chunk(self, pend: Pending, i: int) -> None:
        pass  # the model trains on its weights meanwhile: they are written back at the next flush

    def before_gather(self) -> None:
        self.flush()

    def finish(self, pend: Pending) -> None:
        path = self.path
        keys = [k for c in path.chunks for k in c]
        with path.trace.span("copy back (queue)"):
            path.buffers.write_back(path.weights_out, keys)
        path.buffers.end_write_back()


RUNNERS = {"sync": SyncRunner, "overlap": OverlapRunner, "delayed": DelayedRunner}


class _WaitChunk(EngineHook):
    """A forward pre-hook: the module's weights are this step's (weak reference to the runner, so
    the hooks do not keep an engine alive)."""

    def __init__(self, runner_ref, k: int):
        self.runner_ref, self.k = runner_ref, k

    def __call__(self, module, args):
        r = self.runner_ref()
        if r is not None and (r.inflight is not None or r.pending is not None):
            with r.path.trace.span("wait for weights", chunk=self.k):
                r.wait(self.k)


class _UnitReady:
    """The ZeRO-3 fetcher's question before it gathers a shard (weak reference to the runner)."""

    def __init__(self, runner_ref):
        self.runner_ref = runner_ref

    def __call__(self, gi: int, ui: int, block: bool) -> bool:
        r = self.runner_ref()
        return True if r is None else r.unit_ready(gi, ui, block)


class _FlushFirst(EngineHook):
    """A state_dict pre-hook: module.state_dict() sees the finished step's weights."""

    def __init__(self, runner_ref):
        self.runner_ref = runner_ref

    def __call__(self, module, prefix, keep_vars):
        r = self.runner_ref()
        if r is not None:
            r.flush()
