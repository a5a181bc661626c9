"""Config parsing: batch derivation, defaults, and every error path."""
import json

import pytest

from zspeed.runtime.config import ConfigError, parse_config, schema_rows
from zspeed import ZSpeedError


def ok(cfg, **kw):
    return parse_config(cfg, world_size=kw.pop("world_size", 1))


def err(cfg, *needles, world_size=1):
    with pytest.raises(ConfigError) as ei:
        parse_config(cfg, world_size=world_size)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


# -- batch derivation (DeepSpeed's rule: tb = mb * gas * ws) -----------------------------------
@pytest.mark.parametrize("given,expect", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, (32, 4, 8)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 4}, (32, 8, 4)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8}, (32, 4, 8)),
    ({"train_batch_size": 16}, (16, 16, 1)),
    ({"train_micro_batch_size_per_gpu": 5}, (5, 5, 1)),
    ({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 4},
     (12, 3, 4)),
])
def test_batch_derivation(given, expect):
    c = ok(given)
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == expect


def test_batch_inconsistent_names_all_numbers():
    err({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2},
        "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size",
        "16 != 3 * 2 * 1")


def test_batch_missing_and_nonpositive():
    err({}, "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided")
    err({"gradient_accumulation_steps": 2}, "needs to be provided")
    err({"train_batch_size": 0}, "train_batch_size", "must be > 0")
    err({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 4}, "gradient_accumulation_steps: 0")


def test_world_size_enters_the_batch_rule(monkeypatch):
    c = ok({"train_batch_size": 8}, world_size=2)
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (8, 4, 1)
    err({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
        "8 != 4 * 2 * 2", world_size=2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert parse_config({"train_batch_size": 8}).train_micro_batch_size_per_gpu == 2
    monkeypatch.setenv("WORLD_SIZE", "x")
    with pytest.raises(ConfigError, match="not an integer"):
        parse_config({"train_batch_size": 8})


# -- unknown keys ----------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,needles", [
    ({"train_batch_sise": 4}, ["'train_batch_sise'", "top level", "'train_batch_size'"]),
    ({"train_batch_size": 4, "optimzer": {}}, ["'optimzer'", "'optimizer'"]),
    ({"train_batch_size": 4, "fp16": {"enable": True}}, ["'enable'", "section 'fp16'", "'enabled'"]),
    ({"train_batch_size": 4, "zero_optimization": {"stage": 2, "overlap_com": True}},
     ["'overlap_com'", "section 'zero_optimization'", "'overlap_comm'"]),
    ({"train_batch_size": 4, "zero_optimization": {"stage": 2, "offload_optimizer": {"devices": "cpu"}}},
     ["'devices'", "zero_optimization.offload_optimizer", "'device'"]),
    ({"train_batch_size": 4, "aio": {"queue_dept": 8}}, ["'queue_dept'", "section 'aio'", "'queue_depth'"]),
    ({"train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"learning_rate": 1}}},
     ["'learning_rate'", "optimizer.params"]),
    ({"train_batch_size": 4, "scheduler": {"type": "WarmupLR", "params": {"warmup_max": 1}}},
     ["'warmup_max'", "scheduler.params", "'warmup_max_lr'"]),
    ({"train_batch_size": 4, "checkpoint": {"tag_validaton": "Warn"}}, ["'tag_validation'"]),
    ({"Train_Batch_Size": 4}, ["'train_batch_size'"]),
    ({"train_batch_size": 4, "xyzzy": 1}, ["'xyzzy'", "Known keys here"]),
])
def test_unknown_keys(cfg, needles):
    err(cfg, *needles)


@pytest.mark.parametrize("key,where", [
    ("windows_specific", None), ("windows_io_optimization", None), ("linux_aio_tuning", None),
    ("platform", None), ("windows_specific", "aio"), ("windows_io_optimization", "zero_optimization"),
])
def test_platform_keys(key, where):
    cfg = {"train_batch_size": 4}
    if where:
        cfg[where] = {key: True}
    else:
        cfg[key] = {"enabled": True}
    err(cfg, f"'{key}'", "zspeed needs no platform-specific keys", f"Remove '{key}'")


def test_unsupported_deepspeed_sections():
    err({"train_batch_size": 4, "amp": {"enabled": True}}, "'amp'", "not supported by zspeed")
    err({"train_batch_size": 4, "flops_profiler": {"enabled": True}}, "flops_profiler", "\"enabled\": false")
    ok({"train_batch_size": 4, "flops_profiler": {"enabled": False}, "comms_logger": {"enabled": False}})
    err({"train_batch_size": 4, "pipeline": {}}, "'pipeline'", "not supported")


# -- types, choices, values --------------------------------------------------------------------
def test_type_and_value_errors():
    err({"train_batch_size": "8"}, "'train_batch_size'", "wrong type", "an integer")
    err({"train_batch_size": True}, "wrong type")
    err({"train_batch_size": 4, "gradient_clipping": -1}, "gradient_clipping", ">= 0")
    err({"train_batch_size": 4, "fp16": {"enabled": "yes"}}, "fp16.enabled", "true/false")
    err({"train_batch_size": 4, "fp16": {"enabled": 2}}, "fp16.enabled", "true/false")
    err({"train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}}, "two numbers")
    err({"train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.5]}}}, "[0, 1)")
    err({"train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"eps": 0}}}, "eps", "> 0")
    err({"train_batch_size": 4, "fp16": []}, "must be an object")
    err({"train_batch_size": 4, "zero_optimization": {"stage": 5}}, "Invalid zero_optimization.stage 5", "takes one of")
    err({"train_batch_size": 4, "checkpoint": {"tag_validation": "loud"}}, "'Warn'", "'Ignore'", "'Fail'")
    err({"train_batch_size": 4, "gradient_allreduce_op": "avg"}, "gradient_allreduce_op", "'mean'", "'sum'")


def test_boolean_keys_take_0_and_1_as_deepspeed_reads_them():
    """DeepSpeed reads 0 and 1 as false and true (its own tests write "zero_allow_untested_optimizer":
    1); other numbers and strings stay errors."""
    c = parse_config({"train_batch_size": 4, "zero_allow_untested_optimizer": 1, "fp16": {"enabled": 0}})
    assert c.top["zero_allow_untested_optimizer"] is True and c.fp16["enabled"] is False
    err({"train_batch_size": 4, "zero_allow_untested_optimizer": 1.0}, "zero_allow_untested_optimizer", "true/false")


def test_keys_deepspeed_reads_in_any_letter_case():
    """tag_validation (DeepSpeed upper-cases it) and gradient_allreduce_op (lower-cased): any
    case is accepted and stored as spelled in the docs."""
    for given, want in (("warn", "Warn"), ("FAIL", "Fail"), ("Ignore", "Ignore")):
        c = ok({"train_batch_size": 4, "checkpoint": {"tag_validation": given}})
        assert c.checkpoint["tag_validation"] == want
    for given, want in (("SUM", "sum"), ("Mean", "mean")):
        assert ok({"train_batch_size": 4, "gradient_allreduce_op": given}).top["gradient_allreduce_op"] == want
    assert ok({"train_batch_size": 4}).top["gradient_allreduce_op"] == "mean"
    err({"train_batch_size": 4, "gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}},
        'gradient_allreduce_op "sum" is not supported with ZeRO stage 3: it runs at stage 0, 1 or 2', 'Use "mean"')


def test_optimizer_and_scheduler_types():
    c = ok({"train_batch_size": 4, "optimizer": {"type": "adamw", "params": {"lr": 3e-4}}})
    assert c.optimizer_name == "AdamW" and c.optimizer_params["lr"] == 3e-4
    assert c.optimizer_params["betas"] == [0.9, 0.999] and c.optimizer_params["adam_w_mode"] is True
    c = ok({"train_batch_size": 4, "optimizer": {"type": "Lion"}})
    assert c.optimizer_params == {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.0, "torch_adam": False}
    err({"train_batch_size": 4, "optimizer": {"type": "Adamm"}}, "unknown optimizer type 'Adamm'", "'Adam'")
    err({"train_batch_size": 4, "optimizer": {"type": "OneBitAdam"}}, "does not implement")
    err({"train_batch_size": 4, "optimizer": {"params": {}}}, "needs a 'type'")
    # DeepSpeed's rule: the name AdamW means decoupled weight decay whatever adam_w_mode says.
    c = ok({"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"adam_w_mode": False}}})
    assert c.optimizer_params["adam_w_mode"] is True and "AdamW" in c.warnings[0]
    err({"train_batch_size": 4, "scheduler": {"type": "WarmupCosine"}}, "'WarmupCosineLR'")
    c = ok({"train_batch_size": 4, "scheduler": {"type": "LRRangeTest"}})  # DeepSpeed's fifth schedule
    assert c.scheduler_params["lr_range_test_step_size"] == 2000
    err({"train_batch_size": 4, "scheduler": {"type": "WarmupDecayLR", "params": {}}}, "total_num_steps")
    err({"train_batch_size": 4, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1}}},
        "cycle_max_lr")
    err({"train_batch_size": 4, "scheduler": {"params": {}}}, "needs a 'type'")
    c = ok({"train_batch_size": 4, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})
    assert c.scheduler_params["warmup_type"] == "log" and c.scheduler_params["warmup_max_lr"] is None


def test_zero_and_offload_rules():
    assert ok({"train_batch_size": 4, "zero_optimization": {"stage": 3}}).zero_stage == 3
    err({"train_batch_size": 4, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
        "offload_param.nvme_path is required", "directory")
    err({"train_batch_size": 4, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}},
        "nvme_path is required", "directory")
    err({"train_batch_size": 4, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}},
        "takes one of")
    err({"train_batch_size": 4, "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
        "stage 1, 2 or 3")
    err({"train_batch_size": 4, "zero_optimization": {"stage": 2, "offload_optimizer":
                                                      {"device": "cpu", "ratio": 1.5}}}, "ratio")
    err({"train_batch_size": 4, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
         "optimizer": {"type": "Adam", "params": {"amsgrad": True}}}, "amsgrad")
    c = ok({"train_batch_size": 4, "zero_optimization": {"stage": 2, "cpu_offload": True}})
    assert c.offloaded and c.offload["pin_memory"] is False and c.offload["buffer_count"] == 4
    c = ok({"train_batch_size": 4, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu",
                                                                                          "pin_memory": True}}})
    assert c.offloaded and c.zero_stage == 1 and c.offload["pin_memory"]


def test_precision_rules():
    err({"train_batch_size": 4, "fp16": {"enabled": True}, "bf16": {"enabled": True}}, "choose one")
    err({"train_batch_size": 4, "fp16": {"enabled": True, "fp16_master_weights_and_grads": True}},
        "not supported")
    err({"train_batch_size": 4, "fp16": {"auto_cast": True}}, "auto_cast needs")
    c = ok({"train_batch_size": 4, "fp16": {"enabled": True}})
    assert c.dynamic_loss_scale and c.fp16["initial_scale_power"] == 16 and c.fp16["hysteresis"] == 2
    assert c.fp16["loss_scale_window"] == 1000 and c.fp16["min_loss_scale"] == 1
    c = ok({"train_batch_size": 4, "bfloat16": {"enabled": True}})
    assert c.bf16_enabled
    err({"train_batch_size": 4, "bf16": {"enabled": True}, "bfloat16": {"enabled": True}}, "both")


def test_aio_and_checkpoint():
    c = ok({"train_batch_size": 4, "aio": {"thread_count": 3}})
    assert c.aio["intra_op_parallelism"] == 3 and "thread_count" not in c.aio
    assert c.aio["block_size"] == 1048576 and c.aio["queue_depth"] == 8 and c.aio["overlap_events"]
    err({"train_batch_size": 4, "aio": {"use_gds": True}}, "GPUDirect")
    err({"train_batch_size": 4, "checkpoint": {"load_universal": True}}, "load_universal")


# -- HF "auto" ---------------------------------------------------------------------------------
def test_auto_values():
    c = ok({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto",
                                                                         "stage3_prefetch_bucket_size": "auto"}})
    assert (c.train_batch_size, c.gradient_accumulation_steps) == (4, 1)
    assert c.zero["reduce_bucket_size"] == 500000000
    assert "train_batch_size" in c.auto_keys
    err({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}, "needs to be provided",
        "\"auto\"")
    err({"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}},
        "'optimizer.params.lr' is \"auto\"", "Hugging Face")
    err({"train_batch_size": 4, "gradient_clipping": "auto"}, "'gradient_clipping' is \"auto\"")
    err({"train_batch_size": 4, "fp16": {"enabled": "auto"}}, "'fp16.enabled' is \"auto\"")
    err({"train_batch_size": 4, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}},
        "warmup_num_steps")


# -- sources ----------------------------------------------------------------------------------
def test_json_path_and_args(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"train_batch_size": 8, "gradient_accumulation_steps": 2}))
    assert parse_config(str(p), world_size=1).train_micro_batch_size_per_gpu == 4

    class Args:
        deepspeed_config = str(p)
    assert parse_config(None, args=Args(), world_size=1).train_batch_size == 8
    with pytest.raises(ConfigError, match="given twice"):
        parse_config({"train_batch_size": 8}, args=Args(), world_size=1)
    with pytest.raises(ConfigError, match="no DeepSpeed config"):
        parse_config(None, world_size=1)
    with pytest.raises(ConfigError, match="cannot read"):
        parse_config(str(tmp_path / "missing.json"), world_size=1)
    (tmp_path / "bad.json").write_text("{\"train_batch_size\": 8,")
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_config(str(tmp_path / "bad.json"), world_size=1)
    with pytest.raises(ConfigError, match="must be a dict"):
        parse_config(42, world_size=1)
    assert issubclass(ConfigError, ZSpeedError)


def test_schema_documents_every_key():
    rows = schema_rows()
    paths = {r[0] for r in rows}
    for p in ("train_batch_size", "fp16.loss_scale_window", "zero_optimization.offload_optimizer.pin_memory",
              "aio.intra_op_parallelism", "WarmupCosineLR.params.cos_min_ratio", "adam.params.betas"):
        assert p in paths
    assert all(r[3] for r in rows), "every key has a meaning"
    d = ok({"train_batch_size": 4, "optimizer": {"type": "Adam"}}).to_dict()
    json.dumps(d)
    assert d["optimizer"]["params"]["lr"] == 1e-3


def test_config_doc_is_current():
    """docs/CONFIG.md is generated from the schema; it must not drift."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, str(root / "scripts" / "gen_config_doc.py"), "--check"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


# -- strict input: duplicates, non-finite and absurd values, unreadable files ------------------
def test_duplicate_keys_in_a_json_file_are_refused(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text('{"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "lr": 1e-5}}}')
    with pytest.raises(ConfigError) as ei:
        parse_config(str(p), world_size=1)
    assert "'lr' appears twice" in str(ei.value) and "0.1" in str(ei.value) and str(p) in str(ei.value)


@pytest.mark.parametrize("const", ["Infinity", "-Infinity", "NaN"])
def test_json_infinity_and_nan_are_refused(tmp_path, const):
    p = tmp_path / "ds.json"
    p.write_text('{"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": %s}}}' % const)
    with pytest.raises(ConfigError) as ei:
        parse_config(str(p), world_size=1)
    assert const in str(ei.value) and "finite number" in str(ei.value)


def test_binary_and_deeply_nested_files_are_config_errors(tmp_path):
    p = tmp_path / "ds.bin"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        parse_config(str(p), world_size=1)
    p.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_config(str(p), world_size=1)
    deep: dict = {}
    cur = deep
    for _ in range(100000):
        cur["a"] = {}
        cur = cur["a"]
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_config({"train_batch_size": 4, "x": deep}, world_size=1)


def _opt(**params):
    return {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": params}}


@pytest.mark.parametrize("cfg,needle", [
    (_opt(lr=float("inf")), "optimizer.params.lr"),
    (_opt(lr=float("nan")), "not a finite number"),
    (_opt(lr=1e308), "between 0 and 1000"),
    (_opt(weight_decay=float("inf")), "optimizer.params.weight_decay"),
    (_opt(weight_decay=1e9), "between 0 and 1000"),
    (_opt(eps=0.0), "optimizer.params.eps"),
    ({"train_batch_size": 4, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": float("nan")}}},
     "warmup_max_lr"),
    ({"train_batch_size": 4, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": -1e-3}}},
     "warmup_max_lr"),
    ({"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": float("inf")}}, "fp16.loss_scale"),
    ({"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": 1e-300}}, "2^-24"),
    ({"train_batch_size": 4, "fp16": {"enabled": True, "initial_scale_power": 5000}}, "between 0 and 64"),
    ({"train_batch_size": 4, "fp16": {"enabled": True, "min_loss_scale": 0.0}}, "min_loss_scale"),
    ({"train_batch_size": 4, "zero_optimization": {"reduce_bucket_size": float("nan")}}, "reduce_bucket_size"),
    ({"train_batch_size": 4, "zero_optimization": {"sub_group_size": float("inf")}}, "sub_group_size"),
    ({"train_batch_size": 4, "zero_optimization": {"reduce_bucket_size": 0}}, "reduce_bucket_size"),
    ({"train_batch_size": 4, "seed": 2 ** 70}, "64-bit"),
    ({"train_batch_size": 4, "gradient_clipping": float("inf")}, "gradient_clipping"),
    ({"train_batch_size": 4, "steps_per_print": float("nan")}, "steps_per_print"),
    ({"train_batch_size": 4, "steps_per_print": 2.5}, "whole number"),
])
def test_non_finite_and_absurd_values_are_refused(cfg, needle):
    err(cfg, needle)


def test_steps_per_print_infinity_means_never():
    """HF accelerate writes steps_per_print: inf to silence DeepSpeed's progress log."""
    assert ok({"train_batch_size": 4, "steps_per_print": float("inf")}).top["steps_per_print"] == float("inf")
    assert ok({"train_batch_size": 4, "steps_per_print": 0}).top["steps_per_print"] == 0


def test_bad_world_size_env_is_a_config_error(monkeypatch):
    from zspeed.runtime.config import world_size_from_env
    for bad in ("0", "-2"):
        monkeypatch.setenv("WORLD_SIZE", bad)
        with pytest.raises(ConfigError, match="must be >= 1"):
            world_size_from_env()


def test_any_offload_needs_a_zero_stage(tmp_path):
    err({"train_batch_size": 4, "zero_optimization": {"stage": 0, "offload_optimizer":
                                                      {"device": "nvme", "nvme_path": str(tmp_path)}}},
        "'nvme' needs", "stage 1, 2 or 3")


def test_stage3_keys_in_a_stage2_config_warn():
    with pytest.warns(RuntimeWarning, match="stage3_max_live_parameters is used only by ZeRO stage 3; this "
                                            "config runs stage 2"):
        ok({"train_batch_size": 4, "zero_optimization": {"stage": 2, "stage3_max_live_parameters": 1e7,
                                                         "stage3_prefetch_bucket_size": "auto"}})
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok({"train_batch_size": 4, "zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": "auto"}})
    # offload_param below stage 3: DeepSpeed ignores it; zspeed warns and runs without it
    with pytest.warns(RuntimeWarning, match="offload_param is used only by ZeRO stage 3.*offload_param \\(device 'nvme'\\) has no effect"):
        c = ok({"train_batch_size": 4, "zero_optimization": {"stage": 1, "offload_param": {"device": "nvme"}}})
    assert c.offload_param["device"] == "none"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok({"train_batch_size": 4, "zero_optimization": {"stage": 2, "offload_param": {"device": "none"}}})


def test_elastic_checkpoint_at_stage3_logs_deprecation(caplog):
    """DeepSpeed logs that ZeRO-3 elastic checkpointing is deprecated (its zero config's validator);
    zspeed logs it once through its logger: at initialize (from the config's warnings), from
    DeepSpeedZeroConfig and from DeepSpeedConfig (which builds one); silent below stage 3 and with
    the key off."""
    import logging
    import torch
    import zspeed
    from zspeed.runtime.ds_config import DeepSpeedConfig
    from zspeed.runtime.zero.config import DeepSpeedZeroConfig

    def logged(make):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="zspeed"):
            make()
        return [r.getMessage() for r in caplog.records if "elastic checkpointing is deprecated" in r.getMessage()]

    cfg = {"train_batch_size": 4, "zero_optimization": {"stage": 3, "elastic_checkpoint": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    assert logged(lambda: ok(cfg)) == [] and any("no effect in zspeed" in w for w in ok(cfg).warnings)
    msgs = logged(lambda: zspeed.initialize(model=torch.nn.Linear(3, 2), config=cfg))
    assert len(msgs) == 1 and "no effect in zspeed" in msgs[0]
    assert len(logged(lambda: DeepSpeedConfig(cfg))) == 1
    assert len(logged(lambda: DeepSpeedZeroConfig(stage=3, elastic_checkpoint=True))) == 1
    assert logged(lambda: DeepSpeedZeroConfig(stage=2, elastic_checkpoint=True)) == []
    assert logged(lambda: ok({"train_batch_size": 4, "zero_optimization": {"stage": 3}})) == []
    assert not ok({"train_batch_size": 4, "zero_optimization": {"stage": 1, "elastic_checkpoint": True}}).warnings


def test_activation_checkpointing_section():
    c = ok({"train_batch_size": 4, "activation_checkpointing": {"partition_activations": True,
                                                                 "cpu_checkpointing": True}})
    assert c.activation_checkpointing["cpu_checkpointing"] is True
    err({"train_batch_size": 4, "activation_checkpointing": {"cpu_checkpoint": True}}, "cpu_checkpointing")


# -- ranges the NVMe swapper and the aio engine enforce, checked at parse time ----------------------
@pytest.mark.parametrize("section,key,value,needle", [
    ("offload_optimizer", "buffer_count", 65, "must be between 1 and 64"),  # the C swapper's maximum
    ("offload_optimizer", "buffer_count", 0, "must be between 1 and 64"),
    ("offload_param", "buffer_count", 0, "must be >= 1"),
    ("aio", "block_size", 2 ** 31, "must be between 1 and 1073741824"),
    ("aio", "queue_depth", 5000, "must be between 1 and 4096"),
    ("aio", "intra_op_parallelism", 300, "must be between 1 and 256"),
    ("aio", "thread_count", 0, "must be between 1 and 256"),  # the older name, copied unchecked before
])
def test_nvme_buffer_count_and_aio_ranges(tmp_path, section, key, value, needle):
    cfg = {"train_batch_size": 4, "zero_optimization": {"stage": 3}}
    if section == "aio":
        cfg["aio"] = {key: value}
        path = f"aio.{key}"
    else:
        cfg["zero_optimization"][section] = {"device": "nvme", "nvme_path": str(tmp_path), key: value}
        path = f"zero_optimization.{section}.{key}"
    err(cfg, f"'{path}' = {value}", needle)
    for good in (1, 3):
        if section == "aio":
            cfg["aio"] = {key: good}
        else:
            cfg["zero_optimization"][section][key] = good
        ok(cfg)


# -- integers longer than Python converts (sys.get_int_max_str_digits) --------------------------------
def test_an_integer_of_thousands_of_digits_is_a_config_error_naming_the_key(tmp_path):
    huge = "9" * 5000
    p = tmp_path / "ds.json"
    p.write_text('{"train_batch_size": 4, "zero_optimization": {"stage": 2, "reduce_bucket_size": %s}}' % huge)
    with pytest.raises(ConfigError) as ei:
        parse_config(str(p), world_size=1)
    msg = str(ei.value)
    assert "zero_optimization.reduce_bucket_size" in msg and "5000 digits" in msg and str(p) in msg, msg
    p.write_text('// hjson\n{train_batch_size: 4, optimizer: {type: "Adam", params: {betas: [%s, 0.9]}}}' % huge)
    pytest.importorskip("hjson")
    with pytest.raises(ConfigError, match=r"optimizer\.params\.betas\[0\]"):
        parse_config(str(p), world_size=1)
    # A dict built in Python holds the integer itself; its error message cannot print it either.
    err({"train_batch_size": 4, "seed": 10 ** 5000}, "'seed'", "digits")


def test_a_section_given_as_true_says_what_to_write():
    err({"train_batch_size": 4, "bf16": True}, "config section 'bf16' must be an object", "got true",
        'Write "bf16": {"enabled": true}.')
    err({"train_batch_size": 4, "fp16": [1]}, "got list", "with the keys of section 'fp16'")


@pytest.mark.parametrize("section,key", [("optimizer", "torch_adam"), ("optimizer", "lr"),
                                         ("scheduler", "warmup_num_steps")])
def test_a_parameter_beside_type_says_to_move_it_into_params(section, key):
    """DeepSpeed reads optimizer/scheduler parameters only inside "params" (one beside "type" is
    ignored there, so the run would silently use the default): refused, naming the fix."""
    sec = {"type": "Adam" if section == "optimizer" else "WarmupLR", key: 3, "params": {}}
    with pytest.raises(ConfigError, match=f"'{key}' in section '{section}' is a parameter.*"
                                          f"only inside {section}.params.*Move it into"):
        parse_config({"train_batch_size": 1, section: sec}, world_size=1)


def test_every_optimizer_of_the_table_is_a_config_type_with_a_kernel_and_a_checkpoint_layout():
    """zspeed._optimizers is the one list of optimizers: each row is a type a config may name (any
    letter case), has a params schema (documented in docs/CONFIG.md), a kernel the NVMe swapper
    runs, and the state keys the checkpoint loader checks, under both its class names."""
    from zspeed._optimizers import ALGORITHMS, checkpoint_classes, listed
    rows = {path for path, *_ in schema_rows()}
    classes = checkpoint_classes()
    for name, a in ALGORITHMS.items():
        c = parse_config({"train_batch_size": 1, "optimizer": {"type": name.upper(), "params": {}}})
        assert c.optimizer_name == name and c.optimizer_params["lr"] > 0
        assert f"{name.lower()}.params.lr" in rows
        assert classes[a.cpu_class][0] == classes[a.device_class][0] == a.states and a.states
        assert name in listed()
    try:
        from zspeed.ops.swap import OPTIMIZERS
    except ImportError:
        pytest.skip("libzspeed not available: the swapper's kernels cannot be listed")
    assert {a.kernel for a in ALGORITHMS.values()} <= set(OPTIMIZERS)
    import re
    with pytest.raises(ConfigError, match=re.escape(f"zspeed supports {listed()}")):
        parse_config({"train_batch_size": 1, "optimizer": {"type": "Adamax"}})
