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
              kill_rank: int | None = None, kill_after: float | None = None) -> list:
    """Starts ``n`` processes running ``code``; returns their results in rank order.

    ``kill_rank``/``kill_after``: SIGKILL that rank after that many seconds (a rank
    that dies mid-job)."""
    port = free_port()
    procs = []
    src = textwrap.dedent(code)
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
