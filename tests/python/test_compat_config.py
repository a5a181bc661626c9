"""Config keys DeepSpeed implements: each is supported, or refused as a named DeepSpeed
feature with what to use instead (never as an unknown key); hjson config files."""
import json

import pytest

from zspeed.runtime.config import ConfigError, parse_config

BASE = {"train_batch_size": 4}


def ok(extra):
    return parse_config({**BASE, **extra}, world_size=1)


def refused(extra, *needles):
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, **extra}, world_size=1)
    text = str(info.value)
    assert "unknown config key" not in text and "Did you mean" not in text, text
    for n in needles:
        assert n in text, (n, text)
    return text


def test_zenflow_is_accepted_with_a_warning_and_checked():
    zf = {"topk_ratio": 0.1, "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": True}
    c = ok({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "zenflow": zf}})
    assert c.zenflow["update_interval"] == 4 and any("ZenFlow" in w for w in c.warnings)
    with pytest.raises(ConfigError, match="topk_ratio"):  # its keys are still checked
        ok({"zero_optimization": {"stage": 2, "zenflow": {"topk_ratoi": 0.1}}})


def test_super_offload_and_cpuadam_cores_perc():
    c = ok({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "super_offload": True,
                                                                    "cpuadam_cores_perc": 0.5}}})
    assert c.offload["cpuadam_cores_perc"] == 0.5 and any("SuperOffload" in w for w in c.warnings)
    with pytest.raises(ConfigError, match="cpuadam_cores_perc"):
        ok({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "cpuadam_cores_perc": 1.5}}})


def test_bf16_keys():
    c = ok({"bf16": {"enabled": True, "bf16_master_weights_and_grads": False, "bf16_optimizer_states": False}})
    assert c.bf16["check_grad_overflow"] is True  # DeepSpeed's default since 0.19.3
    refused({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}, "bf16_master_weights_and_grads",
            "DeepSpeed feature", "state_dtype")
    refused({"bf16": {"enabled": True, "bf16_optimizer_states": True}}, "bf16_optimizer_states", "state_dtype")


def test_amp_torch_autocast_and_data_types():
    ok({"amp": {"enabled": False}, "torch_autocast": {"enabled": False, "dtype": "torch.bfloat16"}})
    refused({"amp": {"enabled": True, "opt_level": "O1"}}, "amp", "fp16")
    refused({"torch_autocast": {"enabled": True}}, "torch_autocast", "bf16")
    c = ok({"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bf16"}})
    assert c.data_types["grad_accum_dtype"] == "bf16"
    # ZeRO 1-3 and one micro-batch: no effect; accumulating: refused (zspeed accumulates in bf16)
    ok({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}})
    refused({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
             "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}}, "grad_accum_dtype",
            "'bf16'")
    refused({"data_types": {"param_dtype": "bf16"}}, "param_dtype", "fp32")


def test_adamw_with_adam_w_mode_false_is_adamw():
    c = ok({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": False, "torch_adam": True}}})
    assert c.optimizer_params["adam_w_mode"] is True and c.optimizer_params["torch_adam"] is True
    assert "decoupled" in c.warnings[0]


def test_steps_per_print_infinity_as_accelerate_writes_it():
    assert ok({"steps_per_print": float("inf")}).top["steps_per_print"] == float("inf")


def test_hjson_config_file(tmp_path):
    hjson = pytest.importorskip("hjson", reason="hjson is not installed (requirements-dev.txt has it)")
    del hjson
    p = tmp_path / "ds.hjson"
    p.write_text("{\n  // DeepSpeed reads its config files as hjson\n  train_batch_size: 8\n"
                 "  optimizer: {\n    type: AdamW\n    params: {lr: 1e-3,}\n  }\n}\n")
    c = parse_config(str(p), world_size=1)
    assert c.train_batch_size == 8 and c.optimizer_name == "AdamW" and c.optimizer_params["lr"] == 1e-3
    p.write_text("{train_batch_size: 8, train_batch_size: 4}")
    with pytest.raises(ConfigError, match="appears twice"):
        parse_config(str(p), world_size=1)
    p.write_text("{train_batch_size: 8, gradient_clipping: NaN}")
    with pytest.raises(ConfigError):
        parse_config(str(p), world_size=1)
    p.write_text(json.dumps(BASE))  # plain JSON still reads strictly as JSON
    assert parse_config(str(p), world_size=1).train_batch_size == 4


def test_zero3_keys_by_their_deepspeed_field_names():
    """DeepSpeed's DeepSpeedZeroConfig accepts each stage3_* key by its field name too
    (param_persistence_threshold, ...); so does zspeed, and the two spellings at once are refused."""
    names = {"param_persistence_threshold": 7, "prefetch_bucket_size": 11, "max_live_parameters": 13,
             "max_reuse_distance": 17, "gather_16bit_weights_on_model_save": True}
    c = ok({"zero_optimization": {"stage": 3, **names}})
    for k, v in names.items():
        assert c.zero["stage3_" + k] == v, k
    refused({"zero_optimization": {"stage": 3, "param_persistence_threshold": 1,
                                   "stage3_param_persistence_threshold": 2}},
            "both 'stage3_param_persistence_threshold'", "keep one")
    with pytest.raises(ConfigError, match="unknown config key 'persistence_threshold'"):
        ok({"zero_optimization": {"stage": 3, "persistence_threshold": 1}})  # invented names stay refused
    from zspeed.runtime.zero.config import DeepSpeedZeroConfig
    assert DeepSpeedZeroConfig(stage=3, param_persistence_threshold=5).param_persistence_threshold == 5


def test_deepspeed_config_class(tmp_path):
    """deepspeed.runtime.config.DeepSpeedConfig: a dict, a JSON path or base64 JSON, validated by
    zspeed's schema, with DeepSpeed's attribute names; batch sizes that do not add up are an
    AssertionError (DeepSpeed asserts), other mistakes a ConfigError naming the key."""
    import base64
    import json
    from zspeed.runtime.config import ConfigError, DeepSpeedConfig
    c = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "gradient_allreduce_op": "SUM",
         "zero_optimization": {"stage": 2, "stage3_gather_fp16_weights_on_model_save": True}}
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(c))
    for given in (c, str(p), p, base64.urlsafe_b64encode(json.dumps(c).encode()).decode()):
        d = DeepSpeedConfig(given)
        assert (d.train_batch_size, d.train_micro_batch_size_per_gpu, d.gradient_accumulation_steps) == (32, 8, 4)
        assert d.gradient_allreduce_op == "sum" and d.zero_optimization_stage == 2 and d.zero_enabled
        assert d.zero_config.gather_16bit_weights_on_model_save is True and d._param_dict == c
        assert not d.fp16_enabled and not d.bfloat16_enabled and d.gradient_clipping == 1.0
    d.train_batch_size, d.gradient_accumulation_steps = None, 2
    d._configure_train_batch_size()
    assert d.train_batch_size == 16
    d.train_batch_size, d.train_micro_batch_size_per_gpu, d.gradient_accumulation_steps = 33, 17, 2
    with pytest.raises(AssertionError, match="33 != 17"):
        d._configure_train_batch_size()
    with pytest.raises(AssertionError, match="needs to be provided"):
        DeepSpeedConfig({"gradient_accumulation_steps": 2})
    with pytest.raises(ConfigError, match="gradient_allreduce_op"):
        DeepSpeedConfig({"train_batch_size": 1, "gradient_allreduce_op": "max"})
    with pytest.raises(ConfigError, match="stage 3"):
        DeepSpeedConfig({"train_batch_size": 1, "gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}})
    with pytest.raises(ConfigError, match="no such file"):
        DeepSpeedConfig(str(tmp_path / "missing.json"))

    class MPU:
        def get_data_parallel_world_size(self):
            return 4
    d = DeepSpeedConfig({"train_batch_size": 32, "gradient_accumulation_steps": 2}, mpu=MPU())
    assert d.train_micro_batch_size_per_gpu == 4 and d.world_size == 4


def test_the_compile_section_and_what_sum_reduction_cannot_combine_with():
    """DeepSpeed's "compile" section (DeepCompile) is known: its settings are accepted without
    deepcompile; deepcompile true is refused by name. gradient_allreduce_op "sum" with ZenFlow or
    DeepCompile is DeepSpeed's ValueError, with its message."""
    from zspeed.runtime.config import ConfigError, parse_config
    base = {"train_batch_size": 1}
    c = parse_config({**base, "compile": {"deepcompile": False, "free_activation": True, "passes": []}}, world_size=1)
    assert c.compile["deepcompile"] is False and c.compile["double_buffer"] is True
    with pytest.raises(ConfigError, match="compile.deepcompile.*not implemented.*set deepcompile to false"):
        parse_config({**base, "compile": {"deepcompile": True}}, world_size=1)
    with pytest.raises(ConfigError, match="unknown config key 'deepcompil' in section 'compile'"):
        parse_config({**base, "compile": {"deepcompil": True}}, world_size=1)
    for extra, feature in [({"zero_optimization": {"stage": 2, "zenflow": {}}}, "ZenFlow"),
                           ({"zero_optimization": {"stage": 1}, "compile": {"deepcompile": True}}, "DeepCompile")]:
        with pytest.raises(ValueError, match=f"gradient_allreduce_op='sum' is not supported with {feature}"):
            parse_config({**base, "gradient_allreduce_op": "sum", **extra}, world_size=1)


@pytest.mark.parametrize("precision,gad,refused", [("fp16", "bf16", True), ("fp16", "fp32", True),
                                                   ("bf16", "fp32", True), ("fp32", "fp16", True),
                                                   ("fp16", "fp16", False), ("bf16", None, False)])
def test_stage0_takes_only_the_models_dtype_for_gradient_accumulation(precision, gad, refused):
    """DeepSpeed without ZeRO implements gradient accumulation in the model's dtype only and raises
    NotImplementedError for another mix; zspeed refuses the same (stages 1-3 take any, one
    micro-batch per step)."""
    c = {"train_batch_size": 1, "zero_optimization": {"stage": 0}, "data_types": {"grad_accum_dtype": gad}}
    if precision != "fp32":
        c[precision] = {"enabled": True}
    if refused:
        with pytest.raises(NotImplementedError, match="unsupported mix of model_dtype=.*grad_accum_dtype="):
            parse_config(c, world_size=1)
        with pytest.raises(ConfigError):  # (a ConfigError too, naming the fix)
            parse_config(c, world_size=1)
    else:
        parse_config(c, world_size=1)
    c["zero_optimization"]["stage"] = 2
    parse_config(c, world_size=1)


@pytest.mark.parametrize("key,bad", [("loss_scale_window", 0), ("loss_scale_window", -1), ("min_loss_scale", 0),
                                     ("min_loss_scale", -1)])
def test_dynamic_scale_keys_are_checked_only_where_dynamic_scaling_uses_them(key, bad):
    """DeepSpeed's rule: loss_scale_window and min_loss_scale must be positive under dynamic loss
    scaling (fp16 on, loss_scale 0); with a static scale or fp16 off they are unused and any value
    is kept. The same rule in the engine's parser and DeepSpeedFP16Config."""
    from zspeed.runtime.precision_config import DeepSpeedFP16Config
    with pytest.raises(ConfigError, match=f"fp16.{key}.*dynamic loss scaling"):
        parse_config({"train_batch_size": 1, "fp16": {"enabled": True, key: bad}}, world_size=1)
    with pytest.raises(ValueError, match=f"fp16.{key}"):  # (pydantic's ValidationError where installed)
        DeepSpeedFP16Config(enabled=True, loss_scale=0, **{key: bad})
    c = parse_config({"train_batch_size": 1, "fp16": {"enabled": True, "loss_scale": 128, key: bad}}, world_size=1)
    assert c.fp16[key] == bad and c.fp16["loss_scale"] == 128
    assert getattr(DeepSpeedFP16Config(enabled=False, **{key: bad}), key) == bad
    with pytest.raises(ValueError, match="wrong type"):
        DeepSpeedFP16Config(enabled=True, **{key: True})
