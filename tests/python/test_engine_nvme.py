"""Engine with zero_optimization.offload_optimizer.device = nvme.

The nvme path must train bit for bit like the cpu path (same kernels, same
gradients, same norms), so every comparison here is torch.equal, not a
tolerance: any difference is a bug in the data path, not rounding.
"""
from __future__ import annotations

import gc
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError  # noqa: E402
from zspeed.runtime.nvme import _partitions  # noqa: E402
from engine_helpers import mlp, mse_loss, regression_data, same_weights as _same, train  # noqa: E402


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """CPU-only by design (small CPU models and CPU data; tests/gpu/check_engine_cuda.py runs nvme against cpu bit for bit with CUDA models): ZSPEED_DEVICE=cpu for each test."""
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")

# Targets of unit size (x @ W has variance 37), so that fp16 training at the default loss scale
# overflows only where a test injects it.
DATA = [(x, y / 37 ** 0.5) for x, y in regression_data(16, bs=4, d_in=37, d_out=13, seed=100)]


def _model():
    # Odd sizes: partitions of 700 elements split the 37x61 weight and pack the small tensors.
    return mlp(37, 61, 13, act=torch.nn.ReLU)


def _cfg(device, path, *, opt="AdamW", state_dtype="fp32", precision=None, stage=2, sub=700, sched=True):
    params = {"lr": 1e-2, "weight_decay": 0.01}
    if state_dtype != "fp32":
        params["state_dtype"] = state_dtype
    if opt == "Adagrad":
        params["initial_accumulator_value"] = 0.1
    cfg = {"train_batch_size": 4, "optimizer": {"type": opt, "params": params},
           "gradient_clipping": 0.5,
           "zero_optimization": {"stage": stage, "sub_group_size": sub,
                                 "offload_optimizer": {"device": device, "nvme_path": str(path),
                                                       "buffer_count": 3, "pipeline_read": True}},
           "aio": {"block_size": 65536, "queue_depth": 4}}
    if sched:
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2,
                                                           "warmup_num_steps": 4}}
    if precision:
        cfg[precision] = {"enabled": True}
    return cfg


def _engine(cfg, groups=False):
    m = _model()
    mp = None
    if groups:  # two groups with different weight decay: one swapper per group
        mp = [{"params": [m[0].weight, m[2].weight]}, {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0}]
    e, *_ = zspeed.initialize(model=m, model_parameters=mp, config=cfg)
    return e


def _train(e, steps, start=0, inf_at=()):
    train(e, DATA, steps, start=start, inf_at=inf_at)
    return e


@pytest.mark.parametrize("precision", [None, "bf16", "fp16"])
@pytest.mark.parametrize("opt,state_dtype", [("AdamW", "fp32"), ("AdamW", "bf16"), ("AdamW", "int8"),
                                             ("Adam", "fp32"), ("Adagrad", "fp32"), ("Lion", "fp32")])
def test_nvme_matches_cpu_bit_for_bit(tmp_path, precision, opt, state_dtype):
    a = _train(_engine(_cfg("cpu", tmp_path, opt=opt, state_dtype=state_dtype, precision=precision)), 6)
    b = _train(_engine(_cfg("nvme", tmp_path, opt=opt, state_dtype=state_dtype, precision=precision)), 6)
    assert _same(a, b)
    assert a.get_lr() == b.get_lr() and a.skipped_steps == b.skipped_steps
    assert a.get_global_grad_norm() == b.get_global_grad_norm()
    st = b.nvme_stats()[0]
    assert st["bytes_read"] > 0 and st["bytes_written"] > 0
    # The parameters really moved (a broken step that skips everything would also "match").
    fresh = _model()
    assert not torch.equal(fresh[0].weight.to(b.dtype), b.module[0].weight)
    b.close()


def test_fp16_overflow_skip_groups_and_stages(tmp_path):
    # With one rank the stage does not change the numerics: nvme at stage 1 and 2 vs cpu at stage 2.
    a = _train(_engine(_cfg("cpu", tmp_path, precision="fp16"), groups=True), 7, inf_at=(3,))
    clean = _train(_engine(_cfg("cpu", tmp_path, precision="fp16"), groups=True), 7)
    assert a.skipped_steps == clean.skipped_steps + 1  # the injected overflow was skipped
    for stage in (1, 2):
        b = _train(_engine(_cfg("nvme", tmp_path, precision="fp16", stage=stage), groups=True), 7, inf_at=(3,))
        assert len(b.nvme_stats()) == 2  # two param groups -> two swappers
        assert _same(a, b) and a.skipped_steps == b.skipped_steps and a.loss_scale == b.loss_scale
        b.close()


def test_partitions_cover_params_exactly():
    numels = [2257, 61, 793, 13, 1]
    for cap, per_param in ((700, False), (10**9, False), (1000, True)):
        parts = _partitions(numels, cap, per_param, 256)
        assert all(0 < p.n <= cap for p in parts)
        seen = [0] * len(numels)
        pos = 0
        for p in parts:
            assert p.start == pos
            for pi, off, at, n in p.pieces:
                assert off == seen[pi]
                seen[pi] += n
                if per_param:
                    assert off % 256 == 0  # int8 blocks start where the per-tensor blocks do
            pos += p.n
        assert seen == numels
        if per_param:
            assert all(p.pieces[0][1] == 0 or len(p.pieces) == 1 for p in parts)
            assert all(len({pi for pi, *_ in p.pieces}) == 1 for p in parts)


@pytest.mark.parametrize("precision,state_dtype", [("bf16", "bf16"), (None, "fp32"), ("bf16", "int8")])
def test_checkpoint_resume_nvme_and_cpu(tmp_path, precision, state_dtype):
    swap = tmp_path / "swap"
    swap.mkdir()

    def cfg(dev):
        return _cfg(dev, swap, precision=precision, state_dtype=state_dtype)

    ref = _train(_engine(cfg("nvme")), 8)
    e = _train(_engine(cfg("nvme")), 4)
    e.save_checkpoint(tmp_path / "ck")
    e.close()
    for dev in ("nvme", "cpu"):
        r = _engine(cfg(dev))
        path, _ = r.load_checkpoint(tmp_path / "ck")
        assert path is not None and r.global_steps == 4
        _train(r, 4, start=4)
        assert _same(ref, r), dev
    # cpu save -> nvme load continues exactly too.
    c = _train(_engine(cfg("cpu")), 4)
    c.save_checkpoint(tmp_path / "ck2")
    n = _engine(cfg("nvme"))
    n.load_checkpoint(tmp_path / "ck2")
    _train(n, 4, start=4)
    assert _same(ref, n)


@pytest.mark.parametrize("opt,state_dtype", [("AdamW", "fp32"), ("AdamW", "int8"), ("Adagrad", "fp32")])
def test_checkpoint_without_optimizer_state_starts_fresh(tmp_path, opt, state_dtype):
    # A checkpoint saved before the first step holds no optimizer state: loading it into an engine
    # that has trained gives fresh states (zeros; Adagrad's initial sum) on both paths alike.
    out = []
    for dev in ("cpu", "nvme"):
        e = _engine(_cfg(dev, tmp_path, opt=opt, state_dtype=state_dtype, sched=False))
        e.save_checkpoint(tmp_path / dev)
        _train(e, 3)
        e.load_checkpoint(tmp_path / dev)
        out.append(_train(e, 2, start=3))
    assert _same(*out)
    out[1].close()


@pytest.mark.parametrize("saved,configured", [("int8", "fp32"), ("fp32", "int8"), ("bf16", "int8"),
                                              ("int8", "bf16"), ("fp32", "bf16")])
def test_checkpoint_state_dtype_is_converted_the_same_way_on_both_paths(tmp_path, saved, configured):
    # A checkpoint's optimizer states are converted to the engine's configured state_dtype; the
    # cpu and nvme paths convert alike, so they continue bit for bit alike.
    e = _train(_engine(_cfg("nvme", tmp_path, state_dtype=saved, precision="bf16")), 2)
    e.save_checkpoint(tmp_path / "ck")
    e.close()
    out = []
    for dev in ("cpu", "nvme"):
        r = _engine(_cfg(dev, tmp_path, state_dtype=configured, precision="bf16"))
        r.load_checkpoint(tmp_path / "ck")
        assert r.optimizer.param_groups[0]["state_dtype"] == configured
        out.append(_train(r, 3, start=2))
    assert _same(*out)
    want = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}[configured]
    assert all(s["exp_avg"].dtype == want for s in out[0].optimizer.state.values())
    # The saved checkpoint re-saved from the nvme engine holds the configured dtype.
    out[1].save_checkpoint(tmp_path / "ck2")
    from safetensors.torch import load_file
    # (an offloaded optimizer's state is saved as the pieces of a one-rank store)
    assert load_file(str(tmp_path / "ck2" / "global_step5" / "optim.rank0.safetensors"))["0.weight@0/exp_avg"].dtype \
        == want
    out[1].close()


def test_refused_optimizer_state_writes_nothing_to_the_swap_file(tmp_path):
    # nvme offload steps every parameter of a group together: a state for only some of them is
    # refused before anything reaches the swap file (masters, states, step count unchanged).
    import json
    from safetensors import safe_open
    from safetensors.torch import load_file, save as st_save
    from checkpoint_helpers import rewrite, same, snapshot
    from zspeed.runtime.checkpoint import CheckpointError
    e = _train(_engine(_cfg("nvme", tmp_path)), 2)
    e.save_checkpoint(tmp_path / "ck", tag="t")
    d = tmp_path / "ck" / "t"
    # Copies (.clone()): the file is mapped, and Windows cannot rewrite a mapped file. The state is
    # saved as the pieces of a one-rank store: "<parameter>@<offset>/<key>", the steps in the metadata.
    name = "optim.rank0.safetensors"
    with safe_open(str(d / name), "pt") as f:
        meta = dict(f.metadata())
    tensors = {k: v.clone() for k, v in load_file(str(d / name)).items() if not k.startswith("2.bias@0/")}
    scalars = json.loads(meta["scalars"])
    scalars.pop("2.bias@0")
    rewrite(d, name, st_save(tensors, metadata={**meta, "scalars": json.dumps(scalars)}))
    r = _train(_engine(_cfg("nvme", tmp_path)), 3)
    before = snapshot(r)
    with pytest.raises(CheckpointError, match="covers only some parameters"):
        r.load_checkpoint(tmp_path / "ck", tag="t")
    assert same(before, snapshot(r)) and [s["steps"] for s in r.nvme_stats()] == [3]
    r.close()
    e.close()


def test_config_reaches_the_swapper_and_masters_are_not_in_ram(tmp_path):
    c = _cfg("nvme", tmp_path)
    c["aio"].update({"intra_op_parallelism": 2, "single_submit": True, "overlap_events": False})
    e = _engine(c)
    assert e.optimizer_path.host_masters is None  # fp32 masters + states live only in the swap file
    sw = e.optimizer_path.swappers[0]
    aio = sw._aio
    assert (aio.block_size, aio.queue_depth, aio.intra_op_parallelism) == (65536, 4, 2)
    assert (aio.single_submit, aio.overlap_events) == (1, 0)
    # sub_group_size 700: the 2257-element weight is split, its bias joins the tail, the 793-element
    # weight starts a new partition (it does not fit) and is split, its bias joins the tail.
    assert sw.sizes == [700, 700, 700, 157 + 61, 700, 93 + 13]
    assert e.zero_optimization_stage() == 2 and not e.zero_cpu_offload()
    e.close()


@pytest.mark.parametrize("site,err", [("swap.write", "ZS_ENOSPC"), ("swap.read", "ZS_EIO")])
def test_io_error_leaves_a_retryable_step(tmp_path, site, err):
    from zspeed import NativeError
    from zspeed._native import errcode, lib
    ref = _train(_engine(_cfg("cpu", tmp_path, precision="fp16")), 5)
    e = _train(_engine(_cfg("nvme", tmp_path, precision="fp16")), 2)
    e.backward(mse_loss(e, DATA[2]))
    before = [p.detach().clone() for p in e.module.parameters()]
    scale, lr = e.loss_scale, e.get_lr()
    lib.zs_fault_set(site.encode(), 2, 1, errcode(err))
    try:
        with pytest.raises(NativeError) as ei:
            e.step()
    finally:
        lib.zs_fault_clear()
    assert ei.value.name == err and "keeps the state of step" in ei.value.detail
    # Nothing moved: weights, counters, loss scale, lr schedule.
    assert all(torch.equal(a, b) for a, b in zip(before, e.module.parameters()))
    assert e.global_steps == 2 and e.loss_scale == scale and e.get_lr() == lr
    e.step()  # the same gradients again: the run continues as if nothing happened
    _train(e, 2, start=3)
    assert _same(ref, e) and ref.loss_scale == e.loss_scale


def test_io_error_in_a_later_group_is_retryable(tmp_path):
    # Two parameter groups, one swapper each: the first group's swapper steps, the second's
    # fails. Calling step() again must step only the second group, not the first one twice.
    from zspeed import NativeError
    from zspeed._native import errcode, lib
    ref = _train(_engine(_cfg("cpu", tmp_path), groups=True), 4)
    e = _train(_engine(_cfg("nvme", tmp_path), groups=True), 2)
    e.backward(mse_loss(e, DATA[2]))
    first = len(e.optimizer_path.swappers[0].sizes)  # its partition writes come first
    lib.zs_fault_set(b"swap.write", first + 1, 1, errcode("ZS_EIO"))
    try:
        with pytest.raises(NativeError):
            e.step()
    finally:
        lib.zs_fault_clear()
    assert [s["steps"] for s in e.nvme_stats()] == [3, 2]
    e.step()
    _train(e, 1, start=3)
    assert _same(ref, e)
    e.close()


def test_files_removed_on_close_and_gc(tmp_path):
    e = _engine(_cfg("nvme", tmp_path))
    assert [f for f in os.listdir(tmp_path) if f.endswith(".swap")]
    e.close()
    e.close()  # idempotent
    assert not os.listdir(tmp_path)
    e = _train(_engine(_cfg("nvme", tmp_path)), 1)
    assert os.listdir(tmp_path)
    del e
    gc.collect()
    assert not os.listdir(tmp_path)


def test_torch_adam_with_nvme_has_no_effect_and_says_so(tmp_path, caplog):
    """DeepSpeed runs torch's optimizer under NVMe offload with torch_adam; zspeed's swapper runs its
    own kernels: the key is accepted with a warning and the run equals one without it exactly."""
    import logging
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    c = _cfg("nvme", tmp_path / "a")
    c["optimizer"]["params"]["torch_adam"] = True
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        a = _engine(c)
    assert any("torch_adam has no effect" in r.getMessage() for r in caplog.records)
    b = _engine(_cfg("nvme", tmp_path / "b"))
    _train(a, 3)
    _train(b, 3)
    for p, q in zip(a.module.parameters(), b.module.parameters()):
        assert torch.equal(p, q)


def test_nvme_config_errors(tmp_path):
    cfg = _cfg("nvme", tmp_path)
    del cfg["zero_optimization"]["offload_optimizer"]["nvme_path"]
    with pytest.raises(ConfigError, match="nvme_path is required"):
        _engine(cfg)
    with pytest.raises(ConfigError, match="not an existing directory"):
        _engine(_cfg("nvme", tmp_path / "missing"))
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not an existing directory"):
        _engine(_cfg("nvme", f))
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(ConfigError, match="not writable"):
                _engine(_cfg("nvme", ro))
        finally:
            ro.chmod(0o700)
    m = _model()
    with pytest.raises(ConfigError, match="client optimizer"):
        c = _cfg("nvme", tmp_path, sched=False)
        del c["optimizer"]
        zspeed.initialize(model=m, optimizer=torch.optim.AdamW(m.parameters()), config=c)
    with pytest.raises(RuntimeError, match="inside"):
        e = _engine(_cfg("nvme", tmp_path))
        e.optimizer.step()


def test_a_disk_too_small_for_a_small_model_says_how_much_in_units_that_show_it(tmp_path, monkeypatch):
    """Issue 52 #22: the message said "needs 0.0 GiB ... has 0.0 GiB free"."""
    import collections
    import shutil
    from zspeed.runtime.config import ConfigError
    from zspeed.runtime.memory import size_text
    assert [size_text(n) for n in (512, 3 << 10, 5 << 20, 3 << 30)] == ["512 bytes", "3.0 KiB", "5.0 MiB", "3.00 GiB"]
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 ** 12, 10 ** 12 - 1000, 1000))
    import engine_helpers as eh
    cfg = eh.config(zero_optimization={"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path)}})
    with pytest.raises(ConfigError) as info:
        zspeed.initialize(model=eh.mlp(), config=cfg)
    text = str(info.value)
    assert "0.0 GiB" not in text and "KiB of free space" in text and "1000 bytes free" in text, text


def test_a_scheduler_built_on_a_client_cpu_adam_reaches_the_nvme_swapper(tmp_path):
    """The NVMe path takes a DeepSpeedCPUAdam's settings, not its object: the client's param_groups
    become the engine's, so its scheduler (lr 0 from step 2 on) changes what the swapper steps with,
    as DeepSpeed steps the client itself."""
    from zspeed.ops.adam import DeepSpeedCPUAdam
    m = _model()
    opt = DeepSpeedCPUAdam(m.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s < 2 else 0.0)
    cfg = _cfg("nvme", tmp_path, sched=False)
    del cfg["optimizer"]
    e, o, _, s = zspeed.initialize(model=m, optimizer=opt, lr_scheduler=sched, config=cfg)
    assert opt.param_groups is o.param_groups and s is sched
    _train(e, 2)
    assert o.param_groups[0]["lr"] == 0.0 and "initial_lr" in o.param_groups[0]
    before = [p.detach().clone() for p in e.module.parameters()]
    _train(e, 3)
    for x, p in zip(before, e.module.parameters()):
        assert torch.equal(x, p.detach())
    e.close()


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_offloaded_adagrad_refuses_lr_decay_with_one_message(tmp_path, device):
    # Both offloaded tiers run zspeed's Adagrad kernel, which has no lr decay: the same refusal,
    # naming the key and the fix, on either tier (not a silently ignored setting).
    cfg = _cfg(device, tmp_path, opt="Adagrad", sched=False)
    cfg["optimizer"]["params"]["lr_decay"] = 0.25
    with pytest.raises(ConfigError, match=r"lr_decay = 0\.25: zspeed's offloaded Adagrad \(CPU and NVMe\) has no lr "
                                          r"decay; set it to 0 and decay the lr with a scheduler"):
        _engine(cfg)
    assert not any(p.name.startswith("zspeed") for p in tmp_path.iterdir())  # nothing left in nvme_path
