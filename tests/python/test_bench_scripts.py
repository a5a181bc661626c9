"""The GPU benchmark scripts' CPU paths: bench/bench_inference.py generates the same tokens with
zspeed's offloaded weights as the plain model (fp32 on the CPU: equal token for token), builds
its model without initializers but with real buffers, and says why it stops (exit 2, 3);
bench/bench_engine.py's activation checkpointing options (--ckpt-impl, --cpu-ckpt) train to the
same losses and gradient norms as the uncheckpointed engine, and its out-of-memory guard prints
one line and exits with code 3."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the benchmarks need torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
TINY = ["--device", "cpu", "--layers", "2", "--d-model", "64", "--heads", "4", "--ffn", "96", "--vocab", "211",
        "--prompt-len", "7", "--new-tokens", "5", "--warmup-tokens", "1", "--runs", "1", "--dtype", "fp32",
        "--persistence", "0"]


def _needs_transformers():
    pytest.importorskip("transformers", reason="bench_inference.py builds a transformers Llama model")


def _inference(*args, env=None, timeout=300):
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT", "ZSPEED_DEVICE")}
    full.update(env or {})
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_inference.py"), *args], cwd=ROOT, env=full,
                       capture_output=True, text=True, timeout=timeout)
    results = [json.loads(line[len("RESULT "):]) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    return r, (results[0] if results else None)


@pytest.fixture(scope="module")
def plain_tokens():
    _needs_transformers()
    r, res = _inference("--impl", "torch", *TINY)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return res


def test_inference_torch_anchor_reports_a_full_result(plain_tokens):
    res = plain_tokens
    assert res["impl"] == "torch" and res["offload_param"] == "none"
    assert res["params"] == 2 * (4 * 64 * 64 + 3 * 64 * 96 + 2 * 64) + 2 * 211 * 64 + 64
    assert len(res["first_tokens"]) == 5 and all(0 <= t < 211 for t in res["first_tokens"])
    assert res["runs"] == 1 and res["tokens_per_s"] > 0 and res["prefill_s"] > 0 and res["build_s"] >= 0
    assert res["host_peak_rss_gib"] > 0 and res["peak_alloc_gib"] is None  # no GPU: no GPU memory figures


def test_inference_zspeed_offloaded_generates_the_plain_models_tokens(plain_tokens):
    r, res = _inference("--impl", "zspeed", "--offload-param", "cpu", *TINY)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    n = res["released_params"].split("/")
    assert n[0] == n[1] and int(n[0]) == 2 * 9 + 3  # every weight partitioned away between forwards
    assert res["first_tokens"] == plain_tokens["first_tokens"]
    assert res["tokens_sha1"] == plain_tokens["tokens_sha1"]


def test_inference_zspeed_nvme_runs_or_is_refused_by_name(plain_tokens, tmp_path):
    r, res = _inference("--impl", "zspeed", "--offload-param", "nvme", "--nvme-path", str(tmp_path), *TINY)
    if r.returncode == 2:  # the library without NVMe parameter offload
        assert "zspeed refuses offload_param nvme:" in r.stdout and res is None, r.stdout + r.stderr[-2000:]
    else:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        assert res["tokens_sha1"] == plain_tokens["tokens_sha1"]
    assert os.listdir(tmp_path) == []  # the run's own subfolder is gone


def test_inference_deepspeed_cpu_generates_the_plain_models_tokens(plain_tokens):
    """DeepSpeed's ZeRO-Inference path on its CPU accelerator (where DeepSpeed is installed)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (the benchmark's other side)")
    r, res = _inference("--impl", "deepspeed", "--offload-param", "cpu", *TINY, env={"DS_ACCELERATOR": "cpu"},
                        timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert res["ds_param_manager"] == "DeepSpeedZeRoOffload"
    assert res["tokens_sha1"] == plain_tokens["tokens_sha1"]


def test_inference_without_a_gpu_says_so_and_exits_2():
    _needs_transformers()
    r, res = _inference("--impl", "zspeed", *TINY[2:])  # --device cuda (the default)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert r.returncode == 2 and res is None
    assert r.stdout.strip() == "no CUDA device: run with --device cpu for a smoke run"


def test_inference_model_is_built_without_initializers_but_with_real_buffers():
    _needs_transformers()
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    import bench_inference as bi
    from transformers import LlamaConfig, LlamaForCausalLM
    a = bi.parse_args(["--layers", "2", "--d-model", "48", "--heads", "3", "--ffn", "80", "--vocab", "97"])
    m1, m2 = bi.build_llama(a, torch.bfloat16), bi.build_llama(a, torch.bfloat16)
    a.seed = 1
    m3 = bi.build_llama(a, torch.bfloat16)
    p1, p3 = dict(m1.named_parameters()), dict(m3.named_parameters())
    assert all(p.device.type == "cpu" and p.dtype == torch.bfloat16 for p in p1.values())
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))  # same seed, same weights
    assert not torch.equal(p1["model.layers.0.self_attn.q_proj.weight"], p3["model.layers.0.self_attn.q_proj.weight"])
    w = p1["model.layers.1.mlp.down_proj.weight"].float()
    assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002
    assert torch.equal(p1["model.norm.weight"], torch.ones(48, dtype=torch.bfloat16))
    ref = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                       num_attention_heads=3, num_key_value_heads=3,
                                       max_position_embeddings=m1.config.max_position_embeddings))
    bufs = dict(m1.named_buffers())
    assert bufs and all(torch.equal(bufs[k], b) for k, b in ref.named_buffers())  # rotary frequencies, computed


# -- bench_engine.py: activation checkpointing options ------------------------------------------------
def _engine_module():
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    import bench_engine
    return bench_engine


def _args(**kw):
    d = dict(impl="zspeed", batch=2, stage=3, offload_param="cpu", no_pin=False, dtype="bf16", offload="cpu",
             torch_adam=False, state_dtype="fp32", ckpt=False, ckpt_impl="torch", cpu_ckpt=False, model="gpt")
    d.update(kw)
    return argparse.Namespace(**d)


@pytest.mark.parametrize("kw,match", [
    (dict(cpu_ckpt=True), "--cpu-ckpt needs --ckpt-impl zspeed or deepspeed"),
    (dict(ckpt_impl="deepspeed"), "--ckpt-impl deepspeed runs with --impl deepspeed only"),
    (dict(impl="deepspeed", ckpt_impl="zspeed"), "--ckpt-impl zspeed runs with --impl zspeed or torch"),
    (dict(model="llama", ckpt_impl="zspeed"), "--model llama checkpoints through transformers"),
    (dict(model="llama", ckpt_impl="zspeed", cpu_ckpt=True), "--model llama"),
    (dict(zenflow=True), "--zenflow is DeepSpeed's ZenFlow"),
    (dict(impl="deepspeed", zenflow=True), "--zenflow is DeepSpeed's ZenFlow"),  # stage 3
])
def test_engine_refuses_checkpointing_combinations_that_cannot_run(kw, match):
    assert _engine_module().checkpoint_args(_args(**kw)).startswith(match)


@pytest.mark.parametrize("kw", [dict(ckpt_impl="zspeed"), dict(ckpt_impl="zspeed", cpu_ckpt=True),
                                dict(impl="deepspeed", ckpt_impl="deepspeed", cpu_ckpt=True),
                                dict(impl="torch", ckpt_impl="zspeed", cpu_ckpt=True)])
def test_engine_checkpointing_options_imply_ckpt_and_fill_the_config_section(kw):
    be = _engine_module()
    a = _args(**kw)
    assert be.checkpoint_args(a) is None and a.ckpt
    section = be.ds_config(a)["activation_checkpointing"]
    assert section == {"partition_activations": False, "cpu_checkpointing": a.cpu_ckpt,
                       "contiguous_memory_optimization": False}
    plain = _args(ckpt=True)
    assert be.checkpoint_args(plain) is None and "activation_checkpointing" not in be.ds_config(plain)


def test_engine_three_tier_rows_configure_nvme_with_max_in_cpu_and_the_busy_share_unions_spans(tmp_path):
    be = _engine_module()
    from zspeed.runtime.config import parse_config
    a = _args(offload="nvme", nvme_path=str(tmp_path), max_in_cpu=2.7e3, ratio="0.8")
    off = be.ds_config(a)["zero_optimization"]["offload_optimizer"]
    assert off == {"device": "nvme", "pin_memory": True, "nvme_path": str(tmp_path), "max_in_cpu": 2700, "ratio": 0.8}
    parse_config(be.ds_config(a), world_size=1)  # a config zspeed takes
    ds = be.ds_config(_args(impl="deepspeed", offload="nvme", nvme_path=str(tmp_path), max_in_cpu=2.7e3))
    assert "max_in_cpu" not in ds["zero_optimization"]["offload_optimizer"]  # zspeed's extension only
    assert be._union([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4


def test_engine_zenflow_config_is_the_issue_s():
    be = _engine_module()
    a = _args(impl="deepspeed", stage=2, offload_param="none", zenflow=True)
    assert be.checkpoint_args(a) is None
    zo = be.ds_config(a)["zero_optimization"]
    assert zo["zenflow"] == {"topk_ratio": 0.05, "update_interval": 4, "overlap_step": True}
    assert zo["offload_optimizer"]["device"] == "cpu"
    assert "zenflow" not in be.ds_config(_args(impl="deepspeed", stage=2))["zero_optimization"]


def _train(be, a, wrap: bool, steps=2):
    """Steps of the zspeed engine with bench_engine's config on a small GPT (dropout on, so that the
    recomputation must restore the random state), blocks checkpointed as bench_engine does."""
    import zspeed
    from zspeed import checkpointing
    from gpt import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=61, max_len=16, d_model=32, n_layer=3, n_head=4, dropout=0.1))
    if wrap:
        assert be.checkpoint_args(a) is None
        be.checkpoint_blocks(model.blocks, be.checkpoint_function(a.ckpt_impl))
    cfg = be.ds_config(a)
    checkpointing.reset()
    engine, *_ = zspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    be.configure_checkpointing(a, cfg)
    if wrap:
        assert checkpointing.is_configured() and checkpointing._setting("cpu_checkpointing") == a.cpu_ckpt
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(steps):
        x, y = (torch.randint(0, 61, (2, 16), generator=g) for _ in range(2))
        torch.manual_seed(100 + i)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        out.append((loss.item(), engine.get_global_grad_norm()))
    checkpointing.reset()
    return out


@pytest.mark.parametrize("stage,offload_param", [(3, "cpu"), (2, "none")])
@pytest.mark.parametrize("cpu_ckpt", [False, True])
def test_engine_zspeed_checkpointed_blocks_train_like_the_plain_engine(monkeypatch, stage, offload_param, cpu_ckpt):
    be = _engine_module()
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")
    plain = _train(be, _args(stage=stage, offload_param=offload_param), wrap=False)
    ckpt = _train(be, _args(stage=stage, offload_param=offload_param, ckpt_impl="zspeed", cpu_ckpt=cpu_ckpt),
                  wrap=True)
    assert ckpt == plain  # same losses and gradient norms, step for step (bit for bit on the CPU)


def test_engine_torch_reference_with_zspeed_checkpointing_matches_plain_gradients():
    be = _engine_module()
    from gpt import GPT, GPTConfig
    grads = []
    for wrap in (False, True):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=61, max_len=16, d_model=32, n_layer=3, n_head=4, dropout=0.1))
        if wrap:
            a = _args(impl="torch", ckpt_impl="zspeed")
            assert be.checkpoint_args(a) is None
            be.checkpoint_blocks(model.blocks, be.checkpoint_function(a.ckpt_impl))
        ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(2))
        torch.manual_seed(7)
        model(ids, ids).backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.equal(g0, g1) for g0, g1 in zip(*grads))


@pytest.mark.parametrize("exc", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                 RuntimeError("CUDA error: out of memory")])
def test_engine_out_of_memory_prints_one_line_and_exits_3(capsys, exc):
    be = _engine_module()
    with pytest.raises(SystemExit) as e:
        with be.exit_on_oom("OOM at seq 4096"):
            raise exc
    assert e.value.code == 3
    out, err = capsys.readouterr()
    assert out == "OOM at seq 4096\n" and "out of memory" in err


@pytest.mark.parametrize("exc", [RuntimeError("shape mismatch"), ValueError("out of memory")])
def test_engine_other_errors_pass_through_the_oom_guard(exc):
    be = _engine_module()
    with pytest.raises(type(exc)):
        with be.exit_on_oom("OOM at seq 1"):
            raise exc


def test_scaling_table_reads_the_logs_and_computes_efficiency(tmp_path):
    def log(impl, n, tps, step):
        res = {"tokens_per_s": tps, "step_s": step, "peak_alloc_gib": 1.5, "host_rss_gib_per_rank": [10.0] * n}
        (tmp_path / f"scaling_z2-3.7b_{impl}_{n}gpu.log").write_text(f"noise\nRESULT {json.dumps(res)}\n")
    log("zspeed", 1, 1000.0, 8.0)
    log("zspeed", 2, 1800.0, 8.9)
    log("deepspeed", 1, 500.0, 16.0)
    log("deepspeed", 2, 1000.0, 16.0)
    (tmp_path / "scaling_z2-3.7b_zspeed_4gpu.log").write_text("Traceback: out of memory\n")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, os.path.join(here, "..", "..", "bench", "scaling_table.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    z2 = next(ln for ln in lines if ln.startswith("| zspeed | 2 |"))
    assert "| 900 |" in z2 and "90% (vs 1 GPU)" in z2 and "1.80x" in z2
    assert any(ln.startswith("| zspeed | 4 | failed") for ln in lines)
    assert any(ln.startswith("| deepspeed | 2 |") and "100% (vs 1 GPU)" in ln for ln in lines)


def test_engine_save_load_times_a_checkpoint_and_removes_it(tmp_path):
    """--save-load: the trained engine's checkpoint saved and loaded back, each with its time and
    resident-memory peaks; the weights are unchanged by the round trip, and the tag is removed."""
    import zspeed
    be = _engine_module()
    from gpt import GPT, GPTConfig
    a = _args(offload="nvme", nvme_path=str(tmp_path / "swap"), max_in_cpu=None, ratio=None, save_load=str(tmp_path))
    (tmp_path / "swap").mkdir()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=61, max_len=16, d_model=32, n_layer=2, n_head=4))
    engine, *_ = zspeed.initialize(model=model, model_parameters=model.parameters(), config=be.ds_config(a))
    x = torch.randint(0, 61, (2, 16))
    engine.backward(engine(x, x))
    engine.step()
    before = {k: v.clone() for k, v in engine._zero3_consolidated_16bit_state_dict().items()}
    out = be._save_load(a, engine)
    assert set(out) == {"save", "load", "bytes"} and out["bytes"] > 0
    for what in ("save", "load"):
        o = out[what]
        assert o["s"] >= 0 and o["anon_peak_gib"] >= o["anon_before_gib"] > 0
    assert not (tmp_path / "bench_save_load").exists()
    after = engine._zero3_consolidated_16bit_state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    engine.close()


def test_plan_check_times_each_case_in_the_same_run(monkeypatch):
    """bench/plan_check.py measures the step it compares with in the same run (issue 57: it
    compared with numbers measured on another card): each case runs bench_engine.py at the
    planner's shape and cap, and its RESULT line is what the prediction is divided by."""
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    import plan_check
    ran = []

    def fake_run(cmd, **kw):
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout='x\nRESULT {"step_s": 1.25, "fwd_bwd_s": 0.5, '
                                                          '"peak_reserved_gib": 20.0}\n', stderr="")
    monkeypatch.setattr(plan_check.subprocess, "run", fake_run)
    got = plan_check.measure("z3-auto", 4)
    assert got["step_s"] == 1.25 and got["fwd_bwd_s"] == 0.5
    cmd = " ".join(ran[0])
    for part in ("bench_engine.py", "--gpu-cap 24", "--batch 8", "--layers 16", "--d-model 4096", "--ckpt",
                 "--stage 3", "--offload-param cpu", "--ratio auto", "--overlap-forward", "--steps 4"):
        assert part in cmd, (part, cmd)
    monkeypatch.setattr(plan_check.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, stdout="", stderr="CUDA out of memory"))
    with pytest.raises(RuntimeError, match="z2-auto: bench_engine failed .*out of memory"):
        plan_check.measure("z2-auto", 4)


# -- bench_step_runs.py: per-parameter kernel calls against runs ---------------------------------------
def test_bench_step_runs_compares_both_cases_and_checks_their_weights():
    """bench/bench_step_runs.py runs both cases on a tiny GPT's parameter list and reports them
    with the bit-for-bit check (exit code 0 only when the weights agree)."""
    env = {k: v for k, v in os.environ.items()}
    env.setdefault("ZSPEED_LIBRARY", os.path.join(ROOT, "build", "libzspeed.so"))
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_step_runs.py"), "--d-model", "16",
                        "--layers", "2", "--vocab", "50", "--threads", "1", "--steps", "2"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "27 parameters" in r.stdout and "per parameter" in r.stdout
    assert "same weights bit for bit: True" in r.stdout
