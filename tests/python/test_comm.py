"""zspeed.comm (DeepSpeed's deepspeed.comm over torch.distributed): queries before a
group exists, a one-process group without a launcher, and real collectives across
ranks with Gloo."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="zspeed.comm needs torch")

from distrun import run_ranks  # noqa: E402


def _py(code, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "MASTER_ADDR", "MASTER_PORT")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env=e)


def test_queries_before_and_after_a_one_process_group():
    r = _py("""
        import zspeed, zspeed.comm as dist, torch, torch.distributed as td
        print(dist.get_rank(), dist.get_world_size(), dist.get_local_rank(), dist.is_initialized())
        zspeed.init_distributed()
        zspeed.init_distributed()  # a second call adopts the group
        print(dist.get_rank(), dist.get_world_size(), td.is_initialized(), dist.get_backend())
        t = torch.arange(3.0); dist.all_reduce(t); print(t.tolist())
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "0 1 0 False"
    assert lines[1] == "0 1 True gloo"
    assert lines[2] == "[0.0, 1.0, 2.0]"


def test_existing_group_is_adopted_and_required_one_is_checked():
    r = _py("""
        import torch.distributed as td, zspeed, zspeed.comm as dist
        try:
            zspeed.init_distributed(dist_init_required=False)
        except dist.DistributedError as e:
            print("ERR", e)
        # torch's Windows builds have no HashStore: a FileStore there.
        import os, tempfile
        store = td.HashStore() if hasattr(td, "HashStore") else \
            td.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
        td.init_process_group("gloo", store=store, rank=0, world_size=1)
        g = td.group.WORLD
        zspeed.init_distributed(dist_init_required=False)
        print(td.group.WORLD is g, dist.get_world_size())
    """)
    assert r.returncode == 0, r.stderr
    assert "ERR dist_init_required=False" in r.stdout
    assert "True 1" in r.stdout


def test_incomplete_launcher_variables_are_named():
    r = _py("""
        import zspeed, zspeed.comm as dist
        try:
            zspeed.init_distributed()
        except dist.DistributedError as e:
            print("ERR", e)
    """, env={"WORLD_SIZE": "2", "RANK": "0"})
    assert "ERR the launcher variables are incomplete: MASTER_ADDR, MASTER_PORT" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_across_ranks(n):
    res = run_ranks(n, """
        import torch, zspeed, zspeed.comm as dist
        zspeed.init_distributed()
        r, w = dist.get_rank(), dist.get_world_size()
        t = torch.full((5,), float(r + 1)); dist.all_reduce(t)
        out = torch.empty(w * 2); dist.all_gather_into_tensor(out, torch.full((2,), float(r)))
        rs = torch.empty(2); dist.reduce_scatter_tensor(rs, torch.arange(2.0 * w))
        objs = [None] * w; dist.all_gather_object(objs, {"r": r})
        dist.barrier()
        print(r, w, dist.get_local_rank(), dist.get_local_world_size(), t[0].item(), out.tolist(),
              rs.tolist(), [o["r"] for o in objs])
    """)
    for r in res:
        assert r.returncode == 0, r
    total = n * (n + 1) / 2
    for rank, r in enumerate(res):
        parts = r.stdout.strip()
        assert parts.startswith(f"{rank} {n} {rank} {n} {total}"), parts
        assert str([float(x) for x in range(n) for _ in range(2)]) in parts
        assert str([float(n * (2 * rank)), float(n * (2 * rank + 1))]) in parts
        assert str(list(range(n))) in parts
