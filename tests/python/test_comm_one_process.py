"""A one-process run needs no network (issue 31): its group's store is in memory (a file store
where torch has no in-memory one: its Windows builds), and where the host name does not
resolve (a fresh container or chroot) Gloo is given the loopback itself instead of warning.
Also the rendezvous address zspeed's launcher and tests pick: IPv4 127.0.0.1, never an
IPv4-mapped IPv6 address."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="zspeed.comm needs torch")

import distrun  # noqa: E402
from zspeed import launch  # noqa: E402

_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "GLOO_SOCKET_IFNAME")
GLOO_WARNING = "Unable to resolve hostname"

ONE_PROCESS = """
import os, torch, zspeed, zspeed.comm as dist, torch.distributed as td
zspeed.init_distributed()
t = torch.arange(3.0); dist.all_reduce(t)
g = td.new_group([0]); dist.all_reduce(t, group=g)  # a later group (the engine makes some) too
print("OK", t.tolist(), dist.get_backend(), os.environ.get("GLOO_SOCKET_IFNAME"))
"""


def _env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    e.update(extra)
    return e


def _py(code: str, argv0=(sys.executable,), **env):
    return subprocess.run([*argv0, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env=_env(**env))


def test_one_process_group_without_an_in_memory_store():
    """torch's Windows builds have no HashStore: the one-process group falls back to a FileStore
    in a private temporary folder, removed at exit (on Linux, shown by hiding HashStore)."""
    r = _py(textwrap.dedent("""
        import os, tempfile, torch.distributed as td
        if hasattr(td, "HashStore"):  # torch on Windows has none already
            del td.HashStore
        before = set(os.listdir(tempfile.gettempdir()))
    """) + ONE_PROCESS + textwrap.dedent("""
        made = [n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("zspeed-store-")]
        print("MADE", len(made), os.path.join(tempfile.gettempdir(), made[0]))
    """))
    assert r.returncode == 0, r.stderr
    assert "OK [0.0, 1.0, 2.0] gloo" in r.stdout
    made = r.stdout.split("MADE ")[1].strip()
    assert made.startswith("1 ")
    assert not os.path.exists(made.split(" ", 1)[1])  # removed at exit


def test_one_process_where_the_host_name_resolves_is_left_as_it_is():
    from zspeed import comm
    if comm._loopback_interface() is None and not comm._hostname_is_usable():
        # Windows itself always resolves its own name; Wine asks Linux, and in a fresh root the
        # name may not resolve: then Gloo warns, and Windows has no loopback name to give it.
        pytest.skip("this host's name does not resolve and the platform has no loopback interface name "
                    "for Gloo (Windows CPython under Wine in a fresh root)")
    r = _py(ONE_PROCESS)
    assert r.returncode == 0, r.stderr
    assert GLOO_WARNING not in r.stderr
    if "OK [0.0, 1.0, 2.0] gloo None" not in r.stdout:  # this host's name does not resolve
        assert "OK [0.0, 1.0, 2.0] gloo lo" in r.stdout or "gloo lo0" in r.stdout, r.stdout


def _unresolvable_host(code: str, **env):
    """Runs code in a new UTS namespace whose host name is in no /etc/hosts (a fresh container's
    case); skips where namespaces cannot be made (not root, no unshare)."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None or shutil.which("hostname") is None:
        pytest.skip("needs Linux's unshare and hostname (a new UTS namespace)")
    probe = subprocess.run(["unshare", "-u", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a UTS namespace here: {probe.stderr.decode().strip()}")
    shell = 'hostname zspeed-no-such-host-31.invalid && exec "$@"'
    return _py(code, argv0=("unshare", "-u", "sh", "-c", shell, "sh", sys.executable), **env)


def test_one_process_with_an_unresolvable_host_name_uses_the_loopback_without_a_warning():
    r = _unresolvable_host(ONE_PROCESS)
    assert r.returncode == 0, r.stderr
    assert GLOO_WARNING not in r.stderr, r.stderr
    assert "OK [0.0, 1.0, 2.0] gloo lo" in r.stdout, r.stdout
    # Without zspeed (plain torch), the same process shows Gloo's warning: the test is real.
    plain = _unresolvable_host("""
        import torch, torch.distributed as td
        td.init_process_group("gloo", store=td.HashStore(), rank=0, world_size=1)
        t = torch.ones(1); td.all_reduce(t); print("OK")
    """)
    assert plain.returncode == 0 and GLOO_WARNING in plain.stderr, plain.stderr


def test_a_gloo_interface_the_user_chose_is_kept():
    r = _unresolvable_host(ONE_PROCESS, GLOO_SOCKET_IFNAME="lo")
    assert r.returncode == 0, r.stderr
    assert "OK [0.0, 1.0, 2.0] gloo lo" in r.stdout


def test_one_rank_of_a_launcher_is_quiet_too():
    """torchrun --nproc_per_node 1 (the launcher's variables, world size 1): the same."""
    r = _unresolvable_host(ONE_PROCESS, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(distrun.free_port()))
    assert r.returncode == 0, r.stderr
    assert GLOO_WARNING not in r.stderr, r.stderr


def test_the_rendezvous_address_is_ipv4_loopback():
    """zspeed launch's default master address and the tests' (distrun) are the IPv4 literal.
    The "[::ffff:127.0.0.1]" in c10d's Windows warning is torch's own IPv6-first attempt at
    that address (docs/WINDOWS.md), not an address zspeed builds."""
    cmd, _ = launch.build_command(["--num_gpus", "2", "train.py"], environ={"ZSPEED_DEVICE": "cpu"})
    assert "--master_addr=127.0.0.1" in cmd
    src = open(distrun.__file__).read()
    assert 'MASTER_ADDR="127.0.0.1"' in src and "::ffff" not in src


@pytest.mark.skipif(os.name == "nt", reason="plain torchrun's own agent cannot make its store with torch's Windows "
                    "wheels; there test_launch.py runs this path through zspeed launch")
def test_the_windows_launcher_store_serves_ranks_under_torchrun(tmp_path):
    """On Windows, zspeed makes the env:// store itself (torch's Windows wheels cannot make it
    under torchrun: they ask for libuv); the same function, run here under torchrun's agent
    (which serves the store), gives the ranks a working group."""
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent("""
        import os, datetime, torch, torch.distributed as td
        from zspeed import comm
        assert os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        r, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = comm._windows_env_store(r, ws, datetime.timedelta(seconds=60))
        td.init_process_group("gloo", store=store, rank=r, world_size=ws)
        t = torch.full((2,), float(r + 1)); td.all_reduce(t)
        with open(os.path.join(os.path.dirname(__file__), f"rank{r}.txt"), "w") as f:  # stdout interleaves
            f.write(f"RANK {r} {t.tolist()}")
        td.destroy_process_group()
    """))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        str(distrun.free_port()), str(script)], capture_output=True, text=True, timeout=300,
                       env=_env(OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in range(2):
        assert (tmp_path / f"rank{rank}.txt").read_text() == f"RANK {rank} [3.0, 3.0]"


@pytest.mark.parametrize("forced,want", [("cpu", "gloo"), ("cuda:0", "nccl"), ("", "nccl")])
def test_the_default_backend_follows_zspeed_device(monkeypatch, forced, want):
    """On a GPU machine, ranks told ZSPEED_DEVICE=cpu train on the CPU: Gloo, not NCCL (which
    would put every rank on GPU 0: 'Duplicate GPU detected')."""
    import torch
    import zspeed.comm as c
    monkeypatch.delenv("ZSPEED_DIST_BACKEND", raising=False)
    monkeypatch.setenv("ZSPEED_DEVICE", forced)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(c._td, "is_nccl_available", lambda: True)
    monkeypatch.setattr(c.sys, "platform", "linux")
    assert c.default_backend() == want
    monkeypatch.setenv("ZSPEED_DIST_BACKEND", "gloo")
    assert c.default_backend() == "gloo"
