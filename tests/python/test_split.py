"""offload_optimizer.ratio < 1: the optimizer split between the device and the CPU (runtime/split.py).

The device's share steps with torch's AdamW, the CPU's with zspeed's kernel; both are AdamW
in fp32, so a split run equals the all-CPU run to fp32 rounding (tolerance 1e-5 relative,
1e-6 absolute after a few steps: the two kernels order their operations differently).
On the CPU-only test machine the "device" is the CPU; tests/gpu runs the same on CUDA."""
from __future__ import annotations

import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError  # noqa: E402
from zspeed.runtime.split import choose_ratio  # noqa: E402

DATA = eh.regression_data(6)


def _cfg(ratio=1.0, precision="fp32", gas=1, **extra):
    c = eh.config(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": ratio}},
                  gradient_clipping=0.3, gradient_accumulation_steps=gas,
                  scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-2,
                                                           "warmup_num_steps": 4}}, **extra)
    c["train_micro_batch_size_per_gpu"] = 6
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    elif precision == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return c


def _run(cfg, steps=6, model=None):
    e, *_ = zspeed.initialize(model=model or eh.mlp(), config=cfg)
    eh.train(e, DATA, steps * cfg["gradient_accumulation_steps"])
    return e


def _weights(e):
    return [p.detach().float().clone() for p in e.module.parameters()]


def _close(a, b, precision):
    tol = dict(rtol=1e-5, atol=1e-6) if precision == "fp32" else dict(rtol=2e-2, atol=2e-2)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, **tol)


@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.9])
@pytest.mark.parametrize("precision,gas", [("fp32", 1), ("bf16", 2), ("fp16", 1)])
def test_a_split_step_equals_the_cpu_step(ratio, precision, gas):
    ref = _run(_cfg(1.0, precision, gas))
    e = _run(_cfg(ratio, precision, gas))
    path = e.optimizer_path
    total = sum(p.numel() for p in e.module.parameters())
    biggest = max(p.numel() for p in e.module.parameters())
    assert type(path).__name__ == "StoreSplitPath" and abs(path.gpu_elems - (1 - ratio) * total) <= biggest / 2
    _close(_weights(e), _weights(ref), precision)
    assert e.get_lr() == ref.get_lr()  # the schedule reached both halves
    if precision == "fp16":
        assert e.loss_scale == ref.loss_scale


def test_the_gpu_share_is_the_first_parameters():
    e = _run(_cfg(0.5), steps=1)
    sides = [s for s, _ in e.optimizer_path._sides()]
    assert sides == sorted(sides, key=lambda s: s != "dev") and "dev" in sides and "cpu" in sides


def test_checkpoints_move_between_split_and_cpu_engines(tmp_path):
    a = _run(_cfg(0.4), steps=3)
    a.save_checkpoint(str(tmp_path), tag="s")
    ref = _run(_cfg(1.0), steps=3)
    ref.save_checkpoint(str(tmp_path), tag="c")
    for tag, ratio in (("s", 1.0), ("c", 0.4), ("s", 0.7)):
        e = _run(_cfg(ratio), steps=1)
        e.load_checkpoint(str(tmp_path), tag=tag)
        eh.train(e, DATA, 3, start=3)
        want = _run(_cfg(1.0), steps=6)
        _close(_weights(e), _weights(want), "fp32")


def _on_cuda() -> bool:
    return os.environ.get("ZSPEED_DEVICE", "").startswith("cuda") or (
        torch.cuda.is_available() and os.environ.get("ZSPEED_DEVICE") != "cpu")


def test_auto_without_a_gpu_runs_the_ordinary_cpu_path(caplog):
    if _on_cuda():
        pytest.skip("the engine runs on CUDA here: test_auto_on_a_gpu_splits covers it")
    with caplog.at_level("WARNING", logger="zspeed"):
        e = _run(_cfg("auto"), steps=1)
    assert type(e.optimizer_path).__name__ == "HostPath"
    assert any('ratio "auto" -> 1.000' in r.getMessage() and "no GPU" in r.getMessage() for r in caplog.records)


def test_auto_on_a_gpu_splits(caplog):
    if not _on_cuda():
        pytest.skip("needs the engine on CUDA (tests/gpu/check_zero3_cuda.py runs it there)")
    with caplog.at_level("WARNING", logger="zspeed"):
        e = _run(_cfg("auto"), steps=2)
    msg = [r.getMessage() for r in caplog.records if 'ratio "auto" ->' in r.getMessage()]
    assert msg and "after step 1" in msg[0] and "GPU limit" in msg[0] and "peak of step 1" in msg[0]
    # A tiny model fits the GPU many times over: the measured rates choose a share below 1.
    assert type(e.optimizer_path).__name__ == "StoreSplitPath" and e.optimizer_path.cpu_share < 1
    _close(_weights(e), _weights(_run(_cfg(1.0), steps=2)), "fp32")


def _fake_gpu(monkeypatch, limit, peak):
    """Makes "auto" see a device with memory accounting: ``limit`` bytes usable, ``peak`` used."""
    from zspeed.runtime import split
    monkeypatch.setattr(split, "device_memory", lambda device: (limit, peak))
    monkeypatch.setattr(split, "measure_rates", lambda *a, **k: (None, None))


@pytest.mark.parametrize("precision,gas", [("fp32", 1), ("bf16", 2), ("fp16", 1)])
def test_auto_sizes_the_split_from_the_first_steps_peak(monkeypatch, caplog, precision, gas):
    """Step 1 runs with everything on the CPU; then the GPU's share is what fits in the limit
    less the peak and the margin, every master and state moves to its half, and training goes
    on as the all-CPU run does (to the split's tolerance)."""
    from zspeed.runtime import split
    total = sum(p.numel() for p in eh.mlp().parameters())
    limit = 10 << 30
    margin = max(split.MARGIN_MIN, int(split.MARGIN_FRACTION * limit))
    budget = split.GPU_BYTES_PER_ELEM * total // 2   # room for half of the model's GPU state
    _fake_gpu(monkeypatch, limit=limit, peak=limit - margin - budget)
    with caplog.at_level("WARNING", logger="zspeed"):
        e, *_ = zspeed.initialize(model=eh.mlp(), config=_cfg("auto", precision, gas))
        path = e.optimizer_path
        assert type(path).__name__ == "StoreSplitPath" and path.cpu_share == 1.0 and path.dev is None
        eh.train(e, DATA, gas)  # step 1: sizes the split
    want = split.choose_ratio(total, budget, None, None)
    assert want == pytest.approx(0.5)
    assert path.dev is not None and abs(path.cpu_share - want) < 0.35  # whole parameters: as near as they allow
    msg = [r.getMessage() for r in caplog.records if "after step 1" in r.getMessage()]
    assert msg and "-> 0.500" in msg[0] and "peak of step 1" in msg[0]
    eh.train(e, DATA, 5 * gas, start=gas)
    _close(_weights(e), _weights(_run(_cfg(1.0, precision, gas))), precision)
    # No room at all: the split stays at 1 (the first step's layout), nothing moves.
    _fake_gpu(monkeypatch, limit=1 << 30, peak=1 << 30)
    e = _run(_cfg("auto", precision, gas), steps=2)
    assert e.optimizer_path.cpu_share == 1.0 and e.optimizer_path.dev is None


def test_auto_with_overlap_forward_rehooks_the_new_cpu_half(monkeypatch):
    """With overlap_forward the CPU half's step runs during the next forward, behind module
    hooks: the resize after step 1 removes the old half's hooks and hooks the new one."""
    from zspeed.runtime import split
    total = sum(p.numel() for p in eh.mlp().parameters())
    limit = 10 << 30
    margin = max(split.MARGIN_MIN, int(split.MARGIN_FRACTION * limit))
    _fake_gpu(monkeypatch, limit=limit, peak=limit - margin - split.GPU_BYTES_PER_ELEM * total // 2)
    cfg = _cfg("auto")
    cfg["zero_optimization"]["offload_optimizer"]["overlap_forward"] = True
    e = _run(cfg)
    path = e.optimizer_path
    assert path.dev is not None and path.cpu is not None
    hooked = [h for _, hs in path._hooked for h in hs]
    assert hooked, "the new CPU half's forward hooks"
    ref = _cfg(1.0)
    ref["zero_optimization"]["offload_optimizer"]["overlap_forward"] = True
    # state_dict() waits for the step running in the background (the last one's CPU half).
    _close(list(e.module.state_dict().values()), list(_run(ref).module.state_dict().values()), "fp32")
    e.close()


def test_a_resized_split_keeps_every_state_and_checkpoints(tmp_path):
    """resize() moves masters and states between the halves (8-bit states dequantized for the
    GPU's fp32 share): a run resized after step 2 ends where the run at the final ratio from
    step 3 on would (its checkpoint, saved after step 2 at the first ratio, loaded there)."""
    if not eh.native_ops_available():
        pytest.skip("8-bit Adam states need libzspeed (the native CPU kernels)")
    a = _run(_sd(0.9, "int8"), steps=2)
    a.save_checkpoint(str(tmp_path), tag="two")
    a.optimizer_path.resize(0.4)
    assert a.optimizer_path.dev is not None and a.optimizer_path.cpu_share < 0.9
    eh.train(a, DATA, 3, start=2)
    b = _run(_sd(0.4, "int8"), steps=1)
    b.load_checkpoint(str(tmp_path), tag="two")
    eh.train(b, DATA, 3, start=2)
    assert eh.same_weights(a, b)
    a.save_checkpoint(str(tmp_path), tag="five")
    c = _run(_sd(1.0, "int8"), steps=1)
    c.load_checkpoint(str(tmp_path), tag="five")
    eh.train(c, DATA, 1, start=5)
    assert all(torch.isfinite(p).all() for p in c.module.parameters())


def _sd(ratio, state_dtype, **kw):
    c = _cfg(ratio, **kw)
    c["optimizer"]["params"]["state_dtype"] = state_dtype
    return c


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_the_cpu_half_keeps_the_configured_state_dtype(state_dtype):
    """The GPU's share keeps fp32 states (torch's AdamW); the CPU's share the configured ones.
    After one step each half equals the all-CPU run with that half's state dtype (the same
    gradients, norm and update; to fp32 rounding: the halves' norms are summed in another
    order, and the GPU's AdamW orders its operations differently)."""
    if not eh.native_ops_available():
        pytest.skip("8-bit and bf16 Adam states need libzspeed (the native CPU kernels)")
    e = _run(_sd(0.5, state_dtype), steps=1)
    same_sd = _run(_sd(1.0, state_dtype), steps=1)
    fp32 = _run(_cfg(1.0), steps=1)
    want = torch.int8 if state_dtype == "int8" else torch.bfloat16
    cpu_states = list(e.optimizer_path.cpu.optimizer.state.values())
    assert cpu_states and all(st["exp_avg"].dtype == want for st in cpu_states)
    sides = [s for s, _ in e.optimizer_path._sides()]
    for side, p, q, r in zip(sides, e.module.parameters(), same_sd.module.parameters(), fp32.module.parameters()):
        torch.testing.assert_close(p.detach(), (q if side == "cpu" else r).detach(), rtol=1e-5, atol=1e-6)
    assert "dev" in sides and "cpu" in sides


def test_checkpoints_of_a_split_with_8bit_states(tmp_path):
    """Saved with 8-bit states on the CPU's share and fp32 on the GPU's: resumes bit for bit, and
    loads into ratio 1 (8-bit or fp32 states) and into an fp32 split, each state converted to
    what the loading side keeps."""
    if not eh.native_ops_available():
        pytest.skip("8-bit Adam states need libzspeed (the native CPU kernels)")
    a = _run(_sd(0.4, "int8"), steps=3)
    a.save_checkpoint(str(tmp_path), tag="s")
    b = _run(_sd(0.4, "int8"), steps=1)
    b.load_checkpoint(str(tmp_path), tag="s")
    eh.train(b, DATA, 3, start=3)
    whole = _run(_sd(0.4, "int8"), steps=6)
    assert eh.same_weights(b, whole)
    for cfg, want in ((_sd(1.0, "int8"), {torch.int8}), (_cfg(1.0), {torch.float32}),
                      (_cfg(0.7), {torch.float32})):
        e = _run(cfg, steps=1)
        e.load_checkpoint(str(tmp_path), tag="s")
        opt = e.optimizer_path.cpu.optimizer if type(e.optimizer_path).__name__ == "StoreSplitPath" else e.optimizer
        assert {st["exp_avg"].dtype for st in opt.state.values()} == want
        eh.train(e, DATA, 2, start=3)
        assert all(torch.isfinite(p).all() for p in e.module.parameters())
    # And back: a ratio-1 8-bit checkpoint into a split, whose GPU share dequantizes its states.
    _run(_sd(1.0, "int8"), steps=3).save_checkpoint(str(tmp_path), tag="c")
    e = _run(_sd(0.4, "int8"), steps=1)
    e.load_checkpoint(str(tmp_path), tag="c")
    assert {st["exp_avg"].dtype for st in e.optimizer_path.dev.optimizer.state.values()} == {torch.float32}
    assert {st["exp_avg"].dtype for st in e.optimizer_path.cpu.optimizer.state.values()} == {torch.int8}
    eh.train(e, DATA, 2, start=3)
    assert all(torch.isfinite(p).all() for p in e.module.parameters())


def test_choose_ratio():
    n = 1_000_000
    assert choose_ratio(n, None, 1e-9, 1e-11) == 1.0
    # Room for everything: the rates decide (the GPU 100x faster: 1% on the CPU).
    assert choose_ratio(n, 10 * 16 * n, 1e-9, 1e-11) == pytest.approx(1e-11 / (1e-9 + 1e-11))
    # A budget of a quarter of the model's GPU state: 75% stays on the CPU.
    assert choose_ratio(n, 16 * n // 4, 1e-9, 1e-11) == pytest.approx(0.75)
    assert choose_ratio(n, 0, 1e-9, 1e-11) == 1.0


@pytest.mark.parametrize("cfg,match", [
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": -0.1}}}, "from 0 to 1"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}}, "from 0 to 1"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": "half"}}}, "from 0 to 1"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp",
                                                              "max_in_cpu": 1.5}}}, "whole number of elements"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "max_in_cpu": 2.5}}},
     "whole number of elements"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none", "ratio": 0.5}}}, "device \"cpu\""),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5,
                                                              "delayed_update": True}}}, "cannot be combined"),
])
def test_config_errors(cfg, match):
    with pytest.raises(ConfigError, match=match):
        zspeed.initialize(model=eh.mlp(), config=eh.config(**cfg))


def test_engine_errors_name_the_fix():
    c = _cfg(0.5)
    c["optimizer"] = {"type": "Lion", "params": {"lr": 1e-3}}
    with pytest.raises(ConfigError, match="Adam or AdamW"):
        zspeed.initialize(model=eh.mlp(), config=c)
    m = eh.mlp()
    c = _cfg(0.5)
    del c["optimizer"]
    with pytest.raises(ConfigError, match="not from another optimizer object.*pass a DeepSpeedCPUAdam"):
        zspeed.initialize(model=m, optimizer=torch.optim.AdamW(m.parameters()), config=c)
    from zspeed.ops.lion import DeepSpeedCPULion
    with pytest.raises(ConfigError, match="Adam or AdamW"):
        zspeed.initialize(model=m, optimizer=DeepSpeedCPULion(m.parameters()), config=c)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_split_takes_a_deepspeed_cpu_adam_passed_to_initialize(stage):
    """DeepSpeed's SuperOffload examples pass a DeepSpeedCPUAdam with offload_optimizer.ratio: both
    halves take its settings, so the run equals the one built from the config's AdamW section
    (same lr, betas, eps, weight decay) bit for bit, and a scheduler built on the client (here lr
    0 after the first two steps) reaches both halves."""
    from zspeed.ops.adam import DeepSpeedCPUAdam

    def run(client: bool):
        c = _cfg(0.5)
        c["zero_optimization"]["stage"] = stage
        del c["scheduler"]
        m = eh.mlp()
        if client:
            del c["optimizer"]
            opt = DeepSpeedCPUAdam(m.parameters(), lr=2e-2, weight_decay=0.01)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s < 2 else 0.0)
            e, *_ = zspeed.initialize(model=m, optimizer=opt, lr_scheduler=sched, config=c)
        else:
            c["scheduler"] = {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 2e-2,
                                                               "lr_range_test_step_size": 10**9}}
            e, *_ = zspeed.initialize(model=m, config=c)
        eh.train(e, DATA, 2)
        return e
    a, b = run(False), run(True)
    assert "Split" in type(b.optimizer_path).__name__
    for x, y in zip(_weights(a), _weights(b)):
        assert torch.equal(x, y)
    before = _weights(b)
    eh.train(b, DATA, 3, start=2)  # lr 0 from the client's scheduler: nothing moves on either side
    for x, y in zip(before, _weights(b)):
        assert torch.equal(x, y)


def test_auto_keeps_the_split_when_the_move_would_not_fit_in_host_memory(monkeypatch, caplog):
    """The resize holds the new CPU half beside the old one for a moment: with too little host
    memory for that, "auto" keeps step 1's layout (everything on the CPU) and says why."""
    from zspeed.runtime import memory, split
    total = sum(p.numel() for p in eh.mlp().parameters())
    limit = 10 << 30
    margin = max(split.MARGIN_MIN, int(split.MARGIN_FRACTION * limit))
    _fake_gpu(monkeypatch, limit=limit, peak=limit - margin - split.GPU_BYTES_PER_ELEM * total // 2)
    e, *_ = zspeed.initialize(model=eh.mlp(), config=_cfg("auto"))
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 100)  # after the start-up check
    with caplog.at_level("WARNING", logger="zspeed"):
        eh.train(e, DATA, 2)
    assert e.optimizer_path.cpu_share == 1.0 and e.optimizer_path.dev is None
    assert any("the split stays at 1.000" in r.getMessage() and "of host memory" in r.getMessage()
               and 'set "ratio": 0.5' in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    _close(_weights(e), _weights(_run(_cfg(1.0), steps=2)), "fp32")


def test_auto_counts_the_allocators_reserved_peak_and_asks_for_expandable_segments(monkeypatch):
    """"auto" sizes the GPU share from step 1's peak of *reserved* memory (allocated plus the
    allocator's fragmentation, which the next steps need again: issue 57, a 6.58B run went out
    of memory with 3.23 GiB reserved but unallocated), and asks torch's allocator for
    expandable segments unless PYTORCH_CUDA_ALLOC_CONF says otherwise."""
    from zspeed.runtime import memory, split
    monkeypatch.setattr(memory, "gpu_room", lambda device: 24 << 30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 5 << 30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 7 << 30)
    assert split.device_memory(torch.device("cuda", 0)) == (24 << 30, 7 << 30)
    asked = []
    monkeypatch.setattr(split, "_allocator_setter", lambda: (lambda s: asked.append(s)))
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    assert split._expandable_segments() and asked == ["expandable_segments:True"]
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert not split._expandable_segments() and len(asked) == 1  # the user's choice stands


@pytest.mark.parametrize("stage", [2, 3])
def test_ratio_0_puts_every_parameter_on_the_gpu_side_and_trains_as_without_offload(stage):
    """DeepSpeed's ratio field takes 0 to 1 (issue 52 #19): 0 is a CPU share of nothing, every
    parameter stepped by the device's optimizer, which trains as offload_optimizer none does."""
    import test_zero3 as z3
    c = z3._cfg(stage, opt="cpu", param="cpu" if stage == 3 else "none")
    c["zero_optimization"]["offload_optimizer"]["ratio"] = 0
    e, losses = z3._train(c, steps=3)
    assert e.optimizer_path.cpu_share == 0.0
    ref, ref_losses = z3._train(z3._cfg(stage, opt="none"), steps=3)
    assert losses == pytest.approx(ref_losses, rel=1e-6)
    z3._close(z3._whole(e), z3._whole(ref), "fp32")
