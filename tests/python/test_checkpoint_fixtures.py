"""Checkpoints written by an earlier zspeed still load (fixtures/make_checkpoints.py made them
with de9c521, before the runtime's restructure): one of each kind an engine writes (stage 0,
CPU offload fp32 and bf16 with 8-bit states, NVMe offload, ZeRO-3, the GPU/CPU split, two
ranks at stage 2 and at stage 3). Each is loaded by today's engine of the same kind: the
weights it loads must equal the checkpoint's bit for bit (nothing in the format may have
changed); then it takes one more step, and its weights must equal those the earlier zspeed had
after the same load and step. That comparison is bit for bit for the bf16 kinds; with fp32
models the step's gradients come from torch's CPU matmuls, whose rounding moved between torch
releases (2.15 differs from the fixtures' torch by up to 3e-8 absolute), so fp32 weights are
compared to 2e-7 absolute and 2e-6 relative: a few ulps, far below what a change in zspeed's
update would move them (about lr, 1e-3 here)."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

torch = pytest.importorskip("torch", reason="the runtime needs torch")
pytest.importorskip("safetensors", reason="checkpoints need safetensors")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import make_checkpoints as mk  # noqa: E402
from distrun import run_ranks  # noqa: E402
from engine_helpers import native_ops_available  # noqa: E402

pytestmark = pytest.mark.skipif(not native_ops_available(), reason="the offloaded paths need libzspeed")
FIXTURES = os.path.join(HERE, "fixtures", "checkpoints")


@pytest.mark.parametrize("kind", list(mk.KINDS))
def test_an_earlier_zspeeds_checkpoint_loads_and_trains_on_bit_for_bit(kind, tmp_path):
    from safetensors import safe_open
    src = os.path.join(FIXTURES, kind)
    out = tmp_path / kind
    shutil.copytree(os.path.join(src, "ckpt"), out / "ckpt")  # a load may add its lock file
    res = run_ranks(mk.KINDS[kind][0], mk.body(kind, str(out), "loaded"), timeout=300)
    for r in res:
        assert r.returncode == 0, r
    with safe_open(os.path.join(src, "expected.safetensors"), "pt") as a, \
            safe_open(str(out / "loaded.safetensors"), "pt") as b:
        assert set(a.keys()) == set(b.keys())
        for k in a.keys():
            want, got = a.get_tensor(k), b.get_tensor(k)
            if mk.KINDS[kind][2] == "bf16":
                assert torch.equal(want, got), k
            else:
                torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-7, msg=lambda m, k=k: f"{k}: {m}")
        ma, mb = a.metadata(), b.metadata()
        assert ma["global_steps"] == mb["global_steps"] and json.loads(ma["lr"]) == json.loads(mb["lr"])
    with safe_open(os.path.join(src, "ckpt", "t", "model.safetensors"), "pt") as a, \
            safe_open(str(out / "as_loaded.safetensors"), "pt") as b:
        assert set(a.keys()) == set(b.keys())
        for k in a.keys():
            assert torch.equal(a.get_tensor(k), b.get_tensor(k)), k  # the format: the weights as saved
