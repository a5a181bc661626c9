"""DeepSpeed's JSON config, parsed and validated in one place.

Every key zspeed understands is declared once in the tables of
:mod:`zspeed.runtime.config_schema`, with its default, its accepted types and what
it means in DeepSpeed. Parsing walks the user's dict against those tables: an unknown key is an error that names the
key, the section it is in and the closest known key (a silently ignored typo
is how a run trains for a day without the setting its author thought it had).
DeepSpeed keys that zspeed deliberately does not implement get their own
message, so users can tell "misspelled" from "not supported".

The batch sizes follow DeepSpeed's derivation and its consistency rule:
train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps
* world_size.
"""
from __future__ import annotations

import copy
import difflib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from .._native import ZSpeedError
from .errors import ConfigAssertionError, ConfigError, ConfigNotImplementedError
from .plan import Facts, check as check_combinations
from .._optimizers import listed
from .config_json import check_huge_ints, load_json_config
from .config_schema import (AUTO_DEFAULT, AUTO_DERIVE, AUTO_KEEP, DEFAULT_LEAF_MODULE_CLASSES, MONITORS, SCHEMA,  # noqa: F401
                            _DS_OPTIMIZERS_UNSUPPORTED, _DS_UNSUPPORTED_TOP, _DTYPE_NAMES, _OPTIMIZER_CANON,
                            _OPTIMIZER_PARAMS, _PLATFORM_RE, _SCALE_MAX, _SCALE_MIN, _SCHEDULER_PARAMS,
                            _SCHEDULERS_UNSUPPORTED, _STAGE3_ONLY, K, schema_rows)

__all__ = ["ConfigError", "ZSpeedConfig", "parse_config", "parse_precision", "load_json_config", "SCHEMA",
           "schema_rows", "world_size_from_env", "get_gradient_clipping", "get_log_level", "DeepSpeedConfig", "DEEPSPEED_OPTIMIZERS"]


def world_size_from_env() -> int:
    """World size as launchers (torchrun, deepspeed, mpirun) export it."""
    for var in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        v = os.environ.get(var)
        if v:
            try:
                ws = int(v)
            except ValueError:
                raise ConfigError(f"environment variable {var}={v!r} is not an integer world size") from None
            if ws < 1:
                raise ConfigError(f"environment variable {var}={v!r}: the world size must be >= 1 "
                                  f"(it counts the processes of the job); fix or unset it.")
            return ws
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except ImportError:  # zspeed.runtime needs torch, but config parsing does not
        pass
    return 1


def _where(section: str) -> str:
    return f"section '{section}'" if section else "the top level"


def _unknown_key(key: str, section: str, known: list[str]) -> ConfigError:
    where = _where(section)
    if _PLATFORM_RE.search(key):
        return ConfigError(
            f"unknown config key '{key}' in {where}: zspeed needs no platform-specific keys; the same "
            f"DeepSpeed config works on Linux, Windows and macOS (the I/O backend and SIMD kernels are "
            f"chosen at run time, see `zspeed report`). Remove '{key}'.")
    if not section and key in _DS_UNSUPPORTED_TOP:
        hint = _DS_UNSUPPORTED_TOP[key]
        return ConfigError(
            f"DeepSpeed's '{key}' section is not supported by zspeed"
            + (f" ({hint})" if hint else "") + f"; remove '{key}' from the config"
            + (" or set it to {\"enabled\": false}" if hint is None else "") + ".")
    if section in ("optimizer", "scheduler") and any(
            key in ps for ps in (_OPTIMIZER_PARAMS if section == "optimizer" else _SCHEDULER_PARAMS).values()):
        return ConfigError(f"config key '{key}' in section '{section}' is a parameter of the {section}: DeepSpeed "
                           f"reads it only inside {section}.params (beside \"type\" it has no effect there). "
                           f"Move it into \"params\".")
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not close:  # catch case-only and separator differences ("Train_Batch_Size", "train-batch-size")
        norm = {k.lower().replace("-", "_"): k for k in known}
        hit = norm.get(key.lower().replace("-", "_"))
        close = [hit] if hit else []
    fix = f" Did you mean '{close[0]}'?" if close else f" Known keys here: {', '.join(sorted(known))}."
    return ConfigError(f"unknown config key '{key}' in {where}.{fix}")


def _type_name(types: tuple) -> str:
    names = {int: "an integer", float: "a number", bool: "true/false", str: "a string",
             dict: "an object", list: "a list", tuple: "a list", type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _check_value(path: str, spec: K, value: Any) -> Any:
    """Type-check one value, returning it normalized (ints accepted as floats)."""
    ok = False
    if bool in spec.types and type(value) is int and value in (0, 1):
        value = bool(value)  # DeepSpeed reads 0 and 1 as false and true (its configs and tests write them)
    for t in spec.types:
        if t is int and isinstance(value, bool):
            continue
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            ok = True
            break
        if isinstance(value, t):
            ok = True
            break
    if not ok:
        numeric = set(spec.types) <= {int, float}  # (DeepSpeed's words for these: "must be a number")
        raise ConfigError(f"config key '{path}' = {value!r} has the wrong type: "
                          + ("it must be a number, " if numeric else "") + f"expected "
                          f"{_type_name(spec.types)} (default {spec.default!r}).")
    if isinstance(value, float) and not math.isfinite(value) and not (spec.allow_inf and value > 0):
        raise ConfigError(f"config key '{path}' = {value!r} is not a finite number; give a number "
                          f"(default {spec.default!r}).")
    if spec.fold_case and isinstance(value, str):
        value = next((c for c in spec.choices if c.lower() == value.lower()), value)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"Invalid {path} {value!r}: the config key takes one of "
                          f"{', '.join(repr(c) for c in spec.choices)}.")
    if spec.check is not None and value is not None:
        err = spec.check(value)
        if err:
            raise ConfigError(f"config key '{path}' = {value!r} {err}.")
    if isinstance(value, tuple):
        value = list(value)
    return value


def _resolve_auto(path: str, spec: K, value: Any) -> tuple[Any, bool]:
    """Returns (value, was_auto). "auto" is HF's placeholder for a value it fills in."""
    if not (isinstance(value, str) and value == "auto"):
        return value, False
    if spec.auto == AUTO_DEFAULT:
        return spec.default, True
    if spec.auto == AUTO_DERIVE:
        return None, True
    if spec.auto == AUTO_KEEP:
        return value, True
    raise ConfigError(
        f"config key '{path}' is \"auto\": Hugging Face's Trainer fills \"auto\" values from its "
        f"training arguments before the config reaches DeepSpeed, and zspeed was given the config "
        f"directly, so it cannot know the value. Write the value (default {spec.default!r}) into "
        f"the config, or pass it through the HF Trainer integration.")


# DeepSpeed's DeepSpeedZeroConfig field names of keys written with a "stage3_" prefix in JSON: its
# pydantic model accepts both spellings (populate_by_name), so zspeed does too.
_ZERO_FIELD_NAMES = {k: "stage3_" + k for k in (
    "prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters", "max_reuse_distance",
    "gather_16bit_weights_on_model_save", "module_granularity_threshold", "model_persistence_threshold",
    "use_all_reduce_for_fetch_params", "allgather_sequential")}


def _zero_spelled(given):
    """zero_optimization with DeepSpeed's field names written as their "stage3_" keys; a key given
    in both spellings is refused."""
    if not isinstance(given, dict):
        return given
    out = {}
    for k, v in given.items():
        key = _ZERO_FIELD_NAMES.get(k, k)
        if key in out:
            raise ConfigError(f"zero_optimization has both '{key}' and its other name "
                              f"'{key[len('stage3_'):]}': keep one.")
        out[key] = v
    return out


def _parse_section(section: str, given: dict, keys: dict, autos: set, extra_known=()) -> dict:
    if not isinstance(given, dict):
        if isinstance(given, bool) and "enabled" in keys:  # "bf16": true, meaning {"enabled": true}
            fix = f' Write "{section}": {{"enabled": {json.dumps(given)}}}.'
        else:
            fix = f" Write it as {{\"key\": value, ...}} with the keys of {_where(section)} (docs/CONFIG.md)."
        got = json.dumps(given) if isinstance(given, bool) else type(given).__name__
        raise ConfigError(f"config {_where(section)} must be an object (a dict), got {got}.{fix}")
    out = {k: copy.deepcopy(v.default) for k, v in keys.items()}
    for key, value in given.items():
        if key not in keys:
            raise _unknown_key(key, section, list(keys) + list(extra_known))
        path = f"{section}.{key}" if section else key
        spec = keys[key]
        value, was_auto = _resolve_auto(path, spec, value)
        if was_auto:
            autos.add(path)
        if value is None and type(None) not in spec.types and was_auto:
            out[key] = None
            continue
        out[key] = _check_value(path, spec, value)
    rule = _SECTION_RULES.get(section)
    if rule is not None:
        rule(out)
    return out


def _dynamic_scale_rule(fp16: dict) -> None:
    """loss_scale_window and min_loss_scale matter only to dynamic loss scaling (fp16 enabled with
    loss_scale 0): there they must be positive (and min_loss_scale a usable scale); otherwise any
    value is kept, as DeepSpeed's validator does."""
    if not fp16["enabled"] or fp16["loss_scale"] != 0:
        return
    window, floor = fp16["loss_scale_window"], fp16["min_loss_scale"]
    if window is not None and window <= 0:
        raise ConfigError(f"config key 'fp16.loss_scale_window' = {window!r} must be > 0 with dynamic loss "
                          f"scaling (fp16.loss_scale 0; default 1000).")
    if floor is not None and not _SCALE_MIN <= floor <= _SCALE_MAX:
        raise ConfigError(f"config key 'fp16.min_loss_scale' = {floor!r} must be between {_SCALE_MIN:g} and "
                          f"{_SCALE_MAX:g} with dynamic loss scaling (fp16.loss_scale 0; default 1).")


# section -> a rule between its keys, applied whenever the section is read (also by the
# DeepSpeed-named config classes and zero.Init)
_SECTION_RULES = {"fp16": _dynamic_scale_rule}


def _derive_batch(tb, mb, gas, ws: int, autos: set) -> tuple[int, int, int]:
    """DeepSpeed's batch derivation; returns (train_batch, micro_batch, grad_acc). Its errors are
    AssertionErrors too (DeepSpeed asserts these rules)."""
    if tb is not None and mb is not None and gas is not None:
        pass
    elif tb is not None and mb is not None:
        gas = tb // mb // ws
    elif tb is not None and gas is not None:
        mb = tb // ws // gas
    elif mb is not None and gas is not None:
        tb = mb * gas * ws
    elif tb is not None:
        gas = 1
        mb = tb // ws
    elif mb is not None:
        tb = mb * ws
        gas = 1
    else:
        extra = (" (\"auto\" values can only be derived from the other batch keys)"
                 if autos & {"train_batch_size", "train_micro_batch_size_per_gpu"} else "")
        raise ConfigAssertionError("Either train_batch_size or train_micro_batch_size_per_gpu needs to be "
                          f"provided{extra}.")
    for name, v in (("train_batch_size", tb), ("train_micro_batch_size_per_gpu", mb),
                    ("gradient_accumulation_steps", gas)):
        if v <= 0:
            raise ConfigAssertionError(f"{name}: {v} has to be greater than 0 (derived from "
                              f"train_batch_size={tb}, train_micro_batch_size_per_gpu={mb}, "
                              f"gradient_accumulation_steps={gas}, world_size={ws}).")
    if tb != mb * gas * ws:
        raise ConfigAssertionError(
            "Check batch related parameters. train_batch_size is not equal to "
            "micro_batch_per_gpu * gradient_acc_step * world_size "
            f"{tb} != {mb} * {gas} * {ws}. Set two of the three keys and let the third be derived.")
    return tb, mb, gas


def _parse_typed_params(kind: str, name: str, params: dict, table: dict, autos: set) -> dict:
    section = f"{kind}.params"
    return _parse_section(section, params, table, autos)


def _bf16_spelling(cfg: dict) -> dict:
    """``bfloat16`` is DeepSpeed's older name of the bf16 section."""
    if "bfloat16" in cfg:
        if "bf16" in cfg:
            raise ConfigError("the config has both 'bf16' and 'bfloat16' (an older spelling of "
                              "the same section); keep only 'bf16'.")
        cfg["bf16"] = cfg.pop("bfloat16")
    return cfg


def _model_dtype(fp16: dict, bf16: dict) -> str:
    """"fp16", "bf16" or "fp32" from the parsed fp16 and bf16 sections."""
    if fp16["enabled"] and bf16["enabled"]:
        raise ConfigError("fp16.enabled and bf16.enabled are both true; choose one precision.")
    return "fp16" if fp16["enabled"] else "bf16" if bf16["enabled"] else "fp32"


def parse_precision(config: Any) -> str:
    """"fp16", "bf16" or "fp32": the model's dtype from a config's fp16 and bf16 sections, which is
    all that ``zero.Init`` needs. A lenient entry point of the same parser: a path is read as
    parse_config reads it (UTF-8, JSON or hjson, no duplicate keys), both sections are checked key
    by key with the same messages, and nothing else is required (a config given to zero.Init may
    lack the batch sizes; zspeed.initialize checks the whole config later)."""
    if isinstance(config, ZSpeedConfig):
        return _model_dtype(config.fp16, config.bf16)
    if isinstance(config, (str, os.PathLike)):
        config = load_json_config(Path(config))
    if not isinstance(config, dict):
        raise ConfigError(f"a DeepSpeed config must be a dict or a path to a JSON file, "
                          f"got {type(config).__name__}.")
    check_huge_ints(config)
    cfg = _bf16_spelling(dict(config))
    autos: set = set()
    fp16, bf16 = (_parse_section(name, {} if cfg.get(name) is None else cfg[name], SCHEMA[name].keys, autos)
                  for name in ("fp16", "bf16"))
    return _model_dtype(fp16, bf16)


def check_param_dtype(param_dtype: str | None, model: str) -> None:
    """data_types.param_dtype, when set, must name ``model`` ("fp16", "bf16" or "fp32": the dtype
    the fp16/bf16 sections train in); DeepSpeed asserts it, so this raises ConfigAssertionError
    (also an AssertionError). The config's validation and the engine's DeepSpeed-named helper
    both call it."""
    if param_dtype is not None and _DTYPE_NAMES.get(str(param_dtype).lower()) != model:
        raise ConfigAssertionError(f"data_types.param_dtype = {param_dtype!r} does not match the model's dtype "
                                   f"({model}, from the fp16/bf16 sections); remove it or make them agree.")


def _no_rule(gad: str, model: str) -> None:
    """At ZeRO stages 1-3 DeepSpeed's optimizers take any gradient accumulation dtype."""


def _same_dtype_without_zero(gad: str, model: str) -> None:
    """Without ZeRO (stage 0) DeepSpeed implements only the model's dtype for accumulation."""
    torch_names = {"fp16": "torch.float16", "bf16": "torch.bfloat16", "fp32": "torch.float32"}
    raise ConfigNotImplementedError(
        f"unsupported mix of model_dtype={torch_names[model]} and grad_accum_dtype="
        f"{torch_names[_DTYPE_NAMES[gad.lower()]]}: without ZeRO (stage 0) gradients accumulate in the model's "
        f"dtype, as in DeepSpeed (NotImplementedError there too); set data_types.grad_accum_dtype to {model!r} or "
        f"remove it.")


# zero_optimization.stage -> DeepSpeed's rule for a grad_accum_dtype other than the model's
_MIXED_ACCUM_RULES = {0: _same_dtype_without_zero}


# offload_optimizer.device -> why optimizer.params.torch_adam has no effect there
_TORCH_ADAM_IGNORED = {"nvme": "optimizer.params.torch_adam has no effect with offload_optimizer.device \"nvme\": the "
                               "NVMe swapper steps every partition with zspeed's own kernels (the same algorithm, "
                               "computed in fp32, not torch's implementation, which DeepSpeed runs there)."}


# Stages whose allgather_bucket_size must be even: DeepSpeed's stage 1-2 optimizer asserts it.
_EVEN_ALLGATHER = {1: True, 2: True}


class _Setting:
    """A read-only attribute of ZSpeedConfig: ``section[key]`` of the parsed config (``top`` for
    the top level), converted by ``conv``."""

    def __init__(self, section: str, key: str, conv=None):
        self.section, self.key, self.conv = section, key, conv

    def __get__(self, config, owner=None):
        if config is None:
            return self
        v = getattr(config, self.section)[self.key]
        return v if self.conv is None else self.conv(v)


class ZSpeedConfig:
    """A validated DeepSpeed config with every default filled in.

    Attributes mirror DeepSpeed's names: train_batch_size,
    train_micro_batch_size_per_gpu, gradient_accumulation_steps,
    gradient_clipping, zero_stage, optimizer_name (canonical, or None),
    optimizer_params (dict), scheduler_name, scheduler_params, fp16_enabled,
    bf16_enabled, fp16 (dict), bf16 (dict), offload_device, offload (dict),
    aio (dict), checkpoint (dict), top (dict of the remaining top-level keys),
    auto_keys (paths that were "auto"), raw (a deep copy of the input).
    """

    def __init__(self, config: dict, world_size: int | None = None):
        if not isinstance(config, dict):
            raise ConfigError(f"a DeepSpeed config must be a dict or a path to a JSON file, "
                              f"got {type(config).__name__}.")
        self.raw = copy.deepcopy(config)
        self.cpu_cores_share: float | None = None  # the CPU optimizer's share of the cores (super_offload's)
        # Things DeepSpeed accepts that zspeed runs differently; the engine logs them once.
        self.warnings: list[str] = []
        ws = world_size_from_env() if world_size is None else world_size
        self.world_size = ws
        check_huge_ints(config)
        autos: set[str] = set()
        cfg = _bf16_spelling(dict(config))
        sections = {k: cfg.pop(k) for k in list(cfg) if k in SCHEMA and k}
        if isinstance(sections.get("amp"), dict):
            # The rest of the amp section is Apex's own arguments, which only matter when it is on.
            sections["amp"] = {k: v for k, v in sections["amp"].items() if k == "enabled"}
        for key, val in list(cfg.items()):  # disabled monitoring sections are harmless
            if key in _DS_UNSUPPORTED_TOP and _DS_UNSUPPORTED_TOP[key] is None and \
                    isinstance(val, dict) and not val.get("enabled", False):
                cfg.pop(key)
        self.top = _parse_section("", cfg, SCHEMA[""].keys, autos,
                                  extra_known=[k for k in SCHEMA if k and "." not in k])

        def sec(name):
            given = sections.get(name, {})
            return _parse_section(name, {} if given is None else given, SCHEMA[name].keys, autos)

        self.fp16 = sec("fp16")
        self.bf16 = sec("bf16")
        self.aio = sec("aio")
        self.checkpoint = sec("checkpoint")
        self.activation_checkpointing = sec("activation_checkpointing")
        self.compile = sec("compile")
        self.monitor = {name: sec(name) for name in MONITORS}
        thr = sec("timers").pop("throughput") or {}
        self.throughput_timer = _parse_section("timers.throughput", thr, SCHEMA["timers.throughput"].keys, autos)
        self.data_types = sec("data_types")
        self.torch_autocast = sec("torch_autocast")
        self.amp = sec("amp")
        sections["zero_optimization"] = _zero_spelled(sections.get("zero_optimization") or {})
        self.zero = sec("zero_optimization")
        zf = self.zero.pop("zenflow")
        self.zenflow = None if zf is None else _parse_section("zero_optimization.zenflow", zf,
                                                              SCHEMA["zero_optimization.zenflow"].keys, autos)
        off = self.zero.pop("offload_optimizer") or {}
        self.offload = _parse_section("zero_optimization.offload_optimizer", off,
                                      SCHEMA["zero_optimization.offload_optimizer"].keys, autos)
        offp = self.zero.pop("offload_param") or {}
        self.offload_param = _parse_section("zero_optimization.offload_param", offp,
                                            SCHEMA["zero_optimization.offload_param"].keys, autos)
        self.leaf_module = parse_leaf_module(self.zero.pop("leaf_module"), autos)
        self.auto_keys = autos
        self._parse_optimizer(sections.get("optimizer"), autos)
        self._parse_scheduler(sections.get("scheduler"), autos)
        self._validate_features()
        self.train_batch_size, self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps = \
            _derive_batch(self.top["train_batch_size"], self.top["train_micro_batch_size_per_gpu"],
                          self.top["gradient_accumulation_steps"], ws, autos)
        self._validate_grad_accum()

    # -- sections with per-type params ------------------------------------------------
    def _parse_optimizer(self, given, autos):
        self.optimizer_name = None
        self.optimizer_params: dict = {}
        if given is None:
            return
        o = _parse_section("optimizer", given, SCHEMA["optimizer"].keys, autos)
        t = o["type"]
        if t is None:
            raise ConfigError(f"the 'optimizer' section needs a 'type' ({listed('or')}).")
        low = t.lower()
        if low not in _OPTIMIZER_PARAMS:
            if low in _DS_OPTIMIZERS_UNSUPPORTED:
                raise ConfigError(f"optimizer type '{t}' is a DeepSpeed optimizer that zspeed does not "
                                  f"implement; use {listed('or')}, or pass your own "
                                  f"torch optimizer to zspeed.initialize(optimizer=...).")
            close = difflib.get_close_matches(low, list(_OPTIMIZER_PARAMS), n=1, cutoff=0.6)
            hint = f" Did you mean '{_OPTIMIZER_CANON[close[0]]}'?" if close else ""
            raise ConfigError(f"unknown optimizer type '{t}' in section 'optimizer'; zspeed supports "
                              f"{listed()}.{hint}")
        self.optimizer_name = _OPTIMIZER_CANON[low]
        self.optimizer_params = _parse_typed_params("optimizer", self.optimizer_name, o["params"],
                                                    _OPTIMIZER_PARAMS[low], autos)
        if self.optimizer_name == "AdamW":
            if "adam_w_mode" in o["params"] and not o["params"]["adam_w_mode"]:
                # DeepSpeed's rule: the name AdamW always means decoupled weight decay.
                self.warnings.append("optimizer type AdamW with adam_w_mode false: AdamW (decoupled weight "
                                     "decay) is used, as in DeepSpeed; for L2-regularized Adam use type Adam "
                                     "with adam_w_mode false.")
            self.optimizer_params["adam_w_mode"] = True

    def _parse_scheduler(self, given, autos):
        self.scheduler_name = None
        self.scheduler_params: dict = {}
        if given is None:
            return
        s = _parse_section("scheduler", given, SCHEMA["scheduler"].keys, autos)
        t = s["type"]
        if t is None:
            raise ConfigError("the 'scheduler' section needs a 'type' (WarmupLR, WarmupDecayLR, "
                              "WarmupCosineLR or OneCycle).")
        if t not in _SCHEDULER_PARAMS:
            if t in _SCHEDULERS_UNSUPPORTED:
                raise ConfigError(f"scheduler '{t}' is not supported by zspeed; use WarmupLR, "
                                  f"WarmupDecayLR, WarmupCosineLR or OneCycle, or pass your own "
                                  f"lr_scheduler to zspeed.initialize.")
            close = difflib.get_close_matches(t, list(_SCHEDULER_PARAMS), n=1, cutoff=0.6)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown scheduler type '{t}' in section 'scheduler'; zspeed supports "
                              f"{', '.join(_SCHEDULER_PARAMS)}.{hint}")
        self.scheduler_name = t
        p = _parse_typed_params("scheduler", t, s["params"], _SCHEDULER_PARAMS[t], autos)
        for req in [k for k, v in _SCHEDULER_PARAMS[t].items() if v.default is None and
                    type(None) not in v.types]:
            if p.get(req) is None:
                raise ConfigError(f"scheduler {t} needs 'scheduler.params.{req}' "
                                  f"({_SCHEDULER_PARAMS[t][req].meaning}).")
        self.scheduler_params = p

    # -- cross-key rules ----------------------------------------------------------------
    def _warn_stage3_keys(self) -> None:
        """Keys only ZeRO stage 3 reads, set in a config of another stage, change nothing: say so
        (guides copy them into stage-2 configs). "auto" and default values stay silent."""
        given = self.raw.get("zero_optimization") or {}
        stage = self.zero["stage"]
        if stage == 3 or not isinstance(given, dict):
            return
        at_rest = {"offload_param": self.offload_param["device"] == "none"}  # given, but asking for nothing
        for key in sorted(k for k in given if k.startswith("stage3_") or k in _STAGE3_ONLY):
            spec = SCHEMA["zero_optimization"].keys.get(key)
            if spec is None or given[key] == "auto" or given[key] == spec.default or at_rest.get(key):
                continue
            what = _STAGE3_ONLY.get(key, "it has no effect").format(device=self.offload_param["device"])
            warnings.warn(f"zero_optimization.{key} is used only by ZeRO stage 3; this config runs stage {stage}, "
                          f"so {what}.", RuntimeWarning, stacklevel=4)
        self.offload_param["device"] = "none"  # DeepSpeed ignores it below stage 3 (accelerate writes it there)

    def _validate_features(self):
        self._warn_stage3_keys()
        self.warnings.extend(deprecated_zero_keys(self.zero))
        _model_dtype(self.fp16, self.bf16)
        if self.bf16["bf16_master_weights_and_grads"]:
            raise ConfigError("bf16.bf16_master_weights_and_grads (bf16 master weights and gradients) is a "
                              "DeepSpeed feature zspeed does not have: its masters are fp32. To save optimizer "
                              "memory instead, offload it (zero_optimization.offload_optimizer.device cpu or "
                              "nvme) and/or set optimizer.params.state_dtype to \"bf16\" or \"int8\"; remove "
                              "the key or set it to false.")
        if self.bf16["bf16_optimizer_states"]:
            raise ConfigError("bf16.bf16_optimizer_states is only valid with bf16_master_weights_and_grads in "
                              "DeepSpeed, which zspeed does not have; zspeed's way to bf16 Adam states is "
                              "optimizer.params.state_dtype \"bf16\". Remove the key or set it to false.")
        if self.amp["enabled"]:
            raise ConfigError("DeepSpeed's 'amp' section (NVIDIA Apex AMP) is not supported by zspeed; use "
                              "\"fp16\" or \"bf16\" instead, or set amp.enabled to false.")
        if self.torch_autocast["enabled"]:
            raise ConfigError("torch_autocast (torch.autocast around an fp32 model) is a DeepSpeed feature "
                              "zspeed does not have; use \"bf16\": {\"enabled\": true} (or fp16), which runs "
                              "the model in that dtype with fp32 master weights, or set torch_autocast.enabled "
                              "to false.")
        agb = self.zero["allgather_bucket_size"]
        even = _EVEN_ALLGATHER.get(self.zero_stage, False)
        if even and float(agb) % 2 != 0:
            raise ConfigAssertionError(
                f"allgather_bucket_size must be a multiple of nccl_start_alignment_factor (2 at ZeRO stages 1-2, "
                f"DeepSpeed's rule: it aligns its all-gather buffers to 4 bytes of fp16 elements); "
                f"zero_optimization.allgather_bucket_size is {agb!r}: use an even count such as "
                f"{2 * -(-int(float(agb)) // 2)}, or remove the key.")
        check_param_dtype(self.data_types["param_dtype"], _model_dtype(self.fp16, self.bf16))
        self._grad_accum = self.data_types["grad_accum_dtype"]
        summed = self.top["gradient_allreduce_op"] == "sum"
        for feature, asked in (("ZenFlow", self.zenflow is not None), ("DeepCompile", self.compile["deepcompile"])):
            if summed and asked:  # DeepSpeed's checks, its messages
                raise ConfigError(f"gradient_allreduce_op='sum' is not supported with {feature}; use \"mean\" (the "
                                  f"default).")
        if self.compile["deepcompile"]:
            raise ConfigError("compile.deepcompile: DeepSpeed's DeepCompile (compiler-driven ZeRO) is not implemented "
                              "by zspeed; remove the compile section or set deepcompile to false (zspeed's ZeRO "
                              "runs without it).")
        ignored = _TORCH_ADAM_IGNORED.get(self.offload["device"])
        if ignored and self.optimizer_params.get("torch_adam"):
            self.warnings.append(ignored)
        if self.zenflow is not None:
            self.warnings.append("zero_optimization.zenflow: DeepSpeed's ZenFlow (selective gradient updates "
                                 "with an overlapped CPU step) is not implemented by zspeed; training runs as "
                                 "ordinary ZeRO-Offload, which applies every gradient on every step.")
        if self.offload["super_offload"]:
            self.warnings.append("zero_optimization.offload_optimizer.super_offload: DeepSpeed's SuperOffload "
                                 "(a ZeRO-3 feature for superchips) is not implemented by zspeed; the optimizer "
                                 "is offloaded as usual, its CPU step using cpuadam_cores_perc of the cores.")
            self.cpu_cores_share = float(self.offload["cpuadam_cores_perc"])
        if self.fp16["fp16_master_weights_and_grads"]:
            raise ConfigError("fp16.fp16_master_weights_and_grads is not supported by zspeed (master "
                              "weights are always fp32); remove the key or set it to false.")
        if self.zero["cpu_offload"]:  # DeepSpeed's deprecated boolean
            if self.offload["device"] not in ("none", "cpu"):
                raise ConfigError("zero_optimization.cpu_offload=true conflicts with "
                                  f"offload_optimizer.device={self.offload['device']!r}; keep only one.")
            self.offload["device"] = "cpu"
        # Which settings combine (offload under ZeRO, parameter offload at stage 3, the CPU
        # step's modes): the run plan's table (plan.py), the rows the config alone decides.
        check_combinations(Facts.from_config(self, world_size=self.world_size))
        if self.offload_param["device"] == "nvme":
            self._validate_nvme_path(self.offload_param, "zero_optimization.offload_param", "parameter")
        if self.offload["device"] == "nvme":
            self._validate_nvme_path(self.offload, "zero_optimization.offload_optimizer", "swap")
        if self.aio["use_gds"]:
            raise ConfigError("aio.use_gds (GPUDirect Storage) is not supported by zspeed; remove it.")
        if self.aio["thread_count"] is not None:
            self.aio["intra_op_parallelism"] = self.aio.pop("thread_count")
        else:
            self.aio.pop("thread_count")
        if self.checkpoint["load_universal"]:
            raise ConfigError("checkpoint.load_universal is not supported: zspeed checkpoints are "
                              "safetensors files; remove the key.")
        if self.fp16["auto_cast"] and not self.fp16["enabled"]:
            raise ConfigError("fp16.auto_cast needs fp16.enabled true.")

    def _validate_grad_accum(self):
        """data_types.grad_accum_dtype: zspeed accumulates gradients in the model's dtype; another
        dtype is refused unless nothing accumulates (one micro-batch per optimizer step)."""
        gad = self._grad_accum
        model = _model_dtype(self.fp16, self.bf16)
        if gad is None or _DTYPE_NAMES[gad.lower()] == model:
            return
        _MIXED_ACCUM_RULES.get(self.zero_stage, _no_rule)(gad, model)  # DeepSpeed's refusals by stage
        if self.gradient_accumulation_steps == 1:
            return
        raise ConfigError(f"data_types.grad_accum_dtype = {gad!r}: zspeed accumulates gradients between "
                          f"accumulation boundaries in the model's dtype ({model}); with "
                          f"gradient_accumulation_steps {self.gradient_accumulation_steps} set it to "
                          f"{model!r} or remove it (with one micro-batch per step it has no effect).")

    def _validate_nvme_path(self, section: dict, name: str, what: str):
        """device 'nvme' needs an existing, writable directory for the swap files."""
        path = section["nvme_path"]
        key = f"{name}.nvme_path"
        if not path:
            raise ConfigError(f"{key} is required with {name.split('.')[-1]}.device 'nvme': set it to a directory "
                              f"on a fast local disk (e.g. \"/local_nvme\") where zspeed may write its {what} files.")
        if not os.path.isdir(path):
            raise ConfigError(f"{key} = {path!r} is not an existing directory; create it (mkdir -p) or point "
                              f"it at a directory on a local NVMe disk.")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{key} = {path!r} is not writable by this process; fix its permissions or "
                              f"choose another directory.")

    # -- convenience ----------------------------------------------------------------------
    zero_stage = _Setting("zero", "stage")
    offload_device = _Setting("offload", "device")

    @property
    def offloaded(self) -> bool:
        """Optimizer state off the device: in CPU memory (cpu) or streamed from NVMe (nvme)."""
        return self.offload["device"] in ("cpu", "nvme")

    fp16_enabled = _Setting("fp16", "enabled")
    bf16_enabled = _Setting("bf16", "enabled")

    @property
    def gradient_clipping(self) -> float:
        return float(self.top["gradient_clipping"])

    log_level = _Setting("top", "log_level")

    # The settings the engine and its parts read, typed here so that nothing outside config.py
    # and plan.py indexes a section (tests/python/test_structure.py checks it).
    seed = _Setting("top", "seed", lambda v: None if v is None else int(v))
    steps_per_print = _Setting("top", "steps_per_print")
    wall_clock_breakdown = _Setting("top", "wall_clock_breakdown", bool)
    dataloader_drop_last = _Setting("top", "dataloader_drop_last", bool)
    dump_state = _Setting("top", "dump_state", bool)
    trace = _Setting("top", "zspeed_trace")  # where the Chrome trace goes (None: no trace)
    allow_untested_optimizer = _Setting("top", "zero_allow_untested_optimizer", bool)
    force_ds_cpu_optimizer = _Setting("top", "zero_force_ds_cpu_optimizer", bool)
    sub_group_size = _Setting("zero", "sub_group_size", int)
    sanity_checks = _Setting("zero", "enable_sanity_checks", bool)
    auto_cast = _Setting("fp16", "auto_cast", bool)  # fp16 models cast floating-point inputs to fp16
    nvme_path = _Setting("offload", "nvme_path")
    nvme_buffer_count = _Setting("offload", "buffer_count", int)

    @property
    def skips_nonfinite(self) -> bool:
        """Whether a step with a non-finite gradient is skipped: always with fp16 (its loss
        scaler), with bf16 when bf16.check_grad_overflow asks."""
        return self.fp16_enabled or bool(self.bf16["check_grad_overflow"])

    @property
    def torch_adam(self) -> bool:
        """optimizer.params.torch_adam: torch's Adam/AdamW instead of zspeed's or DeepSpeed's kernel."""
        return bool((self.optimizer_params or {}).get("torch_adam", False))

    # DeepSpeed's DeepSpeedConfig attributes for the data_types section (the strings as written,
    # None when unset).
    param_dtype = _Setting("data_types", "param_dtype")
    buffer_dtype = _Setting("data_types", "buffer_dtype")
    grad_accum_dtype = _Setting("data_types", "grad_accum_dtype")
    keep_in_fp32_modules = _Setting("data_types", "keep_in_fp32_modules")

    @property
    def gather_16bit_weights_on_model_save(self) -> bool:
        """zero_optimization.stage3_gather_16bit_weights_on_model_save, or its older fp16 spelling
        (DeepSpeed's alias of the same field)."""
        z = self.zero
        return bool(z["stage3_gather_16bit_weights_on_model_save"] or z["stage3_gather_fp16_weights_on_model_save"])

    @property
    def dynamic_loss_scale(self) -> bool:
        return self.fp16_enabled and float(self.fp16["loss_scale"]) == 0.0

    def to_dict(self) -> dict:
        """The effective config (defaults filled in), JSON-serializable."""
        out = dict(self.top)
        out.update(train_batch_size=self.train_batch_size,
                   train_micro_batch_size_per_gpu=self.train_micro_batch_size_per_gpu,
                   gradient_accumulation_steps=self.gradient_accumulation_steps,
                   fp16=dict(self.fp16), bf16=dict(self.bf16), aio=dict(self.aio),
                   checkpoint=dict(self.checkpoint))
        z = dict(self.zero)
        z["offload_optimizer"] = dict(self.offload)
        z["leaf_module"] = {k: list(v) for k, v in self.leaf_module.items()}
        out["zero_optimization"] = z
        if self.optimizer_name:
            out["optimizer"] = {"type": self.optimizer_name, "params": dict(self.optimizer_params)}
        if self.scheduler_name:
            out["scheduler"] = {"type": self.scheduler_name, "params": dict(self.scheduler_params)}
        return out


def parse_leaf_module(section, autos: set) -> dict:
    """zero_optimization.leaf_module: each of classes, names and name_suffixes a list of strings
    (a string alone is a list of one, duplicates dropped, as DeepSpeed's)."""
    out = _parse_section("zero_optimization.leaf_module", {} if section is None else section,
                         SCHEMA["zero_optimization.leaf_module"].keys, autos)
    return {k: list(dict.fromkeys([v] if isinstance(v, str) else v)) for k, v in out.items()}


# zero_optimization keys DeepSpeed logs as deprecated at a stage: {stage: {key: the warning}}
_DEPRECATED_AT_STAGE = {3: {
    "elastic_checkpoint": "zero_optimization.elastic_checkpoint: ZeRO-3 elastic checkpointing is deprecated (as in "
                          "DeepSpeed, which points to universal checkpointing); it has no effect in zspeed, whose "
                          "checkpoints load on any number of ranks at every stage. Remove the key."}}


def deprecated_zero_keys(zero: dict) -> list:
    """The deprecation warnings DeepSpeed gives a parsed zero_optimization section (ZeRO-3 elastic
    checkpointing), each saying what the key does in zspeed: a whole config adds them to its
    warnings (the engine logs them once, on rank 0); DeepSpeedZeroConfig logs them, as DeepSpeed's
    zero config validator does."""
    return [text for key, text in _DEPRECATED_AT_STAGE.get(zero["stage"], {}).items() if zero[key]]


def parse_zero_section(section: dict) -> tuple[dict, dict, dict]:
    """(zero_optimization, its offload_optimizer, its offload_param), each key checked and
    defaulted by the schema alone, without the rules between keys and sections that a whole
    config's parse applies (the deprecated cpu_offload is left as given; runtime/zero/config.py's
    DeepSpeedZeroConfig reads a section so)."""
    if not isinstance(section, dict):
        raise ConfigError(f"zero_optimization must be an object, got {type(section).__name__}.")
    autos: set = set()
    zero = _parse_section("zero_optimization", _zero_spelled(section), SCHEMA["zero_optimization"].keys, autos)
    zf = zero.pop("zenflow", None)
    zero["zenflow"] = None if zf is None else _parse_section("zero_optimization.zenflow", zf,
                                                             SCHEMA["zero_optimization.zenflow"].keys, autos)
    zero["leaf_module"] = parse_leaf_module(zero.pop("leaf_module"), autos)
    off = _parse_section("zero_optimization.offload_optimizer", zero.pop("offload_optimizer") or {},
                         SCHEMA["zero_optimization.offload_optimizer"].keys, autos)
    offp = _parse_section("zero_optimization.offload_param", zero.pop("offload_param") or {},
                          SCHEMA["zero_optimization.offload_param"].keys, autos)
    return zero, off, offp


def parse_config(config: Any = None, args: Any = None, world_size: int | None = None) -> ZSpeedConfig:
    """Accepts a dict, a JSON path, or ``args.deepspeed_config`` / ``args.deepspeed_config_dict``.

    DeepSpeed refuses a config given both ways; so does zspeed."""
    from_args = None
    if args is not None:
        from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepspeed_config_dict", None)
        old = getattr(args, "deepscale_config", None)  # DeepSpeed's deprecated name of the flag
        if old is not None:
            if from_args is not None:
                raise ConfigError("args has both deepscale_config (the deprecated name) and deepspeed_config; "
                                  "keep only --deepspeed_config.")
            warnings.warn("args.deepscale_config is deprecated (as in DeepSpeed); use --deepspeed_config.",
                          DeprecationWarning, stacklevel=3)
            from_args = old
    if config is not None and from_args is not None:
        raise ConfigError("the DeepSpeed config was given twice (config= and args.deepspeed_config); "
                          "pass only one.")
    config = config if config is not None else from_args
    if config is None:
        raise ConfigError("no DeepSpeed config: pass config=<dict or JSON path> to zspeed.initialize, "
                          "or set args.deepspeed_config.")
    if isinstance(config, ZSpeedConfig):
        return config
    if isinstance(config, (str, os.PathLike)):
        config = load_json_config(Path(config))
    try:
        return ZSpeedConfig(config, world_size=world_size)
    except RecursionError:
        raise ConfigError("the DeepSpeed config is nested too deeply to be a config; check how it "
                          "was generated.") from None


# DeepSpeed's names of the optimizer types a config may give ("type", any letter case), and of
# the getter scripts call on a raw config dict. Only Adam, AdamW, Adagrad and Lion run in
# zspeed; the others are refused by name when a config asks for them.
ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LION_OPTIMIZER = "adagrad", "adam", "adamw", "lion"
LAMB_OPTIMIZER, ONEBIT_ADAM_OPTIMIZER, ZERO_ONE_ADAM_OPTIMIZER = "lamb", "onebitadam", "zerooneadam"
ONEBIT_LAMB_OPTIMIZER, MUADAM_OPTIMIZER, MUADAMW_OPTIMIZER = "onebitlamb", "muadam", "muadamw"
MUSGD_OPTIMIZER, MUON_OPTIMIZER = "musgd", "muon"
DEEPSPEED_OPTIMIZERS = [ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER, ONEBIT_ADAM_OPTIMIZER,
                        ONEBIT_LAMB_OPTIMIZER, ZERO_ONE_ADAM_OPTIMIZER, MUADAM_OPTIMIZER, MUADAMW_OPTIMIZER,
                        MUSGD_OPTIMIZER, LION_OPTIMIZER, MUON_OPTIMIZER]
TORCH_ADAM_PARAM = "torch_adam"
ADAM_W_MODE = "adam_w_mode"
ADAM_W_MODE_DEFAULT = True


def get_log_level(param_dict: dict) -> str | None:
    """DeepSpeed's getter: the config dict's ``log_level``, or None (the logger keeps its level)."""
    return param_dict.get("log_level", SCHEMA[""].keys["log_level"].default)


def get_gradient_clipping(param_dict: dict) -> float:
    """DeepSpeed's getter: the config dict's ``gradient_clipping``, or the default (1.0)."""
    return param_dict.get("gradient_clipping", SCHEMA[""].keys["gradient_clipping"].default)


def __getattr__(name):
    """``DeepSpeedConfig`` where DeepSpeed has it; the class lives in ds_config.py, which builds on
    this module and on zero/config.py (itself built on this one), so it is imported on first use."""
    if name == "DeepSpeedConfig":
        import importlib
        return importlib.import_module(f"{__package__}.ds_config").DeepSpeedConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
