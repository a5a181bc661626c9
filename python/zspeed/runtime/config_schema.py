"""The table of every DeepSpeed config key zspeed understands: its default, its accepted types,
what it means, how "auto" resolves and the check its value must pass; the per-type tables of
the optimizers' and schedulers' ``params``; and the DeepSpeed features zspeed does not
implement, each with its message. :mod:`zspeed.runtime.config` parses a user's dict against
these tables; the reference (docs/CONFIG.md) is generated from them (:func:`schema_rows`).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .._optimizers import ALGORITHMS, listed

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
_OPTIMIZER_CANON = {name.lower(): name for name in ALGORITHMS}  # the type in any letter case -> its name
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
        "type": K(None, (str,), listed("or")),
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
                   "with nvme a number, not \"auto\"; Adam/AdamW; "
                   "the CPU's share keeps optimizer.params.state_dtype, the GPU's fp32); \"auto\" runs the first step with everything on the CPU, then sizes the "
                   "GPU's share from that step's peak GPU memory (within set_per_process_memory_fraction, less a "
                   "margin) and the measured step rates, and logs the choice (docs/OFFLOAD.md)", auto=AUTO_KEEP, check=_offload_ratio),
        "max_in_cpu": K(0, NUM, "zspeed extension (device nvme, stages 1-3, any number of ranks): elements of this "
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
