"""zspeed.hf.install(): Hugging Face's Trainer trains with zspeed (ZeRO-2 + CPU offload on a
small random Llama), checkpoints and resumes to the same losses; and an environment with
the real DeepSpeed installed (a fake distribution here) keeps it unless install() is called."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_trainer.py"


def _env(extra_path=None):
    env = dict(os.environ)
    # One process without a launcher: variables left by other tests must not make accelerate
    # look for a rendezvous.
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    # The children import the zspeed this process imported (its folder may be site-packages,
    # so the fake deepspeed's folder comes first).
    import zspeed
    paths = ([str(extra_path)] if extra_path else []) + \
        [os.path.dirname(os.path.dirname(os.path.abspath(zspeed.__file__)))] + \
        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["ZSPEED_DEVICE"] = "cpu"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _needs_hf():
    for mod in ("transformers", "accelerate"):
        res = subprocess.run([sys.executable, "-c", f"import {mod}"], env=_env(), capture_output=True)
        if res.returncode != 0:
            pytest.skip(f"{mod} is not installed (requirements-dev.txt has it)")


def _fake_deepspeed(tmp_path: Path) -> Path:
    """A site folder with a 'deepspeed' distribution that must not be imported after install()."""
    site = tmp_path / "site"
    pkg = site / "deepspeed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.16.0'\nREAL = True\n")
    info = site / "deepspeed-0.16.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.16.0\n")
    (info / "RECORD").write_text("")
    return site


def _run(args, env, timeout=600):
    res = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def test_install_is_opt_in_and_leaves_a_real_deepspeed_alone(tmp_path):
    site = _fake_deepspeed(tmp_path)
    code = r"""
import importlib.metadata as md, sys
import deepspeed
assert getattr(deepspeed, "REAL", False) and md.version("deepspeed") == "0.16.0"
del sys.modules["deepspeed"]
import zspeed.hf
zspeed.hf.install()
import deepspeed, deepspeed.ops.adam, deepspeed.comm
from deepspeed.ops.adam import DeepSpeedCPUAdam
import zspeed
assert deepspeed is zspeed and deepspeed.zero is zspeed.runtime.zero
assert md.version("deepspeed") == zspeed.hf.DEEPSPEED_API_VERSION
assert deepspeed.ops.adam.__spec__.name == "zspeed.ops.adam"
zspeed.hf.uninstall()
import deepspeed
assert getattr(deepspeed, "REAL", False) and md.version("deepspeed") == "0.16.0"
# After the real one is imported, install() refuses.
try:
    zspeed.hf.install()
except zspeed.ZSpeedError as e:
    assert "already imported" in str(e)
else:
    raise AssertionError("install() after the real deepspeed did not refuse")
print("ok")
"""
    assert _run(["-c", code], _env(site)).stdout.strip().endswith("ok")


def test_submodules_are_reachable_as_attributes_after_a_plain_import():
    """accelerate reads deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES after only
    ``import deepspeed``; a fresh interpreter, so that nothing imported the module before."""
    code = r"""
import sys
import zspeed.hf
zspeed.hf.install()
import deepspeed
assert "zspeed.runtime.lr_schedules" not in sys.modules
assert "OneCycle" in deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES
assert deepspeed.runtime.zero is deepspeed.zero
# what transformers' DeepSpeed tests import at module level
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint, load_state_dict_from_zero_checkpoint
from deepspeed.ops.aio import AsyncIOBuilder
from deepspeed.ops.op_builder import CPUAdamBuilder
assert deepspeed.ops.__compatible_ops__[AsyncIOBuilder.NAME] is True
assert AsyncIOBuilder().load().aio_handle is deepspeed.ops.aio.AsyncIOHandle
assert CPUAdamBuilder().load().DeepSpeedCPUAdam is not None
try:
    deepspeed.runtime.no_such_module
except AttributeError as e:
    assert "no_such_module" in str(e)
else:
    raise AssertionError("an unknown attribute did not raise AttributeError")
print("ok")
"""
    assert _run(["-c", code], _env()).stdout.strip().endswith("ok")


@pytest.mark.parametrize("with_real", [False, True])
def test_trainer_zero2_offload_checkpoint_and_resume(tmp_path, with_real):
    _needs_hf()
    env = _env(_fake_deepspeed(tmp_path) if with_real else None)
    out = tmp_path / "run"
    _run([str(EXAMPLE), "--out", str(out), "--max_steps", "6", "--save_steps", "3"], env)
    full = json.loads((out / "summary.json").read_text())
    assert full["global_step"] == 6 and full["engine"] == "zspeed.runtime.engine"
    assert full["losses"][-1] < full["losses"][0]
    assert (out / "checkpoint-3" / "global_step3").is_dir()
    _run([str(EXAMPLE), "--out", str(out), "--max_steps", "6", "--save_steps", "3",
          "--resume", str(out / "checkpoint-3")], env)
    resumed = json.loads((out / "summary_resumed.json").read_text())
    # The resumed run repeats steps 4-6 of the uninterrupted one exactly (zspeed's checkpoints
    # resume bit-exactly; the Trainer restores the data order and the RNG).
    assert resumed["losses"][3:] == full["losses"][3:] and resumed["global_step"] == 6


def test_trainer_zero3_offload_checkpoint_resume_and_16bit_save(tmp_path):
    """The transformers documentation's ZeRO-3 offload config (parameters and optimizer state
    in CPU memory, stage3_gather_16bit_weights_on_model_save): trains, saves the whole 16-bit
    model through accelerate's get_state_dict, and resumes exactly."""
    _needs_hf()
    env = _env()
    out = tmp_path / "run"
    args = [str(EXAMPLE), "--out", str(out), "--max_steps", "6", "--save_steps", "3", "--stage", "3"]
    _run(args, env)
    full = json.loads((out / "summary.json").read_text())
    assert full["global_step"] == 6 and full["engine"] == "zspeed.runtime.engine"
    assert full["losses"][-1] < full["losses"][0]
    from safetensors.torch import load_file
    saved = load_file(str(out / "final" / "model.safetensors"))
    assert saved["model.embed_tokens.weight"].shape == (97, 32)  # whole, not a shard
    _run(args + ["--resume", str(out / "checkpoint-3")], env)
    resumed = json.loads((out / "summary_resumed.json").read_text())
    assert resumed["losses"][3:] == full["losses"][3:] and resumed["global_step"] == 6


def test_trainer_evaluate_without_training_at_zero3_gives_the_plain_models_loss(tmp_path):
    """An evaluation-only run (Trainer.evaluate() with no engine yet: transformers builds one
    without an optimizer, DeepSpeed's ZeRO-Inference) at ZeRO-3 with the parameters in CPU
    memory: the loss equals the plain model's (fp32; the two average the same four batch losses
    in a different order, so to 1e-5)."""
    _needs_hf()
    out = tmp_path / "eval"
    _run([str(EXAMPLE), "--out", str(out), "--stage", "3", "--eval_only"], _env())
    got = json.loads((out / "summary_eval.json").read_text())
    assert got["engine"] == "zspeed.runtime.engine" and got["optimizer"] == "None"
    assert abs(got["eval_loss"] - got["plain_loss"]) < 1e-5, got


def test_from_pretrained_under_zero3_builds_with_zero_init_and_loads_the_weights(tmp_path):
    """With a ZeRO-3 config in TrainingArguments, from_pretrained builds the model under
    zspeed.zero.Init (transformers patches partition_parameters around it) and loads the
    saved weights through GatheredParameters; the Trainer then trains it."""
    _needs_hf()
    code = f"""
import json, sys, torch
sys.path.insert(0, {str(EXAMPLE.parent)!r})
import zspeed.hf
zspeed.hf.install()
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from transformers.integrations import is_deepspeed_zero3_enabled
import hf_trainer as H
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
ref = LlamaForCausalLM(cfg)
ref.save_pretrained({str(tmp_path / 'tiny')!r})
ds = json.loads(json.dumps(H.DS_CONFIG))
ds["zero_optimization"] = {{"stage": 3, "offload_param": {{"device": "cpu"}}, "offload_optimizer": {{"device": "cpu"}}}}
args = TrainingArguments(output_dir={str(tmp_path / 'out')!r}, per_device_train_batch_size=4, max_steps=2,
                         report_to=[], deepspeed=ds, use_cpu=True, save_strategy="no")
assert is_deepspeed_zero3_enabled()
m = LlamaForCausalLM.from_pretrained({str(tmp_path / 'tiny')!r}, torch_dtype=torch.float32)
for (n, a), b in zip(m.named_parameters(), ref.parameters()):
    assert torch.equal(a.detach(), b.detach()), n
Trainer(model=m, args=args, train_dataset=H.Tokens()).train()
print("OK")
"""
    res = _run(["-c", code], _env())
    assert "OK" in res.stdout
