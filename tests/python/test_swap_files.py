"""Who owns an NVMe swap file: a live swapper holds its file; a file nobody holds was left by a
process that died. Restarts must work (also when the new process gets the old one's PID, as is
common in containers), files of dead runs are reclaimed, and two live runs never share a file
or delete each other's."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import zspeed
from zspeed import NativeError
from zspeed.ops.swap import NVMeOptimizerSwapper


def _swaps(d) -> list:
    return sorted(n for n in os.listdir(d) if n.endswith(".swap"))


def test_a_second_swapper_cannot_take_a_live_file(tmp_path):
    a = NVMeOptimizerSwapper([300, 77], tmp_path, name="mine", buffer_count=2)
    a.init_partition(0, np.ones(300, np.float32))
    with pytest.raises(NativeError) as ei:
        NVMeOptimizerSwapper([5], tmp_path, name="mine", buffer_count=2)
    assert ei.value.name == "ZS_EEXIST" and "in use by a running swapper" in ei.value.detail
    with pytest.raises(NativeError) as ei:
        NVMeOptimizerSwapper([5], tmp_path, name="mine", buffer_count=2, overwrite=True)
    assert ei.value.name == "ZS_EBUSY" and "in use" in ei.value.detail
    # The live swapper's file and state are untouched.
    assert a.read_arrays(0, ["param"])["param"].tolist() == [1.0] * 300
    a.close()
    assert _swaps(tmp_path) == []


def test_a_file_nobody_holds_is_named_as_left_by_a_dead_process(tmp_path):
    (tmp_path / "old.swap").write_bytes(b"\0" * 4096)
    with pytest.raises(NativeError) as ei:
        NVMeOptimizerSwapper([5], tmp_path, name="old", buffer_count=2)
    assert ei.value.name == "ZS_EEXIST" and "left by a process that died" in ei.value.detail
    s = NVMeOptimizerSwapper([5], tmp_path, name="old", buffer_count=2, overwrite=True)
    s.close()
    assert _swaps(tmp_path) == []


def _child_env() -> dict:
    root = str(Path(zspeed.__file__).parents[1])
    return dict(os.environ, ZSPEED_DEVICE="cpu",
                PYTHONPATH=os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p]))


ENGINE = """
import os, sys, time, torch, zspeed
torch.manual_seed(0)
def engine(path):
    m = torch.nn.Sequential(torch.nn.Linear(37, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5))
    cfg = {"train_batch_size": 4, "optimizer": {"type": "AdamW"},
           "zero_optimization": {"stage": 2, "sub_group_size": 300,
                                 "offload_optimizer": {"device": "nvme", "nvme_path": path, "buffer_count": 2}},
           "aio": {"block_size": 65536, "queue_depth": 4}}
    e, *_ = zspeed.initialize(model=m, config=cfg)
    x = torch.randn(4, 37)
    e.backward(e(x).square().mean()); e.step()
    return e
"""


def test_restarted_job_with_the_same_pid_starts(tmp_path):
    pytest.importorskip("torch", reason="the child process trains an engine (torch)")
    # The previous incarnation of this job had the same PID and was killed: its swap file, named
    # as a swapper of that PID would name it, is still there. The new engine must start, and the
    # dead file must go.
    code = ENGINE + textwrap.dedent(f"""
        path = {str(tmp_path)!r}
        for k in range(4):
            with open(os.path.join(path, f"zspeed_swap_{{os.getpid()}}_{{k}}.swap"), "wb") as f:
                f.truncate(1 << 20)
        e = engine(path)
        print("STEPS", e.global_steps, sorted(os.listdir(path)))
        e.close()
        print("LEFT", sorted(os.listdir(path)))
    """)
    res = subprocess.run([sys.executable, "-c", code], env=_child_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert lines["STEPS"].startswith("1 ")
    assert f"_{os.getpid()}_" not in lines["STEPS"]  # the dead files were reclaimed
    assert lines["LEFT"] == "[]"


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_files_of_a_killed_run_are_reclaimed_and_a_live_run_is_left_alone(tmp_path):
    code = ENGINE + textwrap.dedent(f"""
        e = engine({str(tmp_path)!r})
        print("READY", flush=True)
        time.sleep(120)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], env=_child_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "READY", (line, child.stderr.read() if child.poll() is not None else "")
        theirs = _swaps(tmp_path)
        assert len(theirs) == 1
        # A second live run in the same nvme_path: its own file; the other run's file stays.
        sys.path.insert(0, str(Path(__file__).parent))
        from engine_helpers import mlp
        cfg = {"train_batch_size": 4, "optimizer": {"type": "AdamW"},
               "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path),
                                                                       "buffer_count": 2}}}
        os.environ["ZSPEED_DEVICE"] = "cpu"
        mine, *_ = zspeed.initialize(model=mlp(), config=cfg)
        now = _swaps(tmp_path)
        assert len(now) == 2 and theirs[0] in now
        ours = [n for n in now if n != theirs[0]]
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert _swaps(tmp_path) == sorted(now)  # a killed process deletes nothing
        # The next engine to start reclaims the dead run's file, and leaves the live one (ours).
        again, *_ = zspeed.initialize(model=mlp(), config=cfg)
        left = _swaps(tmp_path)
        assert theirs[0] not in left and ours[0] in left and len(left) == 2
        again.close()
        mine.close()
        assert _swaps(tmp_path) == []
    finally:
        child.kill()
        child.wait()


def test_default_names_are_fresh_for_every_swapper(tmp_path):
    # A name derived from the PID would collide with the file of a killed predecessor that had
    # the same PID (containers); a random default never does.
    (tmp_path / f"zspeed_swap_{os.getpid()}_0.swap").write_bytes(b"\0" * 4096)
    a = NVMeOptimizerSwapper([5], tmp_path, buffer_count=2)
    b = NVMeOptimizerSwapper([5], tmp_path, buffer_count=2)
    names = _swaps(tmp_path)
    assert len(names) == 3 and all(n.startswith("zspeed_swap_") for n in names)
    a.close()
    b.close()
    assert _swaps(tmp_path) == [f"zspeed_swap_{os.getpid()}_0.swap"]
