"""A session-wide pool of rank processes that run test bodies (distrun.run_ranks uses it).

Starting the ranks of a job is most of a small multi-rank test's time on a small machine:
every rank is a new interpreter that imports torch and zspeed and then sets up its process
group. The pool keeps n such processes alive for the whole pytest session, one pool per
world size (and per setting that only takes effect when a process starts, such as the
collective timeout or the backend), with their process group made once; each test body
then runs in all of them at once, as ``python -c CODE`` would, with:

- its own globals (``__name__ == "__main__"``), its environment variables set for its run
  and restored afterwards, its stdout and stderr captured, its exit status (SystemExit's
  code, 1 with the traceback on stderr for an exception, 0 otherwise);
- the same contract as fresh processes otherwise: a body that leaves a rank waiting in a
  collective for a rank that already failed would block until the collective's timeout, so
  once any rank has failed the others get a few seconds to finish, and then the pool is
  stopped (its processes killed, their result "killed after rank r failed") and the next
  job starts a fresh one. A body that kills its own process, or runs past its timeout, ends
  the pool the same way.

Bodies that must run in fresh processes (a rank killed on purpose, exit behaviour, peak
memory) keep using distrun.run_ranks(..., fresh=True).
"""
from __future__ import annotations

import atexit
import json
import os
import struct
import subprocess
import sys
import threading
import time

__all__ = ["RankPool", "pool_for", "PROCESS_ENV"]

# Settings read only when a process (or its process group) starts: a job asking for other
# values gets a pool of its own.
PROCESS_ENV = ("DEEPSPEED_TIMEOUT", "ZSPEED_DIST_BACKEND", "OMP_NUM_THREADS", "ZSPEED_SIMD", "ZSPEED_AIO_BACKEND",
               "ZSPEED_NUM_THREADS", "GLOO_SOCKET_IFNAME", "PYTHONPATH")

_WORKER = r'''
import io, json, os, struct, sys, traceback
# The pool's channel is a copy of fds 0 and 1; the fds themselves go to the null device, so
# that nothing a body or a library writes (or a child process it starts) reaches the channel.
_out = os.fdopen(os.dup(1), "wb")
_inp = os.fdopen(os.dup(0), "rb")
_null = os.open(os.devnull, os.O_RDWR)
os.dup2(_null, 0)
os.dup2(_null, 1)
sys.stdin = open(os.devnull)

def _send(obj):
    b = json.dumps(obj).encode()
    _out.write(struct.pack("<I", len(b)) + b)
    _out.flush()

def _recv():
    head = _inp.read(4)
    if len(head) < 4:
        return None
    return json.loads(_inp.read(struct.unpack("<I", head)[0]))

_send({"ready": True})
while True:
    job = _recv()
    if job is None:
        break
    saved = {k: os.environ.get(k) for k in job["env"]}
    os.environ.update(job["env"])
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    rc = 0
    try:
        exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            err.write(str(e.code) + "\n")
    except BaseException:
        rc = 1
        err.write(traceback.format_exc())
    finally:
        sys.stdout, sys.stderr = old
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        import gc
        gc.collect()
    _send({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()})
'''


class RankPool:
    """n rank processes of one job environment (see the module docstring)."""

    def __init__(self, n: int, env: dict):
        from distrun import free_port
        self.n = n
        port = free_port()
        self.procs = []
        for r in range(n):
            e = dict(os.environ)
            e.update(env)
            e.update(PYTHONUNBUFFERED="1")
            if n > 1:
                e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            else:  # one process and no launcher, as a script started by hand
                for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                    e.pop(k, None)
            self.procs.append(subprocess.Popen([sys.executable, "-c", _WORKER], env=e, stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        self.alive = all(self._recv(p, 120) is not None for p in self.procs)

    @staticmethod
    def _read(p, n: int, deadline: float):
        buf = b""
        while len(buf) < n:
            if time.monotonic() > deadline:
                return None
            chunk = p.stdout.read1(n - len(buf)) if hasattr(p.stdout, "read1") else p.stdout.read(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def _recv(self, p, timeout: float):
        deadline = time.monotonic() + timeout
        head = self._read(p, 4, deadline)
        if head is None:
            return None
        body = self._read(p, struct.unpack("<I", head)[0], deadline)
        return None if body is None else json.loads(body)

    def run(self, code: str, env: dict, timeout: float) -> list:
        """Runs ``code`` on every rank; returns per rank (returncode, stdout, stderr), with
        returncode "timeout" or "killed" for a rank the pool had to stop."""
        msg = json.dumps({"code": code, "env": env}).encode()
        for p in self.procs:
            p.stdin.write(struct.pack("<I", len(msg)) + msg)
            p.stdin.flush()
        results: list = [None] * self.n
        done = threading.Event()

        def collect(r, p):
            results[r] = self._recv(p, timeout + 5)
            done.set()
        threads = [threading.Thread(target=collect, args=(r, p), daemon=True) for r, p in enumerate(self.procs)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        failed_at = None
        while any(t.is_alive() for t in threads):
            done.wait(0.2)
            done.clear()
            now = time.monotonic()
            if failed_at is None and any(res is not None and res["rc"] != 0 for res in results):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + 10):
                self.stop()
                for t in threads:
                    t.join(5)
                break
        out = []
        first = next((r for r, res in enumerate(results) if res is not None and res["rc"] != 0), None)
        for r, res in enumerate(results):
            if res is None:
                why = "timeout" if failed_at is None else "killed"
                if first is None:
                    note = ""
                else:  # the failing rank's own output, so that whichever rank a test reports shows the cause
                    tail = "\n".join(results[first]["stderr"].splitlines()[-30:])
                    note = f" after rank {first} failed; its stderr ends:\n{tail}\n"
                out.append((why, "", f"[rankpool: rank {r} stopped ({why}{note})]"))
                self.alive = False
            else:
                out.append((res["rc"], res["stdout"], res["stderr"]))
        if not self.alive:
            self.stop()
        return out

    def stop(self) -> None:
        self.alive = False
        for p in self.procs:
            try:
                p.kill()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except OSError:
                    pass

    def close(self) -> None:
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
            p.stdout.close()


_POOLS: dict = {}
_LOCK = threading.Lock()


def pool_for(n: int, env: dict) -> RankPool | None:
    """The pool for n ranks with these process-level settings (started on first use), or None
    where no pool can be started."""
    key = (n, tuple(sorted((k, env.get(k, os.environ.get(k))) for k in PROCESS_ENV)))
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is not None and not pool.alive:
            pool.stop()
            pool = None
        if pool is None:
            pool = RankPool(n, {k: v for k, v in env.items() if k in PROCESS_ENV})
            if not pool.alive:
                pool.stop()
                return None
            _POOLS[key] = pool
        return pool


@atexit.register
def _close_all() -> None:
    for pool in _POOLS.values():
        pool.close()
