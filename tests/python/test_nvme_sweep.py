"""The stale swap file sweep at an NVMe engine's start, in an nvme_path that others can write.

A FIFO, a symbolic link, a folder or another user's file named like a swap file
(``zspeed_swap_*.swap``) must not stop the start (opening a FIFO blocks), be followed, or
be deleted: the sweep acts only on regular files of this user. The engine starts in a
fresh interpreter with a timeout, so a regression fails instead of hanging the suite.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the runtime needs torch")

from engine_helpers import native_ops_available, run_script  # noqa: E402

pytestmark = pytest.mark.skipif(not native_ops_available(), reason="NVMe offload needs libzspeed")
POSIX = sys.platform != "win32"

START = """
import json, os, torch, zspeed
from engine_helpers import TinyLM, lm_loss, token_data, train
nvme, what = os.environ["NVME"], os.environ["WHAT"]
m = TinyLM()
z = {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}
if what == "param":
    m.mid.weight.requires_grad_(False)  # frozen parameters go to the NVMe parameter store
    z = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "stage3_param_persistence_threshold": 0,
         "offload_param": {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0, "buffer_count": 2}}
cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
       "zero_optimization": z}
e, *_ = zspeed.initialize(model=m, config=cfg)
train(e, token_data(1), loss=lm_loss)
print(json.dumps(sorted(os.listdir(nvme))), flush=True)
e.close()
"""


def _plant(folder: Path, victim: Path) -> dict:
    """A FIFO, a symlink, a folder and (as root) another user's file, all named like swap files."""
    planted = {}
    if hasattr(os, "mkfifo"):
        os.mkfifo(folder / "zspeed_swap_fifo.swap")
        planted["zspeed_swap_fifo.swap"] = "fifo"
    if POSIX:
        os.symlink(victim, folder / "zspeed_swap_link.swap")
        planted["zspeed_swap_link.swap"] = "link"
    (folder / "zspeed_swap_dir.swap").mkdir()
    planted["zspeed_swap_dir.swap"] = "dir"
    if POSIX and os.geteuid() == 0:
        other = folder / "zspeed_swap_other.swap"
        other.write_bytes(b"x" * 4096)
        os.chown(other, 54321, 54321)
        planted["zspeed_swap_other.swap"] = "other"
    return planted


def _untouched(folder: Path, victim: Path, planted: dict) -> None:
    for name, kind in planted.items():
        st = os.lstat(folder / name)
        ok = {"fifo": stat.S_ISFIFO, "link": stat.S_ISLNK, "dir": stat.S_ISDIR, "other": stat.S_ISREG}[kind]
        assert ok(st.st_mode), (name, kind)
    if "zspeed_swap_link.swap" in planted:
        assert os.readlink(folder / "zspeed_swap_link.swap") == str(victim)
    assert victim.read_bytes() == b"y" * 4096


def _run(tmp_path, body: str, **env):
    import subprocess
    try:
        res = run_script(tmp_path, "script.py", body, timeout=180, env={"ZSPEED_DEVICE": "cpu", **env})
    except subprocess.TimeoutExpired:
        pytest.fail("blocked on a planted swap file name (a FIFO?) for 180 s")
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.mark.parametrize("what", ["optimizer", "param"])
def test_planted_swap_names_do_not_stop_an_nvme_start(tmp_path, what):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    victim = tmp_path / "victim.swap"
    victim.write_bytes(b"y" * 4096)
    planted = _plant(nvme, victim)
    res = _run(tmp_path, START, NVME=str(nvme), WHAT=what)
    during = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(planted) <= set(during) and any(n not in planted and n.endswith(".swap") for n in during)
    _untouched(nvme, victim, planted)
    assert sorted(os.listdir(nvme)) == sorted(planted)  # the engine removed its own files, nothing else


def test_a_stale_swap_file_of_ours_is_still_reclaimed(tmp_path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    (nvme / "zspeed_swap_dead_0.swap").write_bytes(b"z" * 8192)
    victim = tmp_path / "victim.swap"
    victim.write_bytes(b"y" * 4096)
    planted = _plant(nvme, victim)
    res = _run(tmp_path, "import os\nfrom zspeed.runtime.nvme import reclaim_stale_swap_files\n"
                         "print(reclaim_stale_swap_files(os.environ['NVME']))\n", NVME=str(nvme))
    assert res.stdout.split() == ["(1,", "8192)"]
    _untouched(nvme, victim, planted)
    assert sorted(os.listdir(nvme)) == sorted(planted)


RACE = """
import json, os, torch, zspeed
import zspeed.runtime.zero3_nvme as zn
from zspeed.runtime.nvme import reclaim_stale_swap_files
from engine_helpers import TinyLM, lm_loss, token_data, train
nvme = os.environ["NVME"]
swept = []

def sweep():  # what another rank's engine start does in the same nvme_path, at the worst moment
    swept.append(reclaim_stale_swap_files(nvme))

real_open = zn.lib.zs_aio_file_open
def aio_open_then_sweep(*args):
    rc = real_open(*args)
    sweep()
    return rc
zn.lib.zs_aio_file_open = aio_open_then_sweep
if os.environ["WHERE"] == "before-lock" and os.name != "nt":
    import fcntl
    real_flock, first = fcntl.flock, [True]
    def sweep_then_flock(fd, op):
        if first[0]:
            first[0] = False
            sweep()  # between the creation and the lock: the sweep wins, the claim retries
        return real_flock(fd, op)
    fcntl.flock = sweep_then_flock
m = TinyLM()
m.mid.weight.requires_grad_(False)
z = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "stage3_param_persistence_threshold": 0,
     "offload_param": {"device": "nvme", "nvme_path": nvme, "max_in_cpu": 0, "buffer_count": 2}}
e, *_ = zspeed.initialize(model=m, config={"train_micro_batch_size_per_gpu": 4, "zero_optimization": z,
                                           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})
train(e, token_data(2), loss=lm_loss)
print(json.dumps({"swept": swept, "files": sorted(os.listdir(nvme))}), flush=True)
e.close()
"""


@pytest.mark.parametrize("where", ["after-open", "before-lock"])
def test_a_sweep_racing_with_the_parameter_store_start_cannot_take_its_file(tmp_path, where):
    """Ranks that share nvme_path start together: one rank's sweep of stale swap files runs
    while another creates its parameter swap file. The file must be held before anything else
    opens it (else the sweep deletes it and the start fails), and a sweep that wins the
    instant between creation and lock makes the claim take a new name."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    res = run_script(tmp_path, "race.py", RACE, env={"NVME": str(nvme), "WHERE": where, "ZSPEED_DEVICE": "cpu"},
                     timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    files = [f for f in out["files"] if f.endswith("_param.swap")]
    assert len(files) == 1, out  # the store's one file, still there during training
    removed = sum(n for n, _ in out["swept"])
    assert removed == (1 if where == "before-lock" and POSIX else 0), out
    assert not [f for f in os.listdir(nvme) if f.endswith(".swap")]  # close() removed it
