"""Checkpoints: round trip, bit-exact resume, crash safety, validation, to-fp32."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch (pip install zspeed[torch])")
pytest.importorskip("safetensors", reason="zspeed checkpoints need safetensors (pip install zspeed[torch])")

import zspeed

# These tests compare against CPU references: keep the engine on the CPU on GPU machines too.
os.environ["ZSPEED_DEVICE"] = "cpu"
from zspeed.runtime.checkpoint import CheckpointError, main_to_fp32
from engine_helpers import TinyLM, lm_loss, native_ops_available, token_data as data, train


CONFIGS = {
    "fp32": {},
    "bf16_offload": {"bf16": {"enabled": True},
                     "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    "fp16_offload_native": {"fp16": {"enabled": True, "initial_scale_power": 10},
                            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "state_dtype": "bf16"}},
                            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    "fp16_sched_clip": {"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 3},
                        "gradient_clipping": 0.3, "zero_optimization": {"stage": 1},
                        "scheduler": {"type": "WarmupCosineLR",
                                      "params": {"total_num_steps": 30, "warmup_num_steps": 5}}},
}


def make(kind, gas=1):
    c = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}}}
    c.update(json.loads(json.dumps(CONFIGS[kind])))
    if kind == "bf16_offload":
        c["optimizer"]["params"]["torch_adam"] = True
    e, *_ = zspeed.initialize(model=TinyLM(), config=c)
    return e


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_bit_exact_resume(kind, tmp_path):
    if "native" in kind and not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available")
    batches = data(24)
    a = make(kind, gas=2)
    train(a, batches[:10], loss=lm_loss)
    saved_scale = a.loss_scale
    assert a.save_checkpoint(tmp_path, client_state={"epoch": 2, "ids": batches[0], "nested": [1, {"x": 0.5}]})
    train(a, batches[10:], loss=lm_loss)
    b = make(kind, gas=2)
    path, client = b.load_checkpoint(tmp_path)
    assert path == str(tmp_path / "global_step5")
    assert client["epoch"] == 2 and torch.equal(client["ids"], batches[0]) and client["nested"] == [1, {"x": 0.5}]
    assert (b.global_steps, b.micro_steps, b.loss_scale) == (5, 10, saved_scale)
    train(b, batches[10:], loss=lm_loss)
    for (n, x), y in zip(a.module.state_dict().items(), b.module.state_dict().values()):
        assert torch.equal(x, y), n  # bit-exact: every tensor identical after the resumed run
    assert a.get_lr() == b.get_lr() and a.loss_scale == b.loss_scale and a.skipped_steps == b.skipped_steps
    ma, mb = a._master_named(), b._master_named()
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_layout_latest_and_tags(tmp_path):
    e = make("fp32")
    train(e, data(3), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="first")
    train(e, data(1), loss=lm_loss)
    e.save_checkpoint(tmp_path)
    assert (tmp_path / "latest").read_text() == "global_step4"
    files = sorted(os.listdir(tmp_path / "first"))
    assert files == ["master.safetensors", "meta.json", "model.safetensors", "optim.safetensors"]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]  # no temp files left behind
    f = make("fp32")
    assert f.load_checkpoint(tmp_path, tag="first")[0].endswith("first") and f.global_steps == 3
    assert f.load_checkpoint(tmp_path)[0].endswith("global_step4") and f.global_steps == 4
    e.save_checkpoint(tmp_path, tag="nolatest", save_latest=False)
    assert (tmp_path / "latest").read_text() == "global_step4"
    with pytest.raises(CheckpointError, match="not a valid directory name"):
        e.save_checkpoint(tmp_path, tag="../evil")


def test_missing_checkpoint_returns_none(tmp_path):
    e = make("fp32")
    assert e.load_checkpoint(tmp_path / "nothing") == (None, None)
    assert e.load_checkpoint(tmp_path, tag="absent") == (None, None)


def test_load_validation_names_the_problem(tmp_path):
    e = make("fp32")
    train(e, data(1), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="t")

    class Wider(TinyLM):
        def __init__(self):
            super().__init__()
            self.mid = torch.nn.Linear(11, 11)
            self.extra = torch.nn.Linear(2, 2)

    class Other(TinyLM):
        def __init__(self):
            super().__init__(vocab=29)

    cfg = {"train_batch_size": 4, "optimizer": {"type": "AdamW"}}
    o, *_ = zspeed.initialize(model=Other(), config=cfg)
    with pytest.raises(CheckpointError, match=r"shape mismatch: emb.weight: checkpoint \(23, 11\) vs model \(29, 11\)"):
        o.load_checkpoint(tmp_path, tag="t")
    w, *_ = zspeed.initialize(model=Wider(), config=cfg)
    before = {k: v.clone() for k, v in w.module.state_dict().items()}
    with pytest.raises(CheckpointError, match="missing 2: extra.weight, extra.bias"):
        w.load_checkpoint(tmp_path, tag="t")
    # a failed load changed nothing
    assert all(torch.equal(before[k], v) for k, v in w.module.state_dict().items())
    # weights only, non-strict: loads what matches
    w.load_checkpoint(tmp_path, tag="t", load_module_strict=False, load_optimizer_states=False)
    assert torch.equal(w.module.mid.weight, e.module.mid.weight) and w.global_steps == 0

    (tmp_path / "t" / "optim.safetensors").unlink()
    with pytest.raises(CheckpointError, match="incomplete: optim.safetensors is missing"):
        make("fp32").load_checkpoint(tmp_path, tag="t")
    (tmp_path / "t" / "meta.json").unlink()
    with pytest.raises(CheckpointError, match="meta.json is missing"):
        make("fp32").load_checkpoint(tmp_path, tag="t")


def test_mixed_saves_and_corruption_detected(tmp_path):
    e = make("fp32")
    train(e, data(1), loss=lm_loss)
    e.save_checkpoint(tmp_path, tag="a")
    e.save_checkpoint(tmp_path, tag="b")
    # Simulate a save over tag 'a' killed after one file: a file from another save is detected.
    os.replace(tmp_path / "b" / "master.safetensors", tmp_path / "a" / "master.safetensors")
    with pytest.raises(CheckpointError, match="mixes files of two saves"):
        make("fp32").load_checkpoint(tmp_path, tag="a")
    p = tmp_path / "b" / "model.safetensors"
    p.write_bytes(p.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        make("fp32").load_checkpoint(tmp_path, tag="b")


def test_optimizer_mismatch_and_client_state_errors(tmp_path):
    e = make("fp32")
    train(e, data(1), loss=lm_loss)
    with pytest.raises(CheckpointError, match="client_state value at 'client_state.f' has type"):
        e.save_checkpoint(tmp_path, client_state={"f": object()})
    e.save_checkpoint(tmp_path, tag="t")
    lion, *_ = zspeed.initialize(model=TinyLM(), config={"train_batch_size": 4, "optimizer": {"type": "Lion"}})
    with pytest.raises(CheckpointError, match="belongs to AdamW"):
        lion.load_checkpoint(tmp_path, tag="t")
    assert lion.load_checkpoint(tmp_path, tag="t", load_optimizer_states=False)[0] is not None


CHILD = r"""
import sys, time, torch
import zspeed
import zspeed.runtime.checkpoint as ck
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
e, *_ = zspeed.initialize(model=model, config={{"train_batch_size": 2, "optimizer": {{"type": "AdamW"}}}})
x = torch.randn(2, 256)
e.backward(e(x).square().mean()); e.step()
e.save_checkpoint({d!r}, tag="good")
e.backward(e(x).square().mean()); e.step()
def stall(name):
    print("WROTE", name, flush=True)
    if name == "master.safetensors":
        time.sleep(60)
ck._after_file_written = stall
e.save_checkpoint({d!r}, tag="torn")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_killed_mid_write_leaves_previous_loadable(tmp_path):
    d = tmp_path / "ck"
    # The child imports the same zspeed package as this test (installed or source tree).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(zspeed.__file__).parents[1])] +
                                                      [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(d=str(d))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line.strip())
            if line.strip() == "WROTE master.safetensors":
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait()
    assert "WROTE master.safetensors" in seen, (seen, proc.stderr.read())
    assert (d / "latest").read_text() == "good"
    assert (d / "torn" / "model.safetensors").exists() and not (d / "torn" / "meta.json").exists()
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    e, *_ = zspeed.initialize(model=model, config={"train_batch_size": 2, "optimizer": {"type": "AdamW"}})
    path, _ = e.load_checkpoint(d)
    assert path.endswith("good") and e.global_steps == 1
    with pytest.raises(CheckpointError, match="incomplete"):
        e.load_checkpoint(d, tag="torn")


def test_to_fp32(tmp_path):
    from safetensors.torch import load_file
    e = make("bf16_offload")
    train(e, data(3), loss=lm_loss)
    e.save_checkpoint(tmp_path)
    out = tmp_path / "w.safetensors"
    assert main_to_fp32([str(tmp_path), str(out)]) == 0
    w = load_file(str(out))
    masters = e._master_named()
    assert all(t.dtype == torch.float32 for t in w.values())
    for k, m in masters.items():
        assert torch.equal(w[k], m.cpu()), k  # the fp32 masters, not the bf16 weights
    assert "calls" in w and "out.weight" not in w  # buffer kept; tied alias stored once
    fresh = TinyLM()
    sd = dict(w)
    sd["out.weight"] = sd["emb.weight"]
    fresh.load_state_dict(sd)
    assert main_to_fp32([str(tmp_path / "nothing"), str(out)]) == 1
