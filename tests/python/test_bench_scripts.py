"""The GPU benchmark scripts' CPU paths: bench/bench_engine.py's activation checkpointing
options (--ckpt-impl, --cpu-ckpt) train to the same losses and gradient norms as the
uncheckpointed engine, and its out-of-memory guard prints one line and exits with code 3."""
from __future__ import annotations

import argparse
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="the benchmarks need torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")


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
