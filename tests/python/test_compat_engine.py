"""DeepSpeed's engine rules as scripts see them: client optimizers (precedence over the
config, zero_allow_untested_optimizer, DeepSpeedCPUAdam with offload), the optimizer
wrapper's attributes, set_gradient_accumulation_boundary, loss.backward() called by the
script (with engine.scale under fp16), the stage-0 loss-scale rule, and the fp16 input
error that names fp16.auto_cast."""
import logging
import os

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

import zspeed
from zspeed.runtime.config import ConfigError
from zspeed.runtime.loss_scaler import LossScaleError

from engine_helpers import OFFLOAD, config as cfg, mlp, native_ops_available, regression_data as batches  # noqa: E402


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """CPU-only by design (CPU references, also on GPU machines): ZSPEED_DEVICE=cpu for each test, also under
    tests/gpu/gate.py (set per test, so that other files' tests keep the GPU)."""
    monkeypatch.setenv("ZSPEED_DEVICE", "cpu")

F = torch.nn.functional


def _params(e):
    return [p.detach().float().clone() for p in e.module.parameters()]


def _run(e, data, how="engine"):
    """One micro-batch per item: the loss, then the backward the way ``how`` names."""
    for x, y in data:
        loss = F.mse_loss(e(x.to(e.dtype)).float(), y)
        if how == "engine":
            e.backward(loss)
        elif how == "direct":
            loss.backward()
        else:
            e.scale(loss).backward()
        e.step()


# -- client optimizers -------------------------------------------------------------------------
def test_client_optimizer_takes_precedence_over_the_config(caplog):
    model = mlp()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    caplog.set_level(logging.WARNING, logger="zspeed")
    e, o, _, _ = zspeed.initialize(model=model, optimizer=sgd, config=cfg())
    assert o is sgd and e.basic_optimizer is sgd
    assert any("section is ignored" in r.getMessage() for r in caplog.records)
    before = _params(e)
    _run(e, batches(1))
    # SGD's update, not AdamW's: p - lr * grad exactly (fp32, stage 0).
    assert not torch.equal(before[0], _params(e)[0])


def test_untested_client_optimizer_with_zero_needs_the_key():
    model = mlp()
    c = {"train_batch_size": 6, "zero_optimization": {"stage": 2}}
    with pytest.raises(ConfigError, match="zero_allow_untested_optimizer") as info:
        zspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=c)
    assert isinstance(info.value, AssertionError)  # DeepSpeed asserts here; scripts catch that
    from zspeed.runtime.zero.utils import is_zero_supported_optimizer
    assert not is_zero_supported_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert is_zero_supported_optimizer(torch.optim.AdamW(model.parameters()))
    c["zero_allow_untested_optimizer"] = True
    e, *_ = zspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=c)
    _run(e, batches(2))
    assert e.global_steps == 2
    # A tested class needs no key.
    model = mlp()
    zspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                      config={"train_batch_size": 6, "zero_optimization": {"stage": 1}})


@pytest.mark.parametrize("module,name", [("torch.optim", "Adam"), ("torch.optim", "AdamW"),
                                         ("torch.optim", "Adagrad"), ("zspeed.ops.adam", "DeepSpeedCPUAdam"),
                                         ("zspeed.ops.adagrad", "DeepSpeedCPUAdagrad"),
                                         ("zspeed.ops.lion", "DeepSpeedCPULion"), ("zspeed.ops.adam", "FusedAdam"),
                                         ("zspeed.ops.lion", "FusedLion")])
def test_every_class_deepspeed_tests_zero_with_is_taken_without_the_key(module, name):
    """DeepSpeed 0.19's ZERO_SUPPORTED_OPTIMIZERS (runtime/zero/utils.py: torch's Adam, AdamW and
    Adagrad, FusedAdam, DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion, FusedLion): a
    client of each class initializes at ZeRO-2 without zero_allow_untested_optimizer and trains
    (DeepSpeedCPUAdagrad was refused before the optimizer table held it)."""
    import importlib
    if module.startswith("zspeed.ops") and not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available")
    cls = getattr(importlib.import_module(module), name)
    from zspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS, is_zero_supported_optimizer
    assert cls in ZERO_SUPPORTED_OPTIMIZERS
    model = mlp()
    client = cls(model.parameters(), lr=1e-3)
    assert is_zero_supported_optimizer(client)
    off = OFFLOAD if name.startswith("DeepSpeedCPU") else {"stage": 2}
    e, o, _, _ = zspeed.initialize(model=model, optimizer=client, config=cfg(zero_optimization=off))
    before = _params(e)
    _run(e, batches(2))
    assert e.global_steps == 2 and not torch.equal(before[0], _params(e)[0])
    e.close()


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_client_deepspeed_cpu_adam_with_offload_matches_the_config(device, tmp_path):
    if not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available")
    from zspeed.ops.adam import DeepSpeedCPUAdam
    off = dict(OFFLOAD, offload_optimizer={"device": device, "nvme_path": str(tmp_path)})
    data = batches(4, seed=9)
    ref, *_ = zspeed.initialize(model=mlp(), config=cfg(zero_optimization=off, bf16={"enabled": True}))
    _run(ref, data)
    model = mlp()
    client = DeepSpeedCPUAdam(model.parameters(), lr=2e-2, weight_decay=0.01)
    c = {"train_micro_batch_size_per_gpu": 6, "zero_optimization": off, "bf16": {"enabled": True}}
    e, o, _, _ = zspeed.initialize(model=model, optimizer=client, config=c)
    _run(e, data)
    # The same C kernel over the same fp32 masters: bit-identical weights.
    for a, b in zip(_params(ref), _params(e)):
        assert torch.equal(a, b)
    if device == "cpu":
        assert o.optimizer is client and client.state  # the script's object holds the state


def test_client_scheduler_keeps_driving_the_adopted_optimizer():
    model = mlp()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5)
    e, *_ = zspeed.initialize(model=model, optimizer=sgd, lr_scheduler=sched,
                              config={"train_batch_size": 6, "bf16": {"enabled": True}})
    _run(e, batches(2))
    assert e.get_lr() == [pytest.approx(0.025)]


# -- the optimizer wrapper ---------------------------------------------------------------------
def test_engine_optimizer_has_deepspeeds_wrapper_attributes():
    e, o, _, _ = zspeed.initialize(model=mlp(), config=cfg(fp16={"enabled": True, "initial_scale_power": 8}))
    assert isinstance(o.optimizer, torch.optim.AdamW) and o is e.optimizer
    assert o.loss_scaler is e.loss_scaler and o.dynamic_loss_scale is True
    assert o.cur_scale == o.loss_scale == 256.0
    lsc = o.loss_scale_config
    assert (lsc.use_grad_scaling, lsc.dynamic_loss_scale, lsc.cur_scale, lsc.scale_window, lsc.min_loss_scale,
            lsc.scale_factor) == (True, True, 256.0, 1000, 1.0, 2.0)
    o.param_groups[0]["lr"] = 0.5  # the groups are the basic optimizer's own
    assert o.optimizer.param_groups[0]["lr"] == 0.5 and e.get_lr() == [0.5]
    assert o.state_dict()["param_groups"] == o.optimizer.state_dict()["param_groups"]
    with pytest.raises(RuntimeError, match="engine.step"):
        o.step()
    # fp32 at stage 0: the basic optimizer itself, as in DeepSpeed.
    e, o, _, _ = zspeed.initialize(model=mlp(), config=cfg())
    assert type(o) is torch.optim.AdamW
    # bf16: no loss scaling, but the wrapper.
    e, o, _, _ = zspeed.initialize(model=mlp(), config=cfg(bf16={"enabled": True}))
    assert o.dynamic_loss_scale is False and o.loss_scale_config.use_grad_scaling is False


@pytest.mark.parametrize("stage,precision,opt,cls", [
    (0, "fp16", "config", "FP16_Optimizer"), (0, "bf16", "config", "FP16_Optimizer"),
    (0, "bf16", "torch_adam", "FP16_UnfusedOptimizer"), (0, "fp16", "client", "FP16_UnfusedOptimizer"),
    (1, "fp32", "config", "DeepSpeedZeroOptimizer"), (2, "bf16", "client", "DeepSpeedZeroOptimizer"),
    (3, "bf16", "config", "DeepSpeedZeroOptimizer_Stage3")])
def test_engine_optimizer_is_an_instance_of_deepspeeds_class_for_the_config(stage, precision, opt, cls):
    """The class DeepSpeed 0.19 builds for the config (its engine's optimizer sanity check), by
    DeepSpeed's module paths: isinstance checks in scripts hold; the behaviour is the wrapper's."""
    import importlib
    modules = {"FP16_Optimizer": "zspeed.runtime.fp16.fused_optimizer",
               "FP16_UnfusedOptimizer": "zspeed.runtime.fp16.unfused_optimizer",
               "DeepSpeedZeroOptimizer": "zspeed.runtime.zero.stage_1_and_2",
               "DeepSpeedZeroOptimizer_Stage3": "zspeed.runtime.zero.stage3"}
    want = getattr(importlib.import_module(modules[cls]), cls)
    top = {"zero_optimization": {"stage": stage}}
    if precision != "fp32":
        top[precision] = {"enabled": True}
    c = cfg(**top)
    if opt == "torch_adam":
        c["optimizer"]["params"]["torch_adam"] = True
    model = mlp()
    client = torch.optim.AdamW(model.parameters(), lr=1e-2) if opt == "client" else None
    if client is not None:
        del c["optimizer"]
    e, o, _, _ = zspeed.initialize(model=model, optimizer=client, config=c)
    assert type(o) is want and o is e.optimizer and repr(o).startswith(cls + "(")
    others = [getattr(importlib.import_module(m), n) for n, m in modules.items() if n != cls]
    assert not any(isinstance(o, k) for k in others)
    assert o.optimizer is e.basic_optimizer
    _run(e, batches(2))  # trains as before
    # DeepSpeed's name of that class for its fp32 masters: copies of the masters as the step left them
    from zspeed.utils import safe_get_full_fp32_param
    flat = torch.cat([safe_get_full_fp32_param(p).reshape(-1) for p in model.parameters()])
    attr = {"FP16_Optimizer": "fp32_groups_flat", "FP16_UnfusedOptimizer": "fp32_groups",
            "DeepSpeedZeroOptimizer": "single_partition_of_fp32_groups",
            "DeepSpeedZeroOptimizer_Stage3": "fp32_partitioned_groups_flat"}[cls]
    got = getattr(o, attr)
    assert len(got) == len(o.param_groups) == 1
    got = torch.cat([t.reshape(-1) for t in got[0]]) if attr == "fp32_groups" else got[0]
    assert got.dtype == torch.float32
    if stage == 3:  # each parameter's piece padded with zeros (zspeed's layout)
        assert torch.equal(got[got != 0], flat[flat != 0]) and got.numel() > flat.numel()
    else:
        assert torch.equal(got, flat)
    got.add_(1.0)  # a copy: the masters do not move
    first = next(model.parameters())
    n = getattr(first, "ds_numel", first.numel())
    assert torch.equal(safe_get_full_fp32_param(first).reshape(-1), flat[:n])


def test_deepspeeds_optimizer_module_paths_and_memory_estimators(capsys):
    """The modules scripts import the classes and DeepSpeed's estimators from; the estimators
    give DeepSpeed's formulas (worked by hand here) and print a table."""
    from zspeed.runtime.bf16_optimizer import BF16_Optimizer
    from zspeed.runtime.engine_optimizer import EngineOptimizer
    from zspeed.runtime.zero import stage3, stage_1_and_2
    assert issubclass(BF16_Optimizer, EngineOptimizer)
    # ZeRO-2, 1e9 parameters, 2 nodes x 4 GPUs: offload 2 B/param on the GPU, max(4 x 8, 16) x 1.5 on the CPU.
    assert stage_1_and_2.estimate_zero2_model_states_mem_needs(10**9, 4, 2, True) == (48 * 10**9, 2 * 10**9)
    assert stage_1_and_2.estimate_zero2_model_states_mem_needs(10**9, 4, 2, False, 1.0) == \
        (16 * 10**9, 2 * 10**9 + 2250 * 10**6)
    # ZeRO-3, 1e9 parameters, largest layer 1e7, 1 node x 2 GPUs.
    f = stage3.estimate_zero3_model_states_mem_needs
    assert f(10**9, 10**7, 2, 1, True, True, True, 1.0) == (18 * 10**9, 4 * 10**7, 4 * 10**7)
    assert f(10**9, 10**7, 2, 1, True, False, False, 1.0) == (16 * 10**9, 4 * 10**7 + 10**9, 4 * 10**7)
    assert f(10**9, 10**7, 2, 1, False, False, True, 1.0) == (8 * 10**7, 4 * 10**7 + 9 * 10**9, 4 * 10**7)
    model = mlp()
    n = sum(p.numel() for p in model.parameters())
    assert stage_1_and_2.model_to_params(model) == n
    assert stage3.model_to_params(model) == (n, 13 * 37 + 37)
    stage3.estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=2)
    stage_1_and_2.estimate_zero2_model_states_mem_needs_all_live(model)
    out = capsys.readouterr().out
    assert out.count("offload_optimizer=") == 6 + 2 and "zspeed plan" in out


@pytest.mark.parametrize("serialization", [None, False])
def test_engine_checkpoint_engine_saves_and_loads_the_scripts_own_files(tmp_path, serialization):
    """engine.checkpoint_engine (DeepSpeed's TorchCheckpointEngine, by DeepSpeed's module path):
    torch.save in torch's zipfile format unless checkpoint.checkpoint_serialization is false,
    torch.load back; DeepSpeed's other writers are refused by name."""
    import zipfile
    from zspeed.runtime.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine, create_checkpoint_engine
    from zspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    c = cfg()
    if serialization is not None:
        c["checkpoint"] = {"checkpoint_serialization": serialization}
    engine, *_ = zspeed.initialize(model=mlp(), config=c)
    ce = engine.checkpoint_engine
    assert isinstance(ce, TorchCheckpointEngine) and isinstance(ce, CheckpointEngine) and ce is engine.checkpoint_engine
    info = CheckpointCommitInfo(tag="t", save_dir=str(tmp_path), save_latest=True)
    ce.create(info)
    ce.makedirs(tmp_path / "t", exist_ok=True)
    obj = {"w": torch.arange(5.0), "step": 3}
    ce.save(obj, str(tmp_path / "t" / "extra.pt"))
    assert ce.commit(info) is True and ce.is_data_parallel_writer(0) and not ce.is_data_parallel_writer(1)
    assert zipfile.is_zipfile(tmp_path / "t" / "extra.pt") == (serialization is None)
    back = ce.load(str(tmp_path / "t" / "extra.pt"), map_location="cpu")
    assert torch.equal(back["w"], obj["w"]) and back["step"] == 3
    assert TorchCheckpointEngine().zipfile_serialization is False  # no config: the legacy format, as DeepSpeed
    assert isinstance(create_checkpoint_engine(c), TorchCheckpointEngine)
    with pytest.raises(ImportError, match="TorchCheckpointEngine"):
        from zspeed.runtime.checkpoint_engine import FastCheckpointEngine  # noqa: F401


class _WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(13, 5)
        self.register_buffer("inv_freq", torch.arange(7, dtype=torch.float32) / 7)
        self.register_buffer("count", torch.zeros(2, dtype=torch.int64))

    def forward(self, x):
        return self.lin(x) * self.inv_freq.float().sum()


@pytest.mark.parametrize("buffer_dtype,want", [(None, torch.float32), ("fp32", torch.float32),
                                               ("BF16", torch.bfloat16), ("fp16", torch.float16)])
@pytest.mark.parametrize("stage", [0, 3])
def test_data_types_buffer_dtype_casts_the_floating_buffers(buffer_dtype, want, stage):
    """data_types.buffer_dtype (DeepSpeed's): the module's floating-point buffers in that dtype at
    initialize (integer buffers untouched); unset, each keeps the dtype it was loaded in (DeepSpeed
    0.19.2+: an fp32 rotary inv_freq stays exact in a bf16 model); a name that is no dtype is refused."""
    c = cfg(bf16={"enabled": True}, zero_optimization={"stage": stage})
    if buffer_dtype is not None:
        c["data_types"] = {"buffer_dtype": buffer_dtype}
    engine, *_ = zspeed.initialize(model=_WithBuffer(), config=c)
    assert engine.module.inv_freq.dtype == want and engine.module.count.dtype == torch.int64
    assert engine._config.buffer_dtype == buffer_dtype and engine._config.param_dtype is None
    assert torch.equal(engine.module.inv_freq.float(), (torch.arange(7.0) / 7).to(want).float())
    if stage == 0:
        assert engine.module.lin.weight.dtype == torch.bfloat16
    loss = engine(torch.randn(6, 13, dtype=torch.bfloat16)).float().square().mean()
    engine.backward(loss)
    engine.step()
    with pytest.raises(ConfigError, match="buffer_dtype"):
        zspeed.initialize(model=_WithBuffer(), config=dict(c, data_types={"buffer_dtype": "int8"}))


def test_batchnorm_statistics_follow_the_weights_under_bf16():
    """BatchNorm's running statistics go with its weight's dtype (torch's kernel refuses fp32
    statistics beside a bf16 weight), other buffers keep their own; the model trains."""
    m = torch.nn.Sequential(torch.nn.Linear(13, 9), torch.nn.BatchNorm1d(9))
    m.register_buffer("inv_freq", torch.arange(7, dtype=torch.float32) / 7)
    engine, *_ = zspeed.initialize(model=m, config=cfg(bf16={"enabled": True}))
    bn = engine.module[1]
    assert bn.running_mean.dtype == bn.weight.dtype == torch.bfloat16
    assert bn.num_batches_tracked.dtype == torch.int64 and engine.module.inv_freq.dtype == torch.float32
    loss = engine(torch.randn(6, 13, dtype=torch.bfloat16)).float().square().mean()
    engine.backward(loss)
    engine.step()
    assert int(bn.num_batches_tracked) == 1


class _Router(torch.nn.Module):
    _keep_in_fp32_modules_strict = ["e_score_correction_bias"]
    _keep_in_fp32_modules = ["inv_freq"]

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(13, 5)
        # values close together: bf16 would merge them
        self.register_buffer("e_score_correction_bias", 9.0 + torch.arange(5, dtype=torch.float64) * 1e-3)
        self.register_buffer("inv_freq", torch.arange(7, dtype=torch.float32) / 7)
        self.register_buffer("scale", torch.ones(3, dtype=torch.float32))

    def forward(self, x):
        return self.lin(x) * (self.inv_freq.float().sum() + self.e_score_correction_bias.float().sum())


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Router()

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("precision,setting,want", [
    ("bf16", None, {"e_score_correction_bias": torch.float32, "inv_freq": torch.bfloat16}),
    ("fp16", None, {"e_score_correction_bias": torch.float32, "inv_freq": torch.float32}),
    ("bf16", ["inv_*"], {"e_score_correction_bias": torch.bfloat16, "inv_freq": torch.float32}),
    ("bf16", [], {"e_score_correction_bias": torch.bfloat16, "inv_freq": torch.bfloat16}),
])
def test_data_types_keep_in_fp32_modules(precision, setting, want):
    """data_types.keep_in_fp32_modules (DeepSpeed 0.19.8's): the buffers it names stay (or become)
    fp32 under fp16/bf16 even with buffer_dtype set; "auto" (the default) reads transformers'
    lists (_keep_in_fp32_modules_strict always, _keep_in_fp32_modules under fp16) relative to the
    submodule that declares them; a pattern's * matches any characters; [] keeps nothing."""
    c = cfg(**{precision: {"enabled": True}}, data_types={"buffer_dtype": precision})
    if setting is not None:
        c["data_types"]["keep_in_fp32_modules"] = setting
    engine, *_ = zspeed.initialize(model=_Outer(), config=c)
    inner = engine.module.inner
    for name, dt in want.items():
        assert getattr(inner, name).dtype == dt, name
    assert inner.scale.dtype == (torch.bfloat16 if precision == "bf16" else torch.float16)
    if want["e_score_correction_bias"] == torch.float32:  # fp32 from the fp64 values: 5 distinct
        assert inner.e_score_correction_bias.unique().numel() == 5
    with pytest.raises(ConfigError, match="keep_in_fp32_modules"):
        zspeed.initialize(model=_Outer(), config=dict(c, data_types={"keep_in_fp32_modules": "all"}))


def test_deepspeed_mixed_precision_helpers_on_stand_ins():
    """DeepSpeedEngine's mixed-precision helpers, called as DeepSpeed's own tests call them (on an
    object carrying only _config, fp16_enabled, bfloat16_enabled and module)."""
    import types
    from zspeed.runtime.engine import DeepSpeedEngine

    def stand_in(param_dtype=None, buffer_dtype=None, fp16=False, bf16=False, module=None):
        return types.SimpleNamespace(_config=types.SimpleNamespace(param_dtype=param_dtype, buffer_dtype=buffer_dtype),
                                     fp16_enabled=lambda: fp16, bfloat16_enabled=lambda: bf16, module=module)

    assert DeepSpeedEngine._mixed_precision_dtypes(stand_in(bf16=True)) == (torch.bfloat16, None)
    assert DeepSpeedEngine._mixed_precision_dtypes(stand_in(fp16=True, buffer_dtype="FP32")) == (torch.float16,
                                                                                               torch.float32)
    assert DeepSpeedEngine._mixed_precision_dtypes(stand_in()) == (None, None)
    DeepSpeedEngine._assert_valid_mixed_precision_config(stand_in(param_dtype="bf16", bf16=True))
    for pdt, fp16, bf16 in [("fp16", False, True), ("fp32", False, True), ("bf16", True, False), ("bf16", False, False)]:
        with pytest.raises(AssertionError, match="param_dtype"):
            DeepSpeedEngine._assert_valid_mixed_precision_config(stand_in(param_dtype=pdt, fp16=fp16, bf16=bf16))
    m = _Router()
    DeepSpeedEngine._cast_module_mixed_precision(stand_in(module=m), torch.bfloat16, None, False)
    assert m.lin.weight.dtype == torch.bfloat16 and m.inv_freq.dtype == torch.float32
    assert m.e_score_correction_bias.dtype == torch.float64
    m = _Router()
    from zspeed.runtime.engine import keep_in_fp32_pattern
    pat = keep_in_fp32_pattern(m, "auto", torch.bfloat16)
    DeepSpeedEngine._cast_module_mixed_precision(stand_in(module=m), None, torch.bfloat16, True, pat)
    assert m.lin.weight.dtype == torch.float32 and m.inv_freq.dtype == torch.bfloat16
    assert m.e_score_correction_bias.dtype == torch.float32 and m.scale.dtype == torch.bfloat16
    assert keep_in_fp32_pattern(m, "auto", torch.float32) is None


def test_param_dtype_that_disagrees_is_an_assertion():
    """data_types.param_dtype other than fp16/bf16's dtype: DeepSpeed asserts, so scripts catch
    AssertionError (zspeed's ConfigError is one too here)."""
    with pytest.raises(AssertionError, match="param_dtype"):
        zspeed.initialize(model=_WithBuffer(), config=cfg(bf16={"enabled": True}, data_types={"param_dtype": "fp16"}))


def test_unwrap_model_for_generation_gathers_a_zero3_model_once():
    from zspeed.runtime.zero.stage3 import unwrap_model_for_generation
    c = cfg(zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    x = torch.randn(4, 13)
    with torch.no_grad():
        want = e.module(x)
    with unwrap_model_for_generation(e) as m:
        assert m is e and all(p.numel() == p.ds_numel for p in e.module.parameters())  # whole inside
        with torch.no_grad():
            assert torch.equal(m.module(x), want)
    assert all(p.numel() == 0 for p in e.module.parameters())  # partitioned again after


def _trl_remove_hooks(engine):
    """What TRL's remove_hooks does with a DeepSpeed ZeRO-3 engine (its calls, written here)."""
    off = engine.optimizer.parameter_offload
    for m in off.module.modules():
        for p in list(m.parameters(recurse=False)) + [q for _, q in m.ds_external_parameters()]:
            p.ds_active_sub_modules.clear()
    for h in off.forward_hooks:
        h.remove()
    for h in off.backward_hooks:
        h.remove()
    off.forward_hooks = []
    off.backward_hooks = []


def test_trl_generation_context_takes_the_zero3_hooks_off_and_puts_them_back():
    """TRL's unwrap_model_for_generation with a ZeRO-3 engine: GatheredParameters, the hooks off
    through engine.optimizer.parameter_offload, a forward on the whole model, the hooks back with
    _register_deepspeed_module; training on gives bit for bit the weights of an engine that never
    left. The hooks are installed once however often they are put back."""
    from zspeed.runtime.zero import GatheredParameters
    c = cfg(zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
    data = batches(4, seed=3)
    ref, *_ = zspeed.initialize(model=mlp(), config=c)
    _run(ref, data)
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    _run(e, data[:2])
    off = e.optimizer.parameter_offload
    assert off.module is e.module and off.forward_hooks and off.backward_hooks
    counts = (len(off.forward_hooks), len(off.backward_hooks))
    x = torch.randn(3, 13)
    with torch.no_grad(), GatheredParameters(list(e.parameters())):
        whole = {n: p.detach().clone() for n, p in e.module.named_parameters()}
        _trl_remove_hooks(e)
        assert (off.forward_hooks, off.backward_hooks) == ([], [])
        got = e(x)
        off._register_deepspeed_module(off.module)
    plain = mlp()
    plain.load_state_dict(whole)
    with torch.no_grad():
        assert torch.equal(got, plain(x))
    assert (len(off.forward_hooks), len(off.backward_hooks)) == counts
    off._register_hooks_recursively(off.module)  # DeepSpeed's older name; again: still once
    assert (len(off.forward_hooks), len(off.backward_hooks)) == counts
    assert all(p.numel() == 0 for p in e.module.parameters())  # partitioned again
    _run(e, data[2:])
    for a, b in zip(_params(ref), _params(e)):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="whole model"):
        off._register_deepspeed_module(e.module[0])
    below, *_ = zspeed.initialize(model=mlp(), config=cfg(zero_optimization={"stage": 2}))
    assert not hasattr(below.optimizer, "parameter_offload")


def test_zero3_modules_and_parameters_carry_deepspeeds_bookkeeping():
    """Every module of a ZeRO-3 model has ds_id and ds_external_parameters(); a parameter's
    ds_active_sub_modules holds the ds_id of the modules running with it whole (empty once it is
    released); a close() takes the module attributes away with the hooks."""
    from zspeed.runtime.zero import register_external_parameter
    c = cfg(zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    first, last = e.module[0], e.module[-1]
    assert isinstance(first.ds_id, int) and first.ds_id != last.ds_id
    assert first.ds_external_parameters() == []
    register_external_parameter(last, first.weight)
    assert last.ds_external_parameters() == [(id(first.weight), first.weight)]
    seen = {}
    h = last.register_forward_pre_hook(lambda m, a: seen.update(  # runs after zspeed's own pre-hook
        w=set(m.weight.ds_active_sub_modules), ext=set(first.weight.ds_active_sub_modules)))
    with torch.no_grad():
        e(torch.randn(2, 13))
    h.remove()
    assert seen == {"w": {last.ds_id}, "ext": {last.ds_id}}  # first.weight: gathered again for last
    assert all(p.ds_active_sub_modules == set() for p in e.module.parameters())
    c2 = cfg(zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 10 ** 6})  # all persistent
    p2, *_ = zspeed.initialize(model=mlp(), config=c2)
    _run(p2, batches(1, seed=4))  # a forward and a backward: empty again after them
    assert all(p.ds_active_sub_modules == set() for p in p2.module.parameters())
    e.close()
    assert not hasattr(first, "ds_id") and not hasattr(first, "ds_external_parameters")


def test_unwrap_model_for_generation_runs_without_the_hooks():
    """DeepSpeed's unwrap_model_for_generation takes the ZeRO-3 hooks off inside (the whole model
    runs with no hook per module) and puts them back on leaving, also after an exception."""
    from zspeed.runtime.zero.stage3 import unwrap_model_for_generation
    c = cfg(zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    off = e.optimizer.parameter_offload
    n = len(off.forward_hooks)
    with unwrap_model_for_generation(e):
        assert off.forward_hooks == [] and off.backward_hooks == []
    assert len(off.forward_hooks) == n
    with pytest.raises(RuntimeError, match="inside"):
        with unwrap_model_for_generation(e):
            raise RuntimeError("inside")
    assert len(off.forward_hooks) == n and all(p.numel() == 0 for p in e.module.parameters())
    _run(e, batches(2, seed=5))  # trains on


class _SparseEmb(torch.nn.Module):
    def __init__(self, sparse: bool, bag: bool):
        super().__init__()
        torch.manual_seed(0)
        self.emb = (torch.nn.EmbeddingBag(11, 5, mode="sum", sparse=sparse) if bag
                    else torch.nn.Embedding(11, 5, sparse=sparse))
        self.lin = torch.nn.Linear(5, 2)

    def forward(self, ids):
        h = self.emb(ids) if isinstance(self.emb, torch.nn.EmbeddingBag) else self.emb(ids).sum(1)
        return self.lin(h).pow(2).mean()


@pytest.mark.parametrize("case", ["s0", "s0-bf16", "s1-cpu", "s2-cpu-bag", "s3-cpu", "s2-direct"])
def test_sparse_embedding_gradients_train_as_dense(case):
    """An nn.Embedding / EmbeddingBag built with sparse=True: its sparse gradient is made dense as
    it is accumulated (every zspeed path steps dense gradients), so the weights are bit for bit
    those of the same model with sparse=False, at every stage, with gradient accumulation and with
    a backward the script starts itself (loss.backward())."""
    stage = int(case[1])
    z = {"stage": stage}
    if "cpu" in case:
        z["offload_optimizer"] = {"device": "cpu"}
    if stage == 3:
        z.update(offload_param={"device": "cpu"}, stage3_param_persistence_threshold=0)
    extra = {"bf16": {"enabled": True}} if "bf16" in case else {}
    ids = torch.tensor([[1, 2, 1], [7, 7, 3]])  # repeated ids: the sparse gradient has duplicates
    out = []
    for sparse in (True, False):
        e, *_ = zspeed.initialize(model=_SparseEmb(sparse, "bag" in case),
                                  config=cfg(gradient_accumulation_steps=2, zero_optimization=z, **extra))
        for _ in range(6):
            loss = e(ids)
            if "direct" in case:
                loss.backward()
            else:
                e.backward(loss)
            e.step()
        from zspeed.runtime.zero import GatheredParameters
        with GatheredParameters(list(e.module.parameters())):
            out.append([t.float().clone() for t in _params(e)])
    for a, b in zip(*out):
        assert a.numel() and torch.equal(a, b)
    assert not torch.equal(out[0][0], _SparseEmb(False, "bag" in case).emb.weight.float())  # it trained
    with pytest.raises(ConfigError, match="sparse_gradients.*DeepSpeed 0.19.8 removed it too.*sparse=True"):
        zspeed.initialize(model=_SparseEmb(True, False), config=cfg(sparse_gradients=True))


# -- the accumulation boundary -------------------------------------------------------------------
def test_set_gradient_accumulation_boundary_as_accelerate_drives_it():
    data = batches(8, seed=2)
    gas = {"gradient_accumulation_steps": 4}
    ref, *_ = zspeed.initialize(model=mlp(), config=cfg(**gas))
    _run(ref, data)
    e, *_ = zspeed.initialize(model=mlp(), config=cfg(**gas))
    for i, (x, y) in enumerate(data):
        boundary = i % 4 == 3
        e.set_gradient_accumulation_boundary(boundary)
        assert e.is_gradient_accumulation_boundary() is boundary
        e.backward(F.mse_loss(e(x), y))
        if boundary:  # accelerate calls step() on boundaries only
            e.step()
    assert e.global_steps == ref.global_steps == 2
    for a, b in zip(_params(ref), _params(e)):
        assert torch.equal(a, b)
    # False holds the optimizer back whatever the micro-step count says.
    e.set_gradient_accumulation_boundary(False)
    before = _params(e)
    for x, y in data[:5]:
        e.backward(F.mse_loss(e(x), y))
        e.step()
    assert e.global_steps == 2 and all(torch.equal(a, b) for a, b in zip(before, _params(e)))
    e.set_gradient_accumulation_boundary(None)
    with pytest.raises(TypeError):
        e.set_gradient_accumulation_boundary(1)


# -- loss.backward() called by the script ---------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("offload", [False, True])
def test_direct_backward_trains_like_engine_backward(precision, offload):
    if offload and not native_ops_available():
        pytest.skip("zspeed.ops (native CPU optimizers) not available")
    c = cfg(gradient_accumulation_steps=3)
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    if offload:
        c["zero_optimization"] = OFFLOAD
    data = batches(6, seed=4)
    ref, *_ = zspeed.initialize(model=mlp(), config=c)
    _run(ref, data, "engine")
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    _run(e, data, "direct")
    assert e.global_steps == 2
    # The gradients are divided by 3 at the parameters instead of at the loss: the same values
    # up to the rounding of that division (fp32: ~1 ulp per step; bf16: the model's rounding).
    tol = 1e-5 if precision == "fp32" else 2e-2
    for a, b in zip(_params(ref), _params(e)):
        assert torch.allclose(a, b, rtol=tol, atol=tol)


class LossAndLogits(torch.nn.Module):
    """Returns (loss, logits) like a Hugging Face model: the loss depends on the other output."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, x, y):
        logits = self.net(x)
        return F.mse_loss(logits.float(), y), logits


def test_direct_backward_divides_once_when_outputs_depend_on_each_other():
    c = cfg(gradient_accumulation_steps=2)
    data = batches(2, seed=6)
    ref, *_ = zspeed.initialize(model=LossAndLogits(), config=c)
    e, *_ = zspeed.initialize(model=LossAndLogits(), config=c)
    for x, y in data:
        ref.backward(ref(x, y)[0])
        e(x, y)[0].backward()
        grads_ref = [p.grad.clone() for p in ref.module.parameters()]
        grads = [p.grad.clone() for p in e.module.parameters()]
        for a, b in zip(grads_ref, grads):
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)
        ref.step()
        e.step()


def test_fp16_direct_backward_needs_engine_scale():
    c = cfg(fp16={"enabled": True, "initial_scale_power": 8}, gradient_accumulation_steps=2)
    data = batches(4, seed=8)
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    x, y = data[0]
    with pytest.raises(RuntimeError, match="engine.scale"):
        F.mse_loss(e(x.half()).float(), y).backward()
    assert all(p.grad is None for p in e.module.parameters())  # refused before any gradient
    ref, *_ = zspeed.initialize(model=mlp(), config=c)
    _run(ref, data, "engine")
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    _run(e, data, "scale")
    assert e.get_global_grad_norm() == pytest.approx(ref.get_global_grad_norm(), rel=1e-3)
    for a, b in zip(_params(ref), _params(e)):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-3)  # fp16 weights, same scaled gradients
    assert e.scale(F.mse_loss(e(x.half()).float(), y)).item() == pytest.approx(
        256.0 * F.mse_loss(e(x.half()).float(), y).item(), rel=1e-3)


# -- loss scaling at stage 0 ------------------------------------------------------------------------
class AlwaysInf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, x):
        return self.net(x) * torch.tensor(float("inf"), dtype=torch.float16)


def test_stage0_overflow_at_the_minimum_keeps_training_but_zero2_stops():
    fp16 = {"enabled": True, "initial_scale_power": 2, "min_loss_scale": 1, "hysteresis": 2}
    e, *_ = zspeed.initialize(model=AlwaysInf(), config=cfg(fp16=fp16))
    scales = []
    for x, y in batches(5):
        e.backward(F.mse_loss(e(x.half()).float(), y))
        e.step()
        scales.append(e.loss_scale)
    assert scales == [2, 1, 1, 1, 1] and e.skipped_steps == 5  # halves on every overflow, then holds
    z2 = cfg(fp16=fp16, zero_optimization={"stage": 2})
    e, *_ = zspeed.initialize(model=AlwaysInf(), config=z2)
    with pytest.raises(LossScaleError, match="minimum"):
        for x, y in batches(5):
            e.backward(F.mse_loss(e(x.half()).float(), y))
            e.step()


# -- fp16 inputs --------------------------------------------------------------------------------------
def test_fp32_inputs_to_an_fp16_model_name_auto_cast():
    e, *_ = zspeed.initialize(model=mlp(), config=cfg(fp16={"enabled": True}))
    x, y = batches(1)[0]
    with pytest.raises(ConfigError, match="auto_cast") as info:
        e(x)
    assert isinstance(info.value.__cause__, RuntimeError)
    e, *_ = zspeed.initialize(model=mlp(), config=cfg(fp16={"enabled": True, "auto_cast": True}))
    assert e(x).dtype == torch.float16
    e, *_ = zspeed.initialize(model=mlp(), config=cfg(bf16={"enabled": True}))
    with pytest.raises(ConfigError, match="bfloat16"):
        e(x)


def test_an_empty_save_dir_and_an_odd_allgather_bucket_are_refused_as_in_deepspeed(tmp_path, monkeypatch):
    """DeepSpeed's save_checkpoint raises ValueError for an empty save_dir (else the checkpoint
    lands in the working directory), and its stage 1-2 optimizer requires an even
    allgather_bucket_size (stage 3 does not check it)."""
    e = zspeed.initialize(model=mlp(), config=cfg(zero_optimization={"stage": 2}))[0]
    monkeypatch.chdir(tmp_path)
    for bad in ("", None):
        with pytest.raises(ValueError, match="save_dir must be a non-empty string"):
            e.save_checkpoint(bad)
    assert list(tmp_path.iterdir()) == []  # nothing written
    for stage in (1, 2):
        c = cfg(zero_optimization={"stage": stage, "allgather_bucket_size": 1001})
        with pytest.raises(AssertionError, match=r"^allgather_bucket_size must be a multiple of "
                           r"nccl_start_alignment_factor \(2 at ZeRO stages 1-2.*is 1001.*1002") as got:
            zspeed.initialize(model=mlp(), config=c)  # DeepSpeed asserts, and scripts look for its words
        assert isinstance(got.value, ConfigError)
        assert "allgather_bucket_size must be a multiple of nccl_start_alignment_factor" in str(got)
    zspeed.initialize(model=mlp(), config=cfg(zero_optimization={"stage": 3, "allgather_bucket_size": 1001}))


class _WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.used, self.unused = torch.nn.Linear(13, 5), torch.nn.Linear(13, 5)

    def forward(self, x):
        return self.used(x)


@pytest.mark.parametrize("ignore", [False, True])
def test_ignore_unused_parameters_false_refuses_a_step_with_unused_parameters(ignore):
    """DeepSpeed's stage 1-2 CPU offload asserts when a trained parameter got no gradient and
    zero_optimization.ignore_unused_parameters is false; with true (the default) it steps."""
    c = cfg(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"},
                               "ignore_unused_parameters": ignore})
    e = zspeed.initialize(model=_WithUnused(), config=c)[0]
    x, y = batches(1)[0]
    before = _params(e)
    e.backward(F.mse_loss(e(x), y))
    if ignore:
        e.step()
        assert not torch.equal(_params(e)[0], before[0])
        return
    with pytest.raises(AssertionError, match=r"ignore_unused_parameters is false and 2 trained parameter\(s\) "
                                             r"got no gradient in this step: unused.weight, unused.bias"):
        e.step()
    assert all(torch.equal(a, b) for a, b in zip(_params(e), before))  # nothing stepped
    # Stage 3, or no offload: DeepSpeed does not check there, nor does zspeed.
    for z in ({"stage": 3, "ignore_unused_parameters": False},
              {"stage": 2, "ignore_unused_parameters": False}):
        e = zspeed.initialize(model=_WithUnused(), config=cfg(zero_optimization=z))[0]
        e.backward(F.mse_loss(e(x), y))
        e.step()


@pytest.mark.parametrize("stage,set_to,want", [(3, None, True), (2, None, False), (1, None, False),
                                                (3, False, False), (2, True, True)])
def test_overlap_comm_defaults_as_deepspeeds_on_at_stage_3(stage, set_to, want):
    """zero_optimization.overlap_comm unset: on at stage 3 and off below, as DeepSpeed's
    validator resolves it; a given value is used as given (engine.zero_overlap_comm())."""
    z = {"stage": stage}
    if set_to is not None:
        z["overlap_comm"] = set_to
    engine, *_ = zspeed.initialize(model=mlp(), config=cfg(zero_optimization=z))
    assert engine.zero_overlap_comm() is want
    _run(engine, batches(2))


def test_no_sync_and_coalesce_grad_reduction_refuse_what_deepspeed_refuses():
    from zspeed.runtime.errors import NoSyncError
    e2, *_ = zspeed.initialize(model=mlp(), config=cfg(zero_optimization={"stage": 2}))
    with pytest.raises(AssertionError, match="no_sync context manager is incompatible .* ZeRO stage 2"):
        with e2.no_sync():
            pass
    x, y = batches(1)[0]
    with e2.coalesce_grad_reduction():
        e2.backward(torch.nn.functional.mse_loss(e2(x), y))
        with pytest.raises(NoSyncError, match="illegal to call Engine.step.. inside .*no_sync"):
            e2.step()
        with pytest.raises(AssertionError, match="coalesce_grad_reduction context manager reentry"):
            with e2.coalesce_grad_reduction():
                pass
    e2.step()  # after the block the step applies the block's gradients
    assert e2.global_steps == 1
    e0, *_ = zspeed.initialize(model=mlp(), config=cfg())
    with pytest.raises(NotImplementedError, match="requires ZeRO stage 1/2/3"):
        with e0.coalesce_grad_reduction():
            pass
    with e0.no_sync():
        with pytest.raises(AssertionError, match="no_sync context manager reentry is unsupported"):
            with e0.no_sync():
                pass
        with pytest.raises(NotImplementedError):
            with e0.coalesce_grad_reduction():
                pass
        e0.backward(torch.nn.functional.mse_loss(e0(x), y))
        with pytest.raises(AssertionError, match="It is illegal to call Engine.step.. inside no_sync context"):
            e0.step()
    e0.backward(torch.nn.functional.mse_loss(e0(x), y))
    e0.step()
    assert e0.global_steps == 1


def test_engine_passes_public_attributes_through_to_the_model():
    """DeepSpeed's engine looks up an attribute it lacks on the wrapped model (a model's own
    ``id``, its methods); the engine's own attributes win, private names are not passed."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.id = 3
            self._secret = 1
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.lin(x)

        def describe(self):
            return f"M with {self.lin.out_features} outputs"

        def step(self):  # the engine's own step wins
            raise AssertionError("the model's step was called")

    e, *_ = zspeed.initialize(model=M(), config=cfg())
    assert e.id == 3 and e.describe() == "M with 2 outputs" and e.lin is e.module.lin
    with pytest.raises(AttributeError, match="_secret"):
        e._secret
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        e.nothing_here
    loss = e(torch.randn(6, 4)).square().mean()
    e.backward(loss)
    e.step()
    assert e.global_steps == 1


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_one_loss_over_several_engines_with_deepspeeds_backward_epilogue(stage):
    """DeepSpeed's multiple-models pattern: one loss over two engines' models, loss.backward() by
    the script, then each engine's internal _backward_epilogue() and step(). zspeed ends such a
    backward itself, so the calls change nothing: the weights equal a run without them, and each
    engine's steps are those of its model trained alone on its part of the loss (to fp32 rounding:
    autograd sums the two parts' graphs in another order)."""
    import torch.nn.functional as F

    def run(epilogue):
        engines = [zspeed.initialize(model=mlp(seed=i), config=cfg(zero_optimization={"stage": stage}))[0]
                   for i in range(2)]
        for x, y in batches(3):
            losses = [F.mse_loss(e(x), y) for e in engines]
            sum(l / (i + 1) for i, l in enumerate(losses)).backward()
            for e in engines:
                if epilogue:
                    e._backward_epilogue()
            for e in engines:
                e.step()
        return [_params(e) for e in engines]

    with_calls, without = run(True), run(False)
    for a, b in zip(with_calls, without):
        for p, q in zip(a, b):
            assert torch.equal(p, q)
    # each model trained alone through engine.backward on its part of the loss: the same steps
    for i, got in enumerate(with_calls):
        alone = zspeed.initialize(model=mlp(seed=i), config=cfg(zero_optimization={"stage": stage}))[0]
        for x, y in batches(3):
            alone.backward(F.mse_loss(alone(x), y) / (i + 1))
            alone.step()
        for p, q in zip(got, _params(alone)):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
