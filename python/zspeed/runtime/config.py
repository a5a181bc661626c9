"""DeepSpeed's JSON config, parsed and validated in one place.

Every key zspeed understands is declared once in the tables below, with its
default, its accepted types and what it means in DeepSpeed. Parsing walks the
user's dict against those tables: an unknown key is an error that names the
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
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .._native import ZSpeedError
from .errors import ConfigAssertionError, ConfigError, ConfigNotImplementedError
from .plan import Facts, check as check_combinations

__all__ = ["ConfigError", "ZSpeedConfig", "parse_config", "parse_precision", "load_json_config", "SCHEMA",
           "schema_rows", "world_size_from_env", "get_gradient_clipping", "get_log_level", "DeepSpeedConfig", "DEEPSPEED_OPTIMIZERS"]


# "auto" handling, per key (HF accelerate/Trainer writes "auto" and fills it in
# before DeepSpeed sees the config; zspeed may receive it unfilled).
AUTO_REFUSE = "refuse"    # the value depends on the caller's training arguments
AUTO_DEFAULT = "default"  # the key has no effect on one rank: use the default
AUTO_DERIVE = "derive"    # batch sizes: derived from the other batch keys
AUTO_KEEP = "keep"        # "auto" is a value of its own, resolved when the engine starts


@dataclass
class K:
    """One config key: default, accepted types, DeepSpeed meaning."""
    default: Any
    types: tuple
    meaning: str
    choices: tuple | None = None
    auto: str = AUTO_REFUSE
    check: Callable[[Any], str | None] | None = None  # returns an error or None
    allow_inf: bool = False  # +infinity is a meaningful value ("never") for this key
    fold_case: bool = False  # a choice in any letter case, stored as spelled in ``choices`` (DeepSpeed folds it)


@dataclass
class S:
    """A config section (a nested dict)."""
    keys: dict
    meaning: str
    open_params: bool = False  # "params" dicts are checked per optimizer/scheduler type
    extra: dict = field(default_factory=dict)


NUM = (int, float)
_pos = lambda v: None if v > 0 else "must be > 0"          # noqa: E731
_nonneg = lambda v: None if v >= 0 else "must be >= 0"     # noqa: E731


def _folder_name(v) -> str | None:
    """A monitor's job_name: one folder name inside output_path (zspeed is stricter than DeepSpeed,
    which joins any text: "../.." or an absolute path would write outside output_path)."""
    import os
    bad = (not v or v in (".", "..") or "/" in v or "\\" in v or "\x00" in v or os.path.isabs(v)
           or (len(v) >= 2 and v[1] == ":"))
    return ("must be one folder name inside output_path (no '/', '\\', '..', drive or absolute path; "
            "zspeed refuses what would write outside output_path)") if bad else None


def _ds_default(default, feature: str):
    """A check accepting only DeepSpeed's default of a key that asks for a feature zspeed lacks."""
    return lambda v: None if v == default else (
        f"asks for {feature}, which zspeed does not implement; remove the key or set it to {json.dumps(default)} "
        f"(DeepSpeed's default)")


def _strings(v):
    if isinstance(v, str) or all(isinstance(x, str) for x in v):
        return None
    return "must be a string or a list of strings"


# DeepSpeed's default ZeRO-3 leaf classes (zero_optimization.leaf_module.classes).
DEFAULT_LEAF_MODULE_CLASSES = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)


def _keep_fp32_setting(v):
    if v == "auto" or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        return None
    return "must be \"auto\" or a list of name patterns (strings)"


def _offload_ratio(v):
    # DeepSpeed's field allows 0 to 1 (ge=0.0, le=1.0); 0: the GPU steps every parameter.
    if v == "auto" or (not isinstance(v, str) and 0 <= v <= 1):
        return None
    return "must be a number from 0 to 1 (the CPU's share; 0: the GPU steps all) or \"auto\""


def _elements(v):
    """A count of elements: a whole number from 0 to 2^62 (as DeepSpeed's int fields, 1e9 is one)."""
    if float(v).is_integer() and 0 <= v <= 2 ** 62:
        return None
    return "must be a whole number of elements from 0 to 2^62 (e.g. 1e9)"


def _between(lo, hi, why: str = ""):
    """A check for lo <= v <= hi; ``why`` says what a value outside means."""
    def check(v):
        if lo <= v <= hi:
            return None
        return f"must be between {lo:g} and {hi:g}" + (f" ({why})" if why else "")
    return check


# Bounds that catch typos and overflows, not taste: no optimizer trains with a
# learning rate or weight decay above 1000, and fp16 loss scales live between
# the smallest fp16 subnormal and 2^64 (beyond which 1/scale is not an fp32 number
# that unscales anything).
def _int_between(lo: int, hi: int, why: str = ""):
    """_between for counts and sizes, whose bounds print as whole numbers."""
    def check(v):
        if lo <= v <= hi:
            return None
        return f"must be between {lo} and {hi}" + (f" ({why})" if why else "")
    return check


# The ranges the native NVMe swapper (src/swap/swap.c) and aio engine (src/aio/aio.c) accept,
# checked here so that a bad value fails at parse time instead of when the engine builds them.
_SWAP_BUFFERS = _int_between(1, 64, "zspeed's NVMe optimizer swapper holds 1 to 64 page-locked buffers; 3 or "
                             "more overlap read, step and write")
_AIO_THREADS = _int_between(1, 256, "I/O threads per operation of the aio engine")


_lr = _between(0, 1e3, "a learning rate above 1000 is almost certainly a typo")
_wd = _between(0, 1e3, "a weight decay above 1000 is almost certainly a typo")
_eps = lambda v: None if 0 < v <= 1 else "must be > 0 and <= 1"   # noqa: E731
_ratio = _between(0, 1)
_count = _between(1, 2 ** 62, "a number of elements")
_SCALE_MIN, _SCALE_MAX = 2.0 ** -24, 2.0 ** 64
_DTYPE_NAMES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "fp16": "fp16", "float16": "fp16",
                "half": "fp16", "bf16": "bf16", "bfloat16": "bf16"}


def _steps_per_print(v):
    if v == math.inf or (v >= 0 and float(v).is_integer()):
        return None
    return "must be a whole number >= 0 (0 or infinity: never print)"


def _betas(v):
    if len(v) != 2 or not all(isinstance(b, NUM) and not isinstance(b, bool) for b in v):
        return "must be a list of two numbers, e.g. [0.9, 0.999]"
    if not all(0.0 <= b < 1.0 for b in v):
        return "each beta must be in [0, 1)"
    return None


_ADAM = {
    "lr": K(1e-3, NUM, "learning rate", check=_lr),
    "betas": K([0.9, 0.999], (list, tuple), "coefficients of the running averages", check=_betas),
    "eps": K(1e-8, NUM, "term added to the denominator", check=_eps),
    "weight_decay": K(0.0, NUM, "weight decay (decoupled when adam_w_mode is true)", check=_wd),
    "amsgrad": K(False, (bool,), "AMSGrad variant (not supported when offloaded)"),
    "bias_correction": K(True, (bool,), "apply Adam's bias correction"),
    "adam_w_mode": K(True, (bool,), "decoupled weight decay (AdamW); DeepSpeed's default for Adam too"),
    "torch_adam": K(False, (bool,), "use torch.optim.Adam/AdamW instead of the native CPU optimizer"),
    "fused": K(None, (bool, type(None)), "torch's fused implementation (default: on GPU)"),
    "state_dtype": K("fp32", (str,), "zspeed extension: dtype of offloaded Adam moments",
                     choices=("fp32", "bf16", "int8")),
}
_OPTIMIZER_PARAMS = {
    "adam": _ADAM,
    "adamw": _ADAM,
    "adagrad": {
        "lr": K(1e-2, NUM, "learning rate", check=_lr),
        "lr_decay": K(0.0, NUM, "learning rate decay", check=_nonneg),
        "eps": K(1e-10, NUM, "term added to the denominator", check=_eps),
        "weight_decay": K(0.0, NUM, "L2 penalty", check=_wd),
        "initial_accumulator_value": K(0.0, NUM, "starting value of the sum of squares", check=_nonneg),
        "torch_adam": K(False, (bool,), "use torch.optim.Adagrad on the CPU instead of the native one"),
    },
    "lion": {
        "lr": K(1e-4, NUM, "learning rate", check=_lr),
        "betas": K([0.9, 0.99], (list, tuple), "interpolation / running-average coefficients", check=_betas),
        "weight_decay": K(0.0, NUM, "decoupled weight decay", check=_wd),
        "torch_adam": K(False, (bool,), "use zspeed's torch Lion on the CPU instead of the native one"),
    },
}
_OPTIMIZER_CANON = {"adam": "Adam", "adamw": "AdamW", "adagrad": "Adagrad", "lion": "Lion"}
_DS_OPTIMIZERS_UNSUPPORTED = ("onebitadam", "zerooneadam", "onebitlamb", "lamb", "muadam",
                              "muadamw", "musgd", "muon", "sgd")

_SCHEDULER_PARAMS = {
    "WarmupLR": {
        "warmup_min_lr": K(0.0, NUM, "learning rate at step 0", check=_lr),
        "warmup_max_lr": K(None, NUM + (type(None),), "learning rate after warmup (default: optimizer lr)",
                           check=_lr),
        "warmup_num_steps": K(1000, (int,), "steps of warmup (at least 2 are used)", check=_pos),
        "warmup_type": K("log", (str,), "warmup curve: log or linear (another name: log, with a warning)"),
        "last_batch_iteration": K(-1, (int,), "index of the last batch when resuming"),
    },
    "WarmupDecayLR": {
        "total_num_steps": K(None, (int,), "total training steps (required)", check=_pos),
        "warmup_min_lr": K(0.0, NUM, "learning rate at step 0", check=_lr),
        "warmup_max_lr": K(0.001, NUM, "learning rate after warmup", check=_lr),
        "warmup_num_steps": K(1000, (int,), "steps of warmup (at least 2 are used)", check=_pos),
        "warmup_type": K("log", (str,), "warmup curve: log or linear (another name: log, with a warning)"),
        "last_batch_iteration": K(-1, (int,), "index of the last batch when resuming"),
    },
    "WarmupCosineLR": {
        "total_num_steps": K(None, (int,), "total training steps (required)", check=_pos),
        "warmup_min_ratio": K(0.0, NUM, "start ratio of the optimizer lr", check=_ratio),
        "warmup_num_steps": K(1000, (int,), "steps of warmup (at least 2 are used)", check=_pos),
        "cos_min_ratio": K(0.0001, NUM, "end ratio of the cosine decay", check=_ratio),
        "warmup_type": K("log", (str,), "warmup curve: log or linear (another name: log, with a warning)"),
        "last_batch_iteration": K(-1, (int,), "index of the last batch when resuming"),
    },
    "OneCycle": {
        "cycle_min_lr": K(None, NUM, "lower lr boundary of the cycle (required)", check=_lr),
        "cycle_max_lr": K(None, NUM, "upper lr boundary of the cycle (required)", check=_lr),
        "decay_lr_rate": K(0.0, NUM, "lr decay rate after the cycle", check=_nonneg),
        "cycle_first_step_size": K(2000, (int,), "steps of the increasing half", check=_pos),
        "cycle_second_step_size": K(None, (int, type(None)), "steps of the decreasing half (default: first)",
                                    check=_nonneg),
        "cycle_first_stair_count": K(0, (int,), "flat stairs in the increasing half (0: continuous)",
                                     check=_nonneg),
        "cycle_second_stair_count": K(None, (int, type(None)), "flat stairs in the decreasing half (default: "
                                      "first)", check=_nonneg),
        "decay_step_size": K(0, (int,), "interval of post-cycle decay (0: no decay)", check=_nonneg),
        "cycle_momentum": K(True, (bool,), "cycle beta1 inversely to the lr"),
        "cycle_min_mom": K(0.8, NUM, "lower beta1 boundary", check=_between(0, 1)),
        "cycle_max_mom": K(0.9, NUM, "upper beta1 boundary", check=_between(0, 1)),
        "decay_mom_rate": K(0.0, NUM, "beta1 decay rate after the cycle", check=_nonneg),
        "last_batch_iteration": K(-1, (int,), "index of the last batch when resuming"),
    },
    "LRRangeTest": {
        "lr_range_test_min_lr": K(1e-3, NUM, "starting learning rate", check=_lr),
        "lr_range_test_step_size": K(2000, (int,), "steps per increase", check=_pos),
        "lr_range_test_step_rate": K(1.0, NUM, "increase per step_size", check=_nonneg),
        "lr_range_test_staircase": K(False, (bool,), "increase in stairs instead of continuously"),
        "last_batch_iteration": K(-1, (int,), "index of the last batch when resuming"),
    },
}
_SCHEDULERS_UNSUPPORTED = ("WarmupCosineLRv2",)

_ENABLED_ONLY = S({"enabled": K(False, (bool,), "feature switch")}, "")

SCHEMA: dict[str, S] = {
    "": S({
        "train_batch_size": K(None, (int, type(None)), "global batch per optimizer step",
                              auto=AUTO_DERIVE, check=_pos),
        "train_micro_batch_size_per_gpu": K(None, (int, type(None)), "batch per forward/backward per rank",
                                            auto=AUTO_DERIVE, check=_pos),
        "gradient_accumulation_steps": K(None, (int, type(None)), "micro-batches per optimizer step",
                                         auto=AUTO_DERIVE, check=_pos),
        "gradient_clipping": K(1.0, NUM, "clip the global gradient L2 norm to this (0: off; DeepSpeed's "
                               "default since 0.19.3 is 1.0)", check=_nonneg),
        "steps_per_print": K(10, NUM, "log progress every N optimizer steps (infinity, as HF accelerate "
                             "writes, or 0: never)", auto=AUTO_DEFAULT, check=_steps_per_print, allow_inf=True),
        "wall_clock_breakdown": K(False, (bool,), "time each forward, backward and step (engine.timers) and print "
                                  "the times on rank 0 at every step() call, as DeepSpeed", auto=AUTO_DEFAULT),
        "dump_state": K(False, (bool,), "log the engine state after initialize"),
        "log_level": K(None, (str, type(None)), "level of zspeed's logger (deepspeed.utils.logger) and its "
                       "handlers, set at initialize: debug, info, warning, error or critical (null: unchanged)",
                       check=lambda v: None if v.lower() in ("debug", "info", "warning", "error", "critical")
                       else "must be debug, info, warning, error or critical"),
        "zspeed_summary": K(True, (bool,), "zspeed: log initialize's start-up summary on rank 0 (stage, offload, "
                            "split, threads, SIMD, I/O backend, memory per tier)"),
        "gradient_allreduce_op": K("mean", (str,), "gradients over the ranks: \"mean\" (averaged) or \"sum\" "
                                   "(the unscaled sum; stages 0-2, as in DeepSpeed); any letter case",
                                   choices=("mean", "sum"), fold_case=True),
        "prescale_gradients": K(False, (bool,), "accepted: the mean over ranks is taken in the step's gradient factor"),
        "gradient_predivide_factor": K(1.0, NUM, "accepted: the mean over ranks is taken in the step's factor",
                                       check=_between(2.0 ** -24, 2.0 ** 24)),
        "zero_allow_untested_optimizer": K(False, (bool,), "allow a client optimizer with ZeRO"),
        "zero_force_ds_cpu_optimizer": K(True, (bool,), "require zspeed's CPU optimizer when offloading"),
        "dataloader_drop_last": K(False, (bool,), "drop the last incomplete batch"),
        "communication_data_type": K(None, (str, type(None)), "dtype of gradient reductions across ranks: fp32, fp16, "
                                     "bf16, any case (default: the model's)",
                                     check=lambda v: None if v.lower() in ("fp32", "fp16", "bf16") else
                                     "must be fp32, fp16 or bf16"),
        "memory_breakdown": K(False, (bool,), "log memory use"),
        "seed": K(None, (int, type(None)), "zspeed extension: torch.manual_seed before the dataloader",
                  check=_between(-2 ** 63, 2 ** 64 - 1, "torch seeds are 64-bit integers")),
        "zspeed_trace": K(None, (str, type(None)), "zspeed extension: write a Chrome trace of the engine's phases "
                          "to this file (see also ZSPEED_TRACE); off by default"),
    }, "top level"),
    "optimizer": S({
        "type": K(None, (str,), "Adam, AdamW, Adagrad or Lion"),
        "params": K({}, (dict,), "optimizer arguments"),
        "legacy_fusion": K(False, (bool,), "accepted (no effect)"),
    }, "optimizer", open_params=True),
    "scheduler": S({
        "type": K(None, (str,), "WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle"),
        "params": K({}, (dict,), "scheduler arguments"),
    }, "scheduler", open_params=True),
    "fp16": S({
        "enabled": K(False, (bool,), "train with fp16 weights and dynamic loss scaling"),
        "auto_cast": K(False, (bool,), "cast floating-point inputs of forward to fp16"),
        "loss_scale": K(0.0, NUM, "static loss scale; 0 means dynamic",
                        check=lambda v: None if v == 0 or _SCALE_MIN <= v <= _SCALE_MAX else
                        "must be 0 (dynamic) or a static scale between 2^-24 and 2^64"),
        "initial_scale_power": K(16, (int,), "dynamic scaling starts at 2**power", check=_between(0, 64)),
        "loss_scale_window": K(1000, (int,), "steps without overflow before the scale doubles (> 0 with "
                               "dynamic scaling)"),
        "hysteresis": K(2, (int,), "overflows tolerated before the scale is lowered", check=_pos),
        "consecutive_hysteresis": K(False, (bool,), "refill hysteresis on every good step"),
        "min_loss_scale": K(1, NUM, "lower bound of the dynamic scale (2^-24 to 2^64 with dynamic scaling)"),
        "fp16_master_weights_and_grads": K(False, (bool,), "fp16 master weights (not supported)"),
    }, "fp16"),
    "bf16": S({
        "enabled": K(False, (bool,), "train with bf16 weights and fp32 master weights"),
        "immediate_grad_update": K(False, (bool,), "accepted (no effect)"),
        "check_grad_overflow": K(True, (bool,), "skip steps whose gradients are not finite (DeepSpeed's "
                                 "default since 0.19.3)"),
        "bf16_master_weights_and_grads": K(False, (bool,), "bf16 master weights and gradients (not "
                                           "supported: masters are fp32)"),
        "bf16_optimizer_states": K(False, (bool,), "bf16 optimizer states with bf16 masters (not supported; "
                                   "zspeed's equivalent: optimizer.params.state_dtype bf16)"),
    }, "bf16"),
    "zero_optimization": S({
        "stage": K(0, (int,), "ZeRO stage: 0 (data parallel), 1 (optimizer state partitioned), 2 (and "
                    "gradients), 3 (and parameters)", choices=(0, 1, 2, 3)),
        "offload_optimizer": K(None, (dict, type(None)), "optimizer state offload (section)"),
        "offload_param": K(None, (dict, type(None)), "parameter offload (stage 3 only)"),
        "leaf_module": K(None, (dict, type(None)), "ZeRO-3 leaf modules, gathered whole (section: classes, names, "
                         "name_suffixes; DeepSpeed's)"),
        "cpu_offload": K(False, (bool,), "deprecated spelling of offload_optimizer.device=cpu"),
        "contiguous_gradients": K(True, (bool,), "always on: each bucket's gradients are copied into one buffer"),
        "overlap_comm": K(None, (bool, type(None)), "reduce gradients asynchronously while backward goes on "
                          "(default, as DeepSpeed's: on at stage 3, off below)"),
        "reduce_scatter": K(True, (bool,), "accepted: stages 1-3 always reduce-scatter"),
        "reduce_bucket_size": K(500000000, NUM, "elements per reduction bucket (capped at 2^24; stage 3 reduces each parameter on its own)", auto=AUTO_DEFAULT,
                                check=_count),
        "allgather_partitions": K(True, (bool,), "accepted: updated weights are always all-gathered"),
        "allgather_bucket_size": K(500000000, NUM, "accepted: all-gathers follow the reduction buckets (stages "
                                   "1-2: must be even, as DeepSpeed requires)",
                                   auto=AUTO_DEFAULT, check=_count),
        "round_robin_gradients": K(False, (bool,), "accepted (no effect)"),
        "load_from_fp32_weights": K(True, (bool,), "restore masters from fp32 copies in checkpoints"),
        "enable_sanity_checks": K(False, (bool,), "ZeRO-3: an in-place edit inside GatheredParameters without "
                                  "modifier_rank raises RuntimeError (false: it is discarded with a warning)"),
        "elastic_checkpoint": K(False, (bool,), "accepted (no effect: zspeed's checkpoints load on any number "
                                "of ranks; at stage 3 it logs DeepSpeed's deprecation warning)"),
        "ignore_unused_parameters": K(True, (bool,), "true: trained parameters without a gradient step with zero "
                                      "gradients; false: at stages 1-2 with offload_optimizer cpu such a step raises "
                                      "an AssertionError naming them (as DeepSpeed; elsewhere no check, as there)"),
        "sub_group_size": K(1000000000, NUM, "elements per optimizer sub-group (cpu: step chunk, capped at 2^26; nvme: swapper partition, capped at 2^23)", auto=AUTO_DEFAULT, check=_count),
        "stage3_max_live_parameters": K(1000000000, NUM, "stage 3: elements gathered on the device at most "
                                        "before prefetching stops (a module's own parameters are always gathered)", auto=AUTO_DEFAULT, check=_between(0, 2 ** 62)),
        "stage3_module_granularity_threshold": K(0, (int,), "stage 3: a module whose parameters per layer (its "
                                                 "subtree's parameter count over its modules with parameters, "
                                                 "containers not counted) are at most this is gathered whole, as a "
                                                 "leaf, the outermost such module first (0: off; DeepSpeed's rule, "
                                                 "fewer hooks for fine-grained models)", check=_nonneg),
        "stage3_max_reuse_distance": K(1000000000, NUM, "stage 3: a parameter used again within this "
                                       "many gathered elements stays gathered in between (forward)", auto=AUTO_DEFAULT, check=_between(0, 2 ** 62)),
        "stage3_prefetch_bucket_size": K(50000000, NUM, "stage 3: elements gathered ahead of their use, in "
                                         "the order the first step used them (0: no prefetch)", auto=AUTO_DEFAULT, check=_between(0, 2 ** 62)),
        "stage3_param_persistence_threshold": K(100000, NUM, "stage 3: parameters of at most this many "
                                                "elements stay gathered between uses", auto=AUTO_DEFAULT,
                                                check=_elements),
        "stage3_gather_16bit_weights_on_model_save": K(False, (bool,), "stage 3: lets save_16bit_model "
                                                       "gather the whole model", auto=AUTO_DEFAULT),
        "stage3_gather_fp16_weights_on_model_save": K(False, (bool,), "older name of "
                                                      "stage3_gather_16bit_weights_on_model_save", auto=AUTO_DEFAULT),
        "memory_efficient_linear": K(True, (bool,), "stage 3: accepted (no effect)"),
        # DeepSpeed's remaining zero_optimization fields: performance switches with nothing to switch
        # in zspeed are accepted with any value; a feature zspeed does not have is accepted at
        # DeepSpeed's default only, and another value is refused by name.
        "use_multi_rank_bucket_allreduce": K(True, (bool,), "accepted (no effect: zspeed's gradient "
                                             "reductions are its own)"),
        "stage3_use_all_reduce_for_fetch_params": K(False, (bool,), "stage 3: accepted (no effect: "
                                                    "parameters are gathered with all-gather)"),
        "stage3_allgather_sequential": K(False, (bool,), "stage 3: accepted (no effect)"),
        "log_trace_cache_warnings": K(False, (bool,), "accepted (no effect: zspeed keeps no trace cache)"),
        "legacy_stage1": K(False, (bool,), "accepted (no effect: DeepSpeed's old stage-1 code path)"),
        "stage3_model_persistence_threshold": K(2 ** 63 - 1, NUM, "stage 3: DeepSpeed's cap on all "
                                                "persistent elements (only the default, no cap)",
                                                check=_ds_default(2 ** 63 - 1, "a cap on the model's persistent "
                                                "parameters, which zspeed does not have (it persists every "
                                                "parameter at or below stage3_param_persistence_threshold)")),
        "override_module_apply": K(True, (bool,), "zero.Init: Module.apply sees whole parameters (only true)",
                                   check=_ds_default(True, "zero.Init without whole parameters in Module.apply "
                                   "(a parent's weight initialisation would then miss its children's "
                                   "partitioned weights)")),
        "pipeline_loading_checkpoint": K(False, (bool,), "accepted (no effect: DeepSpeed's ZeRO-3 loads "
                                         "checkpoints one local rank after another with it; zspeed's ranks load "
                                         "their parts at the same time)"),
        "zero_hpz_partition_size": K(1, (int,), "ZeRO++ hierarchical partitioning (only 1)",
                                     check=_ds_default(1, "ZeRO++ hierarchical weight partitioning (hpZ)")),
        "zero_quantized_weights": K(False, (bool,), "ZeRO++ quantized weight gathers (only false)",
                                    check=_ds_default(False, "ZeRO++ quantized weight all-gathers (qwZ)")),
        "zero_quantized_nontrainable_weights": K(False, (bool,), "ZeRO++ quantized frozen weights (only false)",
                                                 check=_ds_default(False, "ZeRO++ quantized frozen weights")),
        "zero_quantized_gradients": K(False, (bool,), "ZeRO++ quantized gradient reduction (only false)",
                                      check=_ds_default(False, "ZeRO++ quantized gradient reduction (qgZ)")),
        "zeropp_loco_param": K(None, (dict, type(None)), "ZeRO++ LoCo error feedback (only null)",
                               check=_ds_default(None, "ZeRO++ LoCo error feedback")),
        "mics_shard_size": K(-1, (int,), "MiCS shard groups (only -1)",
                             check=_ds_default(-1, "MiCS (sharding within sub-groups of ranks); zspeed "
                                               "partitions over all ranks")),
        "mics_hierarchical_params_gather": K(False, (bool,), "MiCS hierarchical gathers (only false)",
                                             check=_ds_default(False, "MiCS hierarchical parameter gathers")),
        "save_muon_momentum_buffer_in_memory": K(False, (bool,), "accepted (no effect: it places DeepSpeed's Muon "
                                                 "momentum under NVMe offload, and zspeed has no Muon)"),
        "zenflow": K(None, (dict, type(None)), "DeepSpeed's ZenFlow (section; accepted, not implemented: "
                     "training runs as ordinary ZeRO-Offload)"),
    }, "zero_optimization"),
    "zero_optimization.zenflow": S({
        "topk_ratio": K(0.1, NUM, "ZenFlow: share of important gradient columns", check=_between(0, 1)),
        "select_strategy": K("auto", (str,), "ZenFlow: selection strategy", choices=("auto", "step", "epoch")),
        "select_interval": K("auto", (str, int), "ZenFlow: selection interval"),
        "update_interval": K("auto", (str, int), "ZenFlow: update interval"),
        "overlap_step": K(False, (bool,), "ZenFlow: overlap the CPU step"),
        "offload": K(False, (bool,), "ZenFlow: offload"),
        "auto_ratio": K(0.99, NUM, "ZenFlow: auto ratio", check=_between(0, 1)),
        "full_warm_up_rounds": K(0, (int,), "ZenFlow: warm-up rounds", check=_nonneg),
        "pt_reserved_cores_perc": K(0.5, NUM, "ZenFlow: share of cores for torch", check=_between(0, 1)),
        "steps_per_epoch": K(None, (int, type(None)), "ZenFlow: steps per epoch"),
    }, "zero_optimization.zenflow"),
    "data_types": S({
        "grad_accum_dtype": K(None, (str, type(None)), "dtype gradients accumulate in between boundaries "
                              "(zspeed: the model's; another is accepted only with one micro-batch per step)",
                              check=lambda v: None if v.lower() in _DTYPE_NAMES else
                              "must be fp32, fp16 or bf16"),
        "param_dtype": K(None, (str, type(None)), "dtype of the parameters (must match fp16/bf16)",
                         check=lambda v: None if v.lower() in _DTYPE_NAMES else "must be fp32, fp16 or bf16"),
        "buffer_dtype": K(None, (str, type(None)), "dtype the module's floating-point buffers are cast to at "
                          "initialize (null: each keeps the dtype it was loaded in, as DeepSpeed 0.19.2+ does)",
                          check=lambda v: None if v.lower() in _DTYPE_NAMES else "must be fp32, fp16 or bf16"),
        "keep_in_fp32_modules": K("auto", (str, list), "floating-point buffers kept in fp32 under fp16/bf16: "
                                  "\"auto\" (the names a transformers model lists in _keep_in_fp32_modules_strict, "
                                  "and _keep_in_fp32_modules under fp16), a list of name patterns (* = any "
                                  "characters, matched anywhere in the buffer's full name), or [] (none)",
                                  auto=AUTO_KEEP, check=_keep_fp32_setting),
    }, "data_types"),
    "torch_autocast": S({
        "enabled": K(False, (bool,), "torch.autocast around forward (only false: use bf16 or fp16 instead)"),
        "dtype": K("torch.bfloat16", (str,), "autocast dtype"),
        "lower_precision_safe_modules": K(None, (list, type(None)), "modules autocast may lower"),
    }, "torch_autocast"),
    "amp": S({
        "enabled": K(False, (bool,), "NVIDIA Apex AMP (only false: use fp16 or bf16 instead)"),
    }, "amp"),
    "zero_optimization.offload_optimizer": S({
        "device": K("none", (str,), "where optimizer state lives", choices=("none", "cpu", "nvme")),
        "nvme_path": K(None, (str, type(None)),
                       "nvme: existing writable directory for the swap files (required; deleted by engine.close())"),
        "pin_memory": K(False, (bool,), "page-lock host buffers (needed for async copies)"),
        "buffer_count": K(4, (int,), "nvme: page-locked pipeline buffers of the swapper, 1 to 64 (>= 3 overlaps read, step and write)", check=_SWAP_BUFFERS),
        "fast_init": K(False, (bool,), "accepted (no effect)"),
        "ratio": K(1.0, NUM + (str,), "device cpu or nvme: fraction of the parameters (by elements) whose "
                   "optimizer steps on the CPU; the first others keep fp32 masters and Adam state on the GPU and "
                   "step there at the same time (stages 1-3, any number of ranks: each rank splits its own part; "
                   "with nvme only a rank's store part, at stage 3 or on several ranks, and a number; Adam/AdamW; "
                   "the CPU's share keeps optimizer.params.state_dtype, the GPU's fp32); \"auto\" runs the first step with everything on the CPU, then sizes the "
                   "GPU's share from that step's peak GPU memory (within set_per_process_memory_fraction, less a "
                   "margin) and the measured step rates, and logs the choice (docs/OFFLOAD.md)", auto=AUTO_KEEP, check=_offload_ratio),
        "max_in_cpu": K(0, NUM, "zspeed extension (device nvme, at stage 3 or on several ranks): elements of this "
                        "rank's part whose fp32 masters and optimizer state stay in host memory instead of the swap "
                        "files: the first ones after the GPU's share (ratio), stepped by the CPU path's kernels; "
                        "the rest on NVMe (the three tiers of docs/OFFLOAD.md; 0 puts the whole non-GPU share on "
                        "NVMe; offload_param's key of the same name is DeepSpeed's, for frozen parameters)",
                        check=_elements),
        "pipeline_read": K(False, (bool,), "accepted: zspeed's nvme step always overlaps reads with compute"),
        "pipeline_write": K(False, (bool,), "accepted: zspeed's nvme step always overlaps writes with compute"),
        "super_offload": K(False, (bool,), "DeepSpeed's SuperOffload (a ZeRO-3 feature; accepted, not "
                           "implemented: ordinary offload)"),
        "cpuadam_cores_perc": K(0.8, NUM, "with super_offload: share of the cores the CPU optimizer uses",
                                check=_between(0, 1)),
        "delayed_update": K(False, (bool,), "zspeed extension (device cpu): the CPU step of each boundary runs "
                            "during the next forward and backward, which use the weights of one step "
                            "earlier (the ZeRO-Offload paper's delayed parameter update: faster, one step "
                            "stale; off gives exact updates)"),
        "overlap_forward": K(False, (bool,), "zspeed extension (device cpu, stages 1-3, any number of ranks): engine.step() "
                             "returns as soon as the CPU step starts; the step runs in chunks in the model's "
                             "parameter order and the next forward waits, module by module (at stage 3: gather "
                             "by gather), only for the chunk holding that module's weights (exact updates; docs/OFFLOAD.md says what "
                             "must not read parameters meanwhile)"),
    }, "zero_optimization.offload_optimizer"),
    "zero_optimization.leaf_module": S({
        "classes": K(list(DEFAULT_LEAF_MODULE_CLASSES), (list, str), "module classes (names or fully qualified "
                     "names) whose instances are ZeRO-3 leaves (default: DeepSpeed's, the sparse MoE blocks of "
                     "transformers' Mixtral, Qwen2-MoE and Qwen3-MoE)", check=_strings),
        "names": K([], (list, str), "modules (their model.named_modules() names) that are ZeRO-3 leaves",
                   check=_strings),
        "name_suffixes": K([], (list, str), "modules whose named_modules() name ends with one of these are "
                           "ZeRO-3 leaves", check=_strings),
    }, "zero_optimization.leaf_module"),
    "zero_optimization.offload_param": S({
        "device": K("none", (str,), "where parameter shards live (stage 3): none (the GPU), cpu (host "
                    "memory) or nvme (parameters nothing trains in a file under nvme_path, read through the "
                    "aio engine; trained ones stay in host memory: docs/ZERO3.md)", choices=("none", "cpu", "nvme")),
        "nvme_path": K(None, (str, type(None)), "nvme: existing writable directory for the parameter file "
                       "(required; deleted by engine.close())"),
        "pin_memory": K(False, (bool,), "page-lock the host shards and NVMe read buffers (asynchronous copies "
                        "to the GPU)"),
        "buffer_count": K(5, (int,), "nvme: host buffers that NVMe reads of prefetched parameters land in (>= 1)",
                          check=lambda v: None if v >= 1 else "must be >= 1 (the NVMe reads of parameters land "
                          "in these host buffers; the default is 5)"),
        "buffer_size": K(100000000, NUM, "nvme: elements per read buffer at most (each is sized to the largest "
                         "shard on NVMe; a larger shard is an error)", auto=AUTO_DEFAULT, check=_count),
        "max_in_cpu": K(1000000000, NUM, "nvme: elements of (frozen) parameter shards kept in host memory "
                        "instead, the first ones in parameter order", auto=AUTO_DEFAULT,
                        check=_elements),
        "grads_in_shards": K(True, (bool,), "zspeed extension (device cpu or nvme, with offload_optimizer cpu or nvme, "
                             "bf16/fp16, gradient_accumulation_steps 1, no delayed_update; with a ratio, the "
                             "CPU's share): the boundary's reduced gradients land in the rank's host parameter shards, whose "
                             "weights the step overwrites anyway (the fp32 masters keep them meanwhile), so "
                             "host memory holds no separate gradient buffer (2 bytes per parameter less); "
                             "parameters cannot be edited between backward and step (docs/ZERO3.md); false "
                             "keeps a separate buffer"),
    }, "zero_optimization.offload_param"),
    "aio": S({
        "block_size": K(1048576, (int,), "bytes per I/O request, at most 1 GiB (nvme swapper)",
                        check=_int_between(1, 2 ** 30, "bytes per I/O request, at most 1 GiB")),
        "queue_depth": K(8, (int,), "requests in flight per thread, 1 to 4096 (nvme swapper)",
                         check=_int_between(1, 4096, "requests in flight per I/O thread")),
        "intra_op_parallelism": K(1, (int,), "I/O threads per operation, 1 to 256 (nvme swapper)",
                                  check=_AIO_THREADS),
        "thread_count": K(None, (int, type(None)), "older name of intra_op_parallelism", check=_AIO_THREADS),
        "single_submit": K(False, (bool,), "submit requests one at a time (nvme swapper, io_uring)"),
        "overlap_events": K(True, (bool,), "overlap submission and completion (nvme swapper, io_uring)"),
        "use_gds": K(False, (bool,), "GPUDirect Storage (not supported)"),
    }, "aio"),
    "compile": S({
        "deepcompile": K(False, (bool,), "DeepSpeed's DeepCompile (compiler-driven ZeRO): only false (zspeed "
                         "does not implement it)"),
        **{k: K(v, (bool,), "DeepCompile setting: accepted (no effect without deepcompile)") for k, v in (
            ("free_activation", False), ("offload_activation", False), ("offload_activation_pin_memory", True),
            ("offload_opt_states", False), ("double_buffer", True), ("symmetric_memory", False),
            ("debug_log", False), ("offload_parameters", False), ("sync_before_reduce", False),
            ("sync_after_reduce", False), ("sync_before_allgather", False), ("sync_after_allgather", False),
            ("keep_int_input_tensors", True), ("keep_all_input_tensors", False))},
        "free_activation_threshold": K(10 * 1024 * 1024, (int,), "DeepCompile setting: accepted (no effect "
                                       "without deepcompile)", check=_nonneg),
        "passes": K(None, (list, type(None)), "DeepCompile passes: accepted (no effect without deepcompile)"),
    }, "compile"),
    "timers": S({
        "throughput": K(None, (dict, type(None)), "engine.tput_timer, the samples-per-second timer (section)"),
    }, "timers"),
    "timers.throughput": S({
        "enabled": K(True, (bool,), "measure samples per second (engine.tput_timer; logged every steps_per_print "
                     "steps)"),
        "synchronized": K(True, (bool,), "wait for the current CUDA stream at each timer start and stop, so that "
                          "a time covers the device work and not only its launch (DeepSpeed waits for the "
                          "whole device)"),
    }, "timers.throughput"),
    # DeepSpeed's monitors (zspeed.monitor): rank 0 writes the engine's events (the learning rate, the
    # fp16 loss scale, with wall_clock_breakdown the step's timers) at each optimizer step, and what a
    # script passes to engine.monitor.write_events.
    "tensorboard": S({
        "enabled": K(False, (bool,), "write the engine's events with TensorBoard's SummaryWriter (needs the "
                     "tensorboard package)"),
        "output_path": K("", (str,), "folder under which the job's folder is made (\"\": the working folder)"),
        "job_name": K("DeepSpeedJobName", (str,), "the job's folder inside output_path (one folder name)",
                      check=_folder_name),
    }, "tensorboard"),
    "csv_monitor": S({
        "enabled": K(False, (bool,), "write the engine's events to CSV files, one per event name (step, value)"),
        "output_path": K("", (str,), "folder under which the job's folder is made (\"\": the working folder)"),
        "job_name": K("DeepSpeedJobName", (str,), "the job's folder inside output_path (one folder name)",
                      check=_folder_name),
    }, "csv_monitor"),
    "wandb": S({
        "enabled": K(False, (bool,), "log the engine's events to Weights & Biases (needs the wandb package)"),
        "group": K(None, (str, type(None)), "the wandb run group"),
        "team": K(None, (str, type(None)), "the wandb entity (team)"),
        "project": K("deepspeed", (str,), "the wandb project"),
    }, "wandb"),
    "comet": S({
        "enabled": K(False, (bool,), "log the engine's events to Comet (needs comet_ml >= 3.41.0)"),
        "samples_log_interval": K(100, (int,), "an event name is sent again only after this many more samples",
                                  check=_nonneg),
        **{k: K(None, (str, type(None)), f"Comet {what} (None: Comet's own configuration or environment)")
           for k, what in (("project", "project name"), ("workspace", "workspace"), ("api_key", "API key"),
                           ("experiment_name", "experiment name"), ("experiment_key", "experiment key"))},
        "online": K(None, (bool, type(None)), "false: an offline experiment (None: Comet's default, online)"),
        "mode": K(None, (str, type(None)), "how the experiment starts (None: Comet's default, get_or_create)",
                  choices=(None, "get", "create", "get_or_create")),
    }, "comet"),
    "activation_checkpointing": S({
        "partition_activations": K(False, (bool,), "split saved activations across model-parallel ranks: no "
                                   "effect (zspeed has no model parallelism)"),
        "cpu_checkpointing": K(False, (bool,), "keep checkpointed layer inputs in pinned host memory, copied "
                               "back ahead of recomputation (zspeed.checkpointing)"),
        "contiguous_memory_optimization": K(False, (bool,), "accepted (no effect without partitioning)"),
        "number_checkpoints": K(None, (int, type(None)), "accepted (no effect without partitioning)"),
        "synchronize_checkpoint_boundary": K(False, (bool,), "synchronize the device around each checkpoint"),
        "profile": K(False, (bool,), "log each checkpointed call's forward and backward time"),
    }, "activation_checkpointing"),
    "checkpoint": S({
        "tag_validation": K("Warn", (str,), "tag consistency across ranks (one rank: no effect); any letter "
                            "case, as in DeepSpeed", choices=("Warn", "Ignore", "Fail"), fold_case=True),
        "load_universal": K(False, (bool,), "universal checkpoint format (not supported)"),
        "use_node_local_storage": K(False, (bool,), "accepted (one node)"),
        "parallel_write": K(None, (dict, type(None)), "accepted (one rank)"),
        "checkpoint_serialization": K(True, (bool,), "engine.checkpoint_engine.save writes torch's zipfile "
                                      "format (false: the legacy one), as DeepSpeed; zspeed's own checkpoints "
                                      "are safetensors either way"),
    }, "checkpoint"),
}

# DeepSpeed's monitor sections, in the order MonitorMaster writes to them (zspeed.monitor).
MONITORS = ("tensorboard", "wandb", "csv_monitor", "comet")

# Keys (beside the stage3_* ones) that only ZeRO stage 3 reads, and what a config of another stage
# gets from them (the warning's words).
_STAGE3_ONLY = {
    "memory_efficient_linear": "it has no effect",
    "offload_param": "the parameters stay whole on the device and offload_param (device {device!r}) has no "
                     "effect, as in DeepSpeed; set \"stage\": 3 to offload them",
}

# DeepSpeed features that exist but that zspeed does not implement. Those marked None (the
# profilers) are accepted when disabled, since generated configs often carry them.
_DS_UNSUPPORTED_TOP = {
    "flops_profiler": None, "comms_logger": None,
    "compression_training": "", "data_efficiency": "", "pipeline": "",
    "sparse_attention": "", "elasticity": "", "autotuning": "", "curriculum_learning": "",
    "sparse_gradients": "DeepSpeed 0.19.8 removed it too; an embedding built with sparse=True needs no flag: zspeed "
                        "makes its gradient dense", "quantize_training": "", "eigenvalue": "",
    "progressive_layer_drop": "", "hybrid_engine": "", "nebula": "",
    "tensor_parallel": "", "weight_quantization": "", "zero_quantized_weights": "",
    "gradient_compression": "", "fp8": "",
}
_PLATFORM_RE = re.compile(r"windows|win32|win64|linux|macos|darwin|posix|platform|wsl", re.I)


def schema_rows() -> list[tuple[str, str, Any, str]]:
    """(key path, types, default, meaning) for every declared key: documentation."""
    rows = []
    for sec, s in SCHEMA.items():
        for k, spec in s.keys.items():
            path = f"{sec}.{k}" if sec else k
            rows.append((path, "|".join(t.__name__ for t in spec.types), spec.default, spec.meaning))
    for t, keys in list(_OPTIMIZER_PARAMS.items()) + list(_SCHEDULER_PARAMS.items()):
        for k, spec in keys.items():
            rows.append((f"{t}.params.{k}", "|".join(x.__name__ for x in spec.types),
                         spec.default, spec.meaning))
    return rows


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


class _HugeInt:
    """An integer literal of a config file with more digits than int() converts (Python's
    int_max_str_digits limit, 4300 by default): kept as its length, reported with its key."""

    def __init__(self, digits: int):
        self.digits = digits


def _parse_int(text: str):
    try:
        return int(text)
    except ValueError:
        return _HugeInt(len(text.lstrip("+-")))


def _int_size(v: int) -> str:
    return f"about {int(v.bit_length() * math.log10(2)) + 1} digits"


def _show(value) -> str:
    """repr() for an error message; an integer too long to print shows its size instead."""
    try:
        return repr(value)
    except ValueError:
        return f"<an integer of {_int_size(value)}>"


def _check_huge_ints(value, where: str = "") -> None:
    """Refuses integers longer than Python prints or parses (sys.get_int_max_str_digits()),
    naming their key: every other error message would fail to print them, and no config value
    is that large."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    todo = [("", value)]
    while todo:
        key, v = todo.pop()
        if isinstance(v, dict):
            todo.extend((f"{key}.{k}" if key else str(k), x) for k, x in v.items())
            continue
        if isinstance(v, (list, tuple)):
            todo.extend((f"{key}[{i}]", x) for i, x in enumerate(v))
            continue
        if isinstance(v, _HugeInt):
            size = f"{v.digits} digits"
        elif limit and isinstance(v, int) and v.bit_length() > 3 * limit and _show(v).startswith("<"):
            size = _int_size(v)  # 3 bits per digit is below log2(10): every unprintable integer is tried
        else:
            continue
        what = f"config key '{key}'" if key else "the config"
        raise ConfigError(f"{where}{what} is an integer of {size}, more than Python converts ({limit} digits: "
                          f"sys.get_int_max_str_digits()); no config value is that large. Write the number you "
                          f"meant.")


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
    _check_huge_ints(config)
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
        _check_huge_ints(config)
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
            raise ConfigError("the 'optimizer' section needs a 'type' (Adam, AdamW, Adagrad or Lion).")
        low = t.lower()
        if low not in _OPTIMIZER_PARAMS:
            if low in _DS_OPTIMIZERS_UNSUPPORTED:
                raise ConfigError(f"optimizer type '{t}' is a DeepSpeed optimizer that zspeed does not "
                                  f"implement; use Adam, AdamW, Adagrad or Lion, or pass your own "
                                  f"torch optimizer to zspeed.initialize(optimizer=...).")
            close = difflib.get_close_matches(low, list(_OPTIMIZER_PARAMS), n=1, cutoff=0.6)
            hint = f" Did you mean '{_OPTIMIZER_CANON[close[0]]}'?" if close else ""
            raise ConfigError(f"unknown optimizer type '{t}' in section 'optimizer'; zspeed supports "
                              f"Adam, AdamW, Adagrad and Lion.{hint}")
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


def _no_duplicates(pairs: list) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ConfigError(f"the key '{k}' appears twice in one object ({out[k]!r}, then {v!r}); "
                              f"JSON would silently keep the last. Keep one.")
        out[k] = v
    return out


def _no_constant(name: str):
    raise ConfigError(f"'{name}' is not a number a config may hold (it is not standard JSON); "
                      f"write a finite number.")


def load_json_config(path: Path) -> dict:
    """Reads a JSON config file strictly: UTF-8, no duplicate keys, no NaN/Infinity."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the DeepSpeed config file '{path}': {e.strerror or e}. "
                          f"Check the path.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"the DeepSpeed config file '{path}' is not UTF-8 text (byte {e.start}: "
                          f"{raw[e.start:e.start + 1]!r}); is it the right file?") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                          parse_int=_parse_int)
    except ConfigError as e:
        raise ConfigError(f"the DeepSpeed config file '{path}': {e}") from None
    except json.JSONDecodeError as e:
        return _load_hjson(path, text, e)
    except RecursionError:
        raise ConfigError(f"the DeepSpeed config file '{path}' is nested too deeply to be a "
                          f"config.") from None
    _check_huge_ints(data, f"the DeepSpeed config file '{path}': ")
    return data


def _load_hjson(path: Path, text: str, json_error: json.JSONDecodeError) -> dict:
    """DeepSpeed reads config files as hjson (JSON plus comments, unquoted keys and strings,
    optional commas). A file that is not JSON is read the same way when the ``hjson``
    package is installed (zspeed does not require it), with the same checks: no duplicate
    keys, only finite numbers."""
    where = (f"the DeepSpeed config file '{path}' is not valid JSON ({json_error.msg} at line "
             f"{json_error.lineno} column {json_error.colno})")
    try:
        import hjson
    except ImportError:
        raise ConfigError(f"{where}. DeepSpeed reads config files as hjson (comments, unquoted keys, optional "
                          f"commas); install the hjson package (pip install hjson) to let zspeed read this "
                          f"file the same way, or write it as JSON.") from None
    try:
        data = hjson.loads(text, object_pairs_hook=_no_duplicates, parse_int=_parse_int)
    except ConfigError as e:
        raise ConfigError(f"the DeepSpeed config file '{path}': {e}") from None
    except (hjson.HjsonDecodeError, ValueError) as e:
        raise ConfigError(f"{where}, nor valid hjson: {e}.") from None
    except RecursionError:
        raise ConfigError(f"the DeepSpeed config file '{path}' is nested too deeply to be a "
                          f"config.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the DeepSpeed config file '{path}' holds {type(data).__name__}, not an object.")
    _check_finite(data, str(path))
    _check_huge_ints(data, f"the DeepSpeed config file '{path}': ")
    return dict(data)


def _check_finite(value, where: str) -> None:
    """hjson reads NaN and Infinity as numbers; a config may not hold them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"the DeepSpeed config file '{where}' holds {value!r}, which is not a number a "
                          f"config may hold; write a finite number.")
    if isinstance(value, dict):
        for v in value.values():
            _check_finite(v, where)
    elif isinstance(value, list):
        for v in value:
            _check_finite(v, where)


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
