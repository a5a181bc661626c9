"""A timeline of the engine's phases, written as a Chrome trace (opens in Perfetto or
chrome://tracing).

Off by default at no cost: the engine holds :data:`OFF`, whose ``span()`` returns one
shared do-nothing context. Switched on by the config key ``zspeed_trace`` (a file path)
or the environment variable ``ZSPEED_TRACE=path``; with several ranks each rank writes
``path`` with ``.rank<N>`` before the extension.

What is recorded: host spans (``span(name)``: the wall time a phase takes on the Python
thread that runs it, e.g. forward, backward, the optimizer step, each CPU step chunk, a
wait), and device spans (``cuda_span(name, stream)``: CUDA events recorded on a stream at
the start and end, resolved to times when the trace is written, so copies and kernels on
side streams show on their own track, with their real overlap). Host and device times
share one clock: the first device event of the trace is tied to the host time at which
it was recorded.

The file is rewritten by :meth:`Tracer.flush` (the engine calls it every 20 optimizer
steps and on close), so a killed run still leaves the steps before the last one.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time

__all__ = ["Tracer", "OFF", "tracer_from"]


class _Off:
    """The disabled tracer: every call does nothing."""
    enabled = False
    _null = contextlib.nullcontext()

    def span(self, name: str, cat: str = "engine", **args):
        return self._null

    def cuda_span(self, name: str, stream=None, cat: str = "device", **args):
        return self._null

    def instant(self, name: str, cat: str = "engine", **args) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


OFF = _Off()


class Tracer:
    """Records spans and writes them to ``path`` as Chrome trace events."""

    enabled = True

    def __init__(self, path: str, pid: int = 0, process_name: str = "zspeed"):
        self.path = path
        self.pid = pid
        self.process_name = process_name
        self._t0 = time.perf_counter()
        self._events: list = []
        self._cuda: list = []        # (name, cat, start event, end event, stream name, args)
        self._anchor = None          # (CUDA event, host microseconds) tying device time to host time
        self._lock = threading.Lock()
        self._tracks: dict = {}

    def _now_us(self) -> float:
        return (time.perf_counter() - self._t0) * 1e6

    def _tid(self, name: str) -> int:
        with self._lock:
            if name not in self._tracks:
                self._tracks[name] = len(self._tracks) + 1
            return self._tracks[name]

    @contextlib.contextmanager
    def span(self, name: str, cat: str = "engine", **args):
        tid = self._tid(threading.current_thread().name)
        start = self._now_us()
        try:
            yield
        finally:
            ev = {"name": name, "cat": cat, "ph": "X", "ts": start, "dur": self._now_us() - start,
                  "pid": self.pid, "tid": tid}
            if args:
                ev["args"] = args
            with self._lock:
                self._events.append(ev)

    @contextlib.contextmanager
    def cuda_span(self, name: str, stream=None, cat: str = "device", **args):
        import torch
        stream = stream or torch.cuda.current_stream()
        if self._anchor is None:
            anchor = torch.cuda.Event(enable_timing=True)
            anchor.record(stream)
            anchor.synchronize()
            self._anchor = (anchor, self._now_us())
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        try:
            yield
        finally:
            b.record(stream)
            key = f"cuda stream {stream.stream_id}"
            with self._lock:
                self._cuda.append((name, cat, a, b, key, args))

    def instant(self, name: str, cat: str = "engine", **args) -> None:
        ev = {"name": name, "cat": cat, "ph": "i", "s": "p", "ts": self._now_us(), "pid": self.pid,
              "tid": self._tid(threading.current_thread().name)}
        if args:
            ev["args"] = args
        with self._lock:
            self._events.append(ev)

    def _resolve_cuda(self) -> None:
        """Turns finished device spans into events (waits for the device)."""
        if not self._cuda:
            return
        import torch
        torch.cuda.synchronize()
        anchor, host_us = self._anchor
        with self._lock:
            pending, self._cuda = self._cuda, []
        for name, cat, a, b, key, args in pending:
            start = host_us + anchor.elapsed_time(a) * 1e3
            ev = {"name": name, "cat": cat, "ph": "X", "ts": start, "dur": a.elapsed_time(b) * 1e3,
                  "pid": self.pid, "tid": self._tid(key)}
            if args:
                ev["args"] = args
            with self._lock:
                self._events.append(ev)

    def flush(self) -> None:
        """Writes every event so far (the file is replaced atomically)."""
        self._resolve_cuda()
        with self._lock:
            meta = [{"name": "process_name", "ph": "M", "pid": self.pid, "args": {"name": self.process_name}}]
            meta += [{"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid, "args": {"name": name}}
                     for name, tid in self._tracks.items()]
            doc = {"traceEvents": meta + sorted(self._events, key=lambda e: e["ts"]),
                   "displayTimeUnit": "ms"}
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, self.path)

    def close(self) -> None:
        self.flush()


def tracer_from(config_path, rank: int = 0, world_size: int = 1):
    """The tracer the engine uses: the config key's path, else ZSPEED_TRACE, else :data:`OFF`."""
    path = config_path or os.environ.get("ZSPEED_TRACE") or None
    if not path:
        return OFF
    path = os.fspath(path)
    if world_size > 1:
        root, ext = os.path.splitext(path)
        path = f"{root}.rank{rank}{ext or '.json'}"
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        from .config import ConfigError
        raise ConfigError(f"the trace file '{path}' is in a folder that does not exist; create it or choose "
                          f"another path (zspeed_trace / ZSPEED_TRACE).")
    return Tracer(path, pid=rank, process_name=f"zspeed rank {rank}")
