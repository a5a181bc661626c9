"""The DeepSpeedExamples-style scripts in examples/ run to the end on the CPU (short runs)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the examples need torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    env["ZSPEED_DEVICE"] = "cpu"
    r = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.mark.parametrize("precision,stage", [("fp16", 0), ("bf16", 2)])
def test_cifar_like(precision, stage):
    out = _run("examples/cifar_like.py", "--precision", precision, "--stage", str(stage), "--steps", "40")
    assert "done: 40 steps" in out and "step 40: loss" in out


def test_masked_lm_trains_checkpoints_and_resumes(tmp_path):
    out = _run("examples/masked_lm.py", "--out", str(tmp_path), "--steps", "20", "--checkpoint_every", "10")
    assert "step 20: loss" in out and "done: 20 optimizer steps" in out
    out = _run("examples/masked_lm.py", "--out", str(tmp_path), "--steps", "30", "--checkpoint_every", "10",
               "--resume")
    assert "resumed from" in out and "at step 20" in out and "done: 30 optimizer steps" in out


def test_gan_two_engines():
    out = _run("examples/gan.py", "--steps", "100")
    assert "step 100: d_loss" in out and out.strip().endswith("done")
