"""Runs a Python snippet as N ranks of one torch.distributed job on this machine
(Gloo over loopback), the way torchrun would start them: each process gets RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankResult:
    def __init__(self, rank, returncode, stdout, stderr):
        self.rank, self.returncode, self.stdout, self.stderr = rank, returncode, stdout, stderr

    def __repr__(self):
        return f"<rank {self.rank} rc={self.returncode}\n{self.stdout}\n{self.stderr}>"


def run_ranks(n: int, code: str, *, env: dict | None = None, timeout: float = 300,
              kill_rank: int | None = None, kill_after: float | None = None, fresh: bool | None = None) -> list:
    """Runs ``code`` as ``n`` ranks; returns their results in rank order.

    By default the ranks are the session's pool of rank processes (rankpool.py), which run
    the code as fresh processes would; ``fresh=True`` (implied by ``kill_rank``, and by code
    that kills or exits its own process) starts new processes instead.
    ``kill_rank``/``kill_after``: SIGKILL that rank after that many seconds (a rank
    that dies mid-job)."""
    src = textwrap.dedent(code)
    if fresh is None:
        fresh = kill_rank is not None or any(k in src for k in ("SIGKILL", "os._exit", "signal.SIG"))
    if not fresh and os.environ.get("ZSPEED_TEST_FRESH_RANKS") != "1":
        import rankpool
        job_env = {"ZSPEED_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
        job_env.update(env or {})
        pool = rankpool.pool_for(n, job_env)
        if pool is not None:
            return [RankResult(r, rc, so, se) for r, (rc, so, se) in enumerate(pool.run(src, job_env, timeout))]
    return _run_fresh(n, src, env=env, timeout=timeout, kill_rank=kill_rank, kill_after=kill_after)


def _run_fresh(n: int, src: str, *, env, timeout, kill_rank, kill_after) -> list:
    port = free_port()
    procs = []
    for r in range(n):
        e = dict(os.environ)
        e.update(ZSPEED_DEVICE="cpu", OMP_NUM_THREADS="1")  # defaults the caller's env may change
        e.update(env or {})
        e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        procs.append(subprocess.Popen([sys.executable, "-c", src], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    if kill_rank is not None:
        time.sleep(kill_after or 0)
        procs[kill_rank].kill()
    out = []
    deadline = time.monotonic() + timeout
    for r, p in enumerate(procs):
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            so, se = p.communicate()
            se += f"\n[distrun: rank {r} killed after the {timeout} s timeout]"
            out.append(RankResult(r, "timeout", so, se))
            continue
        out.append(RankResult(r, p.returncode, so, se))
    return out
