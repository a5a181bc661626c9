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
steps and on close), so a killed run still leaves the steps before the last one. It is
written as checkpoints write theirs: a temporary file created exclusively (never through a
symbolic link) in the trace's folder, then renamed over the path; a path that is not a
regular file (a folder, a device, a FIFO, a symbolic link) is refused when the engine
starts, and never replaced if one appears there later (that flush is skipped, with a
warning).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import stat
import threading
import time

log = logging.getLogger("zspeed.trace")
_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0) |
          getattr(os, "O_CLOEXEC", 0))

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
        if self._refused():
            return
        folder, name = os.path.split(os.path.abspath(self.path))
        tmp = os.path.join(folder, f".{name}.zspeed-tmp-{secrets.token_hex(8)}")
        fd = os.open(tmp, _FLAGS, 0o666)  # a new file of our own: never an existing name or link
        try:
            with open(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            if not self._refused():  # checked again: something may have appeared meanwhile
                os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _refused(self) -> bool:
        problem = _not_regular(self.path)
        if problem:
            log.warning("zspeed: the trace file %s is now %s; this flush is skipped (a trace replaces only a "
                        "regular file)", self.path, problem)
        return problem is not None

    def close(self) -> None:
        self.flush()


def _not_regular(path: str) -> str | None:
    """What stands at ``path`` when it is something a trace must not replace (None: nothing,
    or a regular file); never follows a symbolic link and never opens anything."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def tracer_from(config_path, rank: int = 0, world_size: int = 1):
    """The tracer the engine uses: the config key's path, else ZSPEED_TRACE, else :data:`OFF`.
    A path whose folder is missing, or that exists and is not a regular file, is a
    ConfigError naming where the path came from."""
    path = config_path or os.environ.get("ZSPEED_TRACE") or None
    if not path:
        return OFF
    key = "the config key zspeed_trace" if config_path else "the environment variable ZSPEED_TRACE"
    path = os.fspath(path)
    if world_size > 1:
        root, ext = os.path.splitext(path)
        path = f"{root}.rank{rank}{ext or '.json'}"
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        from .config import ConfigError
        raise ConfigError(f"the trace file '{path}' is in a folder that does not exist; create it or choose "
                          f"another path (zspeed_trace / ZSPEED_TRACE).")
    problem = _not_regular(path)
    if problem:
        from .config import ConfigError
        raise ConfigError(f"the trace file '{path}' ({key}) exists and is not a regular file: it is {problem}, "
                          f"which the trace would replace. Give the path of a new or regular file (zspeed_trace "
                          f"/ ZSPEED_TRACE).")
    return Tracer(path, pid=rank, process_name=f"zspeed rank {rank}")
