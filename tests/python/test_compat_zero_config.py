"""DeepSpeed's config and loss-scaler names that scripts import (runtime/zero/config.py,
runtime/zero/offload_config.py, runtime/fp16/loss_scaler.py, runtime/precision_config.py,
runtime/config_utils.py): ZeroStageEnum, DeepSpeedZeroConfig with DeepSpeed's deprecated
spellings, get_zero_config, the precision sections, and the add_safe_globals idiom."""
from __future__ import annotations

import argparse
import os
import re
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402

import zspeed  # noqa: E402

from zspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler  # noqa: E402
from zspeed.runtime.zero.config import (DeepSpeedZeroConfig, DeepSpeedZeroOffloadOptimizerConfig,  # noqa: E402
                                        DeepSpeedZeroOffloadParamConfig, ZeroStageEnum, get_zero_config)
from zspeed.runtime.zero.offload_config import OffloadDeviceEnum  # noqa: E402


def test_stage_enum_is_an_int():
    assert ZeroStageEnum.weights == 3 and ZeroStageEnum.max_stage is ZeroStageEnum.weights
    assert [int(s) for s in (ZeroStageEnum.disabled, ZeroStageEnum.optimizer_states, ZeroStageEnum.gradients)] == \
        [0, 1, 2]
    assert 2 <= ZeroStageEnum.gradients < ZeroStageEnum.weights


def test_deprecated_fields_and_defaults():
    c = DeepSpeedZeroConfig(**{"cpu_offload_param": True})
    assert isinstance(c.offload_param, DeepSpeedZeroOffloadParamConfig) and c.offload_param.device == "cpu"
    assert c.offload_param.device is OffloadDeviceEnum.cpu and c.offload_optimizer is None
    c = DeepSpeedZeroConfig(**{"cpu_offload": True, "cpu_offload_use_pin_memory": True})
    assert isinstance(c.offload_optimizer, DeepSpeedZeroOffloadOptimizerConfig) and c.offload_optimizer.pin_memory
    c = DeepSpeedZeroConfig(stage=3)
    assert c.stage is ZeroStageEnum.weights and c.reduce_bucket_size == 500_000_000
    # overlap_comm unset: DeepSpeed's validator (overlap_comm_valid) turns it on at stage 3 only
    assert c.overlap_comm is True and DeepSpeedZeroConfig(stage=2).overlap_comm is False
    assert DeepSpeedZeroConfig(stage=3, overlap_comm=False).overlap_comm is False
    assert DeepSpeedZeroConfig(stage=1, overlap_comm=True).overlap_comm is True
    assert c.offload_param is None and c.offload_optimizer is None
    with pytest.raises(AttributeError, match="read-only"):
        c.stage = 2
    with pytest.raises(AttributeError, match="no field 'nope'"):
        c.nope  # noqa: B018


def test_bad_sections_name_the_key():
    with pytest.raises(ValueError, match="Did you mean 'reduce_bucket_size'"):
        DeepSpeedZeroConfig(stage=2, reduce_bucket_sizes=3)
    with pytest.raises(ValueError, match="zero_optimization.stage"):
        DeepSpeedZeroConfig(stage=5)
    with pytest.raises(ValueError, match="offload_param"):
        DeepSpeedZeroConfig(stage=3, offload_param={"device": "disk"})


def test_offload_sections_are_objects_when_given_and_pipeline_is_derived():
    """DeepSpeed's fields: None when a section is absent or null, an object when given (device
    "none" too), defaults filled in; offload_optimizer.pipeline = pipeline_read or pipeline_write."""
    c = DeepSpeedZeroConfig(offload_param=None, offload_optimizer=None)
    assert c.offload_param is None and c.offload_optimizer is None
    c = DeepSpeedZeroConfig(offload_param={}, offload_optimizer={})
    assert isinstance(c.offload_param, DeepSpeedZeroOffloadParamConfig) and c.offload_param.device == "none"
    assert isinstance(c.offload_optimizer, DeepSpeedZeroOffloadOptimizerConfig)
    assert c.offload_param.buffer_count == 5 and c.offload_optimizer.buffer_count == 4
    assert DeepSpeedZeroOffloadOptimizerConfig().pipeline is False
    for r, w in [(True, False), (False, True), (True, True)]:
        assert DeepSpeedZeroOffloadOptimizerConfig(pipeline_read=r, pipeline_write=w).pipeline is True
    assert DeepSpeedZeroOffloadParamConfig(device=OffloadDeviceEnum.cpu).device is OffloadDeviceEnum.cpu
    with pytest.raises(ValueError, match="unknown config key .pipline_read.*Did you mean .pipeline_read"):
        DeepSpeedZeroOffloadOptimizerConfig(pipline_read=True)


def test_every_deepspeed_zero_field_is_known():
    """DeepSpeed's zero_optimization fields are attributes with DeepSpeed's defaults; switches
    with nothing to switch take any value; a feature zspeed lacks is refused by name unless at
    its default; a misspelling stays an unknown key."""
    from zspeed.runtime.config import ConfigError, parse_config
    c = DeepSpeedZeroConfig()
    defaults = {"pipeline_loading_checkpoint": False, "override_module_apply": True, "legacy_stage1": False,
                "use_multi_rank_bucket_allreduce": True, "use_all_reduce_for_fetch_params": False,
                "allgather_sequential": False, "model_persistence_threshold": 2 ** 63 - 1,
                "zero_hpz_partition_size": 1, "zero_quantized_weights": False, "zero_quantized_gradients": False,
                "zero_quantized_nontrainable_weights": False, "zeropp_loco_param": None, "mics_shard_size": -1,
                "mics_hierarchical_params_gather": False, "log_trace_cache_warnings": False,
                "save_muon_momentum_buffer_in_memory": False, "zenflow": None, "cpu_offload_param": None,
                "cpu_offload_use_pin_memory": None}
    for k, v in defaults.items():
        assert getattr(c, k) == v, k
    assert DeepSpeedZeroConfig(stage3_allgather_sequential=True).allgather_sequential is True
    run = {"train_batch_size": 1}
    parse_config({**run, "zero_optimization": {"stage": 3, "use_multi_rank_bucket_allreduce": False,
                                               "legacy_stage1": True, "zero_quantized_weights": False,
                                               "pipeline_loading_checkpoint": True,
                                               "mics_shard_size": -1}}, world_size=1)
    for key, value, needle in [("zero_quantized_weights", True, "ZeRO++ quantized weight"),
                               ("zero_hpz_partition_size", 2, "hierarchical"), ("mics_shard_size", 2, "MiCS"),
                               ("override_module_apply", False, "Module.apply"),
                               ("zeropp_loco_param", {"err_beta": 0.8}, "LoCo")]:
        with pytest.raises(ConfigError, match=f"zero_optimization.{key}.*{re.escape(needle)}.*does not implement"):
            parse_config({**run, "zero_optimization": {"stage": 3, key: value}}, world_size=1)
    with pytest.raises(ConfigError, match="unknown config key 'mics_shard_sizes'"):
        parse_config({**run, "zero_optimization": {"stage": 3, "mics_shard_sizes": 2}}, world_size=1)


def test_get_zero_config():
    c = get_zero_config({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})
    assert c.stage == 2 and c.offload_optimizer.device == "cpu"
    assert get_zero_config({}).stage == 0
    assert get_zero_config({"zero_optimization": True}).stage == 1


def test_loss_scalers_and_safe_globals():
    assert issubclass(DynamicLossScaler, LossScaler)
    assert DynamicLossScaler().loss_scale == 2.0 ** 16 and LossScaler(4.0).loss_scale == 4.0
    if hasattr(torch.serialization, "add_safe_globals"):  # what resuming scripts do before torch.load
        torch.serialization.add_safe_globals([LossScaler, ZeroStageEnum])


def test_the_precision_sections():
    from zspeed.runtime.config import ConfigError
    from zspeed.runtime.config_utils import DeepSpeedConfigModel
    from zspeed.runtime.precision_config import (DeepSpeedBF16Config, DeepSpeedFP16Config, get_bfloat16_config,
                                                 get_float16_config)
    bf = get_bfloat16_config({"bf16": {"enabled": True}})
    assert isinstance(bf, DeepSpeedBF16Config) and bf.enabled and bf.check_grad_overflow  # defaults filled in
    assert get_bfloat16_config({"bfloat16": {"enabled": True}}).enabled  # the old spelling
    assert not get_bfloat16_config({}).enabled and not get_float16_config({"fp16": None}).enabled
    fp = get_float16_config({"fp16": {"enabled": True, "initial_scale_power": 8}})
    assert isinstance(fp, DeepSpeedFP16Config) and fp.initial_scale_power == 8 and fp.loss_scale_window == 1000
    for c in (bf, fp, DeepSpeedZeroConfig(stage=2)):
        assert isinstance(c, DeepSpeedConfigModel)
    # DeepSpeed's classes are pydantic models: a bad section is pydantic's ValidationError (a
    # ValueError) carrying zspeed's message, where pydantic is installed; ConfigError where not.
    try:
        from pydantic import ValidationError
        title = "1 validation error for DeepSpeedFP16Config(.|\n)*"
    except ImportError:  # (transformers brings pydantic into the test environment; not every one)
        ValidationError, title = ConfigError, ""
    with pytest.raises(ValidationError, match=title + "initial_scale_powr"):
        get_float16_config({"fp16": {"initial_scale_powr": 8}})
    with pytest.raises(ValidationError, match="enabled"):
        get_bfloat16_config({"bf16": {"enabled": "yes"}})
    with pytest.raises(ValidationError, match="Did you mean 'reduce_bucket_size'"):
        DeepSpeedZeroConfig(reduce_bucket_sise=1)
    with pytest.raises(ValidationError, match="pin_memory"):
        DeepSpeedZeroOffloadParamConfig(device="cpu", pin_memory="yes")
    import sys
    saved = sys.modules.get("pydantic_core")
    sys.modules["pydantic_core"] = None  # as without pydantic: zspeed's own error
    try:
        with pytest.raises(ConfigError, match="initial_scale_powr"):
            get_float16_config({"fp16": {"initial_scale_powr": 8}})
    finally:
        sys.modules["pydantic_core"] = saved
    with pytest.raises(AttributeError, match="read-only"):
        bf.enabled = False


def test_the_deepspeed_names_after_install():
    import zspeed.hf  # noqa: F811 - the submodule
    zspeed.hf.install()
    try:
        from deepspeed.runtime.config_utils import DeepSpeedConfigModel
        from deepspeed.runtime.fp16.loss_scaler import LossScaler as L
        from deepspeed.runtime.precision_config import get_bfloat16_config
        from deepspeed.runtime.zero.config import ZeroStageEnum as Z
        assert L is LossScaler and Z is ZeroStageEnum
        assert isinstance(get_bfloat16_config({"bf16": {"enabled": True}}), DeepSpeedConfigModel)
    finally:
        zspeed.hf.uninstall()


def test_engine_names_scripts_touch():
    cfg = eh.config(zero_optimization={"stage": 2})
    cfg["bf16"] = {"enabled": True}
    m = eh.mlp()
    e, *_ = zspeed.initialize(model=m, config=cfg)
    groups = e.optimizer.fp16_groups
    assert groups == e.optimizer.bit16_groups and [p for g in groups for p in g] == list(m.parameters())
    assert all(p.dtype == torch.bfloat16 for g in groups for p in g)
    assert e.sparse_tensor_module_names == set()
    # allreduce_gradients(): zspeed's backward reduced the gradients already, so a script that
    # turns DeepSpeed's enable_backward_allreduce off and calls it gets the same step.
    assert e.enable_backward_allreduce is True
    ref, *_ = zspeed.initialize(model=eh.mlp(), config=cfg)
    e3, *_ = zspeed.initialize(model=eh.mlp(), config=cfg)
    e3.enable_backward_allreduce = False
    for b in eh.regression_data(3):
        for eng, manual in ((ref, False), (e3, True)):
            eng.backward(eh.mse_loss(eng, b))
            if manual:
                eng.allreduce_gradients(bucket_size=5e8)
            eng.step()
    assert all(torch.equal(a, b) for a, b in zip(ref.module.parameters(), e3.module.parameters()))
    e3.close()
    with pytest.raises(zspeed.runtime.engine.EngineClosedError):
        e3.allreduce_gradients()
    # DeepSpeed's deprecated --deepscale_config flag name.
    args = argparse.Namespace(deepscale_config=cfg, local_rank=0)
    with pytest.warns(DeprecationWarning, match="deepscale_config is deprecated"):
        e2, *_ = zspeed.initialize(args=args, model=eh.mlp())
    assert e2.zero_optimization_stage() == 2
    with pytest.raises(ValueError, match="both deepscale_config"):
        zspeed.initialize(args=argparse.Namespace(deepscale_config=cfg, deepspeed_config=cfg), model=eh.mlp())
