"""What the engine checks and resolves once, while it is built (engine.py calls these in order):
the parameter groups and the client optimizer, DeepSpeed's rules for a client optimizer, the
monitors, the ranks' agreement, the memory tiers' check before anything is allocated, and the LR
scheduler. Each takes what it needs and returns what it makes; none keeps state."""
from __future__ import annotations

import dataclasses
import logging

import torch

from .. import comm
from .._optimizers import ZERO_TESTED_CLASSES
from ..monitor import DeepSpeedMonitorConfig, MonitorMaster
from .assemble import footprint, memory_fixes
from .config import ConfigError, ZSpeedConfig
from .dtypes import (densify_grad, float_buffers, keep_in_fp32_pattern, kept_buffers, restore_buffers,
                     sparse_grad_params)
from .schedulers import build_scheduler
from .optimizers import is_zero_supported_optimizer
from .store import full_shape

log = logging.getLogger("zspeed.engine")

__all__ = ["trained_groups", "check_client_optimizer", "monitor_of", "check_ranks_agree", "check_memory",
           "memory_after_split", "scheduler_of", "note_inference", "dataloader"]


def trained_groups(module: torch.nn.Module, model_parameters, optimizer, config: ZSpeedConfig) -> tuple:
    """(the parameter groups the engine trains, the client optimizer) from initialize()'s arguments:
    a client optimizer's groups, else model_parameters (parameters, named parameters or groups),
    else every parameter with requires_grad. A callable optimizer is called with the groups; the
    client is checked against DeepSpeed's rules (:func:`check_client_optimizer`)."""
    groups = _param_groups(module, model_parameters, optimizer)
    if not groups or not any(g["params"] for g in groups):
        raise ConfigError("the model has no parameters with requires_grad=True: nothing to train.")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer or a callable returning one, "
                              f"got {type(optimizer).__name__}.")
        optimizer = optimizer([dict(g) for g in groups])
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"the optimizer callable returned {type(optimizer).__name__}, not a "
                              f"torch.optim.Optimizer.")
        groups = _param_groups(module, None, optimizer)
    if optimizer is not None:
        check_client_optimizer(optimizer, config)
    return groups, optimizer


def _param_groups(module: torch.nn.Module, model_parameters, client_opt) -> list:
    if isinstance(client_opt, torch.optim.Optimizer):
        src = client_opt.param_groups
    elif model_parameters is None:
        src = [{"params": [p for p in module.parameters() if p.requires_grad]}]
    else:
        items = list(model_parameters)
        if items and isinstance(items[0], tuple) and len(items[0]) == 2 and torch.is_tensor(items[0][1]):
            items = [p for _, p in items]  # model.named_parameters()
        src = items if items and isinstance(items[0], dict) else [{"params": items}]
    own = {id(p) for p in module.parameters()}
    seen, groups = set(), []
    for g in src:
        params = [p for p in (g["params"] if isinstance(g["params"], (list, tuple)) else list(g["params"]))
                  if p.requires_grad and id(p) not in seen]
        for p in params:
            if id(p) not in own:
                raise ConfigError("model_parameters contains a tensor that is not a parameter of the model; "
                                  "pass model.parameters() (or groups of them).")
            seen.add(id(p))
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": params})
    return [g for g in groups if g["params"]]


def param_names(module: torch.nn.Module, groups: list) -> list:
    """The module's name of each parameter of ``groups``, group by group."""
    by_id = {id(p): n for n, p in module.named_parameters()}
    return [[by_id[id(p)] for p in g["params"]] for g in groups]


def check_client_optimizer(client: torch.optim.Optimizer, config: ZSpeedConfig) -> None:
    """DeepSpeed's rules for an optimizer the script passes: it takes precedence over the
    config's 'optimizer' section, and with ZeRO (stage 1 and up) a class outside the tested
    set needs zero_allow_untested_optimizer."""
    if config.optimizer_name is not None:
        log.warning("zspeed: an optimizer was passed to zspeed.initialize and the config has an "
                    "'optimizer' section (%s): the passed %s is used and the section is ignored, as "
                    "in DeepSpeed.", config.optimizer_name, type(client).__name__)
    if config.zero_stage >= 1 and not is_zero_supported_optimizer(client):
        if not config.allow_untested_optimizer:
            from .errors import ConfigAssertionError
            tested = ", ".join(f"{m}.{n}" if m.startswith("torch") else n for m, n in ZERO_TESTED_CLASSES)
            raise ConfigAssertionError(
                f"ZeRO stage {config.zero_stage} with the client optimizer {type(client).__name__}, which "
                f"is not one of the optimizers ZeRO is tested with ({tested}). As in DeepSpeed, add "
                f"\"zero_allow_untested_optimizer\": true to the config to use it anyway.")
        log.warning("zspeed: ZeRO with an untested optimizer (%s), allowed by "
                    "zero_allow_untested_optimizer; proceed with caution.", type(client).__name__)


def monitor_of(config: ZSpeedConfig) -> tuple:
    """(DeepSpeed's monitors (zspeed.monitor), or none, and why none: the error of a monitor's
    folder that cannot be written). A monitor whose package is missing raises here, before
    anything is allocated; a folder error is raised on every rank alike by check_ranks_agree
    (rank 0 makes the folders), not on rank 0 alone."""
    try:
        return MonitorMaster(DeepSpeedMonitorConfig(**config.monitor)), None
    except ConfigError as e:
        return MonitorMaster(DeepSpeedMonitorConfig()), str(e)


def check_ranks_agree(coll, config: dict, names: list, layout, module: torch.nn.Module, device: torch.device,
                      monitor_error: str | None) -> None:
    """Ranks that disagree on the config, the model or the launch would deadlock in their
    first collective or train different models: compare once, fail with the difference."""
    from .._version import __version__
    mine = {
        "zspeed version": __version__,
        "config": config,
        "parameters": [[(n, tuple(full_shape(p)), str(p.dtype)) for n, p in zip(ns, ps)]
                       for ns, ps in zip(names, layout.params)],
        "frozen parameters": [(n, tuple(full_shape(p)), str(p.dtype)) for n, p in module.named_parameters()
                              if id(p) not in layout.index],
        "buffers": [(n, tuple(b.shape), str(b.dtype)) for n, b in module.named_buffers()],
        "device type": device.type,
        "monitor error": monitor_error,
    }
    every = coll.all_gather_object(mine)
    failed = next((o["monitor error"] for o in every if o["monitor error"]), None)
    if failed is not None:
        raise ConfigError(failed)  # (rank 0 makes the folders: its message, on every rank)
    for r, other in enumerate(every):
        for key in mine:
            if other[key] != every[0][key]:
                raise ConfigError(f"rank {r} differs from rank 0 in its {key}: "
                                  f"{_first_difference(every[0][key], other[key])}. Every rank must run "
                                  f"the same script with the same config and model.")


def _first_difference(a, b) -> str:
    """A short description of where two nested values first differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if a.get(k) != b.get(k):
                return f"{k}: {_first_difference(a.get(k), b.get(k))}"
    if isinstance(a, list) and isinstance(b, list):  # tuples are records: shown whole
        if len(a) != len(b):
            return f"{len(b)} entries instead of {len(a)}"
        for x, y in zip(a, b):
            if x != y:
                return _first_difference(x, y)
    return f"{b!r} instead of {a!r}"


def check_memory(plan, placement, config: ZSpeedConfig, module: torch.nn.Module, layout, device) -> tuple:
    """Refuses, before allocating, a configuration whose tensors cannot fit on one of the memory
    tiers (memory.py: the components' footprints, summed per tier). Returns (the needs by tier,
    the sizes they were computed from)."""
    from . import memory
    sizes = placement.sizes(config, module, layout)
    needs = footprint(plan, placement, config, sizes)
    by_tier = memory.by_tier(needs)
    ranks_here = comm.get_local_world_size()
    memory.check_host_memory(by_tier.get("host", {}), placement.host_bytes_freed(layout), ranks_here,
                             memory_fixes(plan, config, "host"))
    memory.check_nvme_space(needs, ranks_here, memory_fixes(plan, config, "nvme"))
    memory.check_gpu_memory(by_tier.get("gpu", {}), memory.gpu_room(device), device, memory_fixes(plan, config, "gpu"))
    return by_tier, sizes


def memory_after_split(plan, placement, config: ZSpeedConfig, sizes, path, by_tier: dict) -> dict:
    """The needs by tier once the optimizer path exists: those of the CPU share and the host
    elements a split's "auto" chose, where it chose; ``by_tier`` otherwise."""
    share = getattr(path, "cpu_share", None)
    if share is None:
        return by_tier
    from .memory import by_tier as sum_by_tier
    kept = getattr(path, "kept_in_cpu", sizes.host_elems)
    return sum_by_tier(footprint(plan, placement, config,
                                 dataclasses.replace(sizes, cpu_share=share, host_elems=kept)))


def scheduler_of(config: ZSpeedConfig, client, basic_optimizer):
    """The LR scheduler: the config's, or the one passed to initialize (a scheduler callable gets
    the basic optimizer, a torch optimizer, which torch's schedulers require, as in DeepSpeed)."""
    if client is not None and config.scheduler_name is not None:
        raise ConfigError("an lr scheduler was given both in the config and as lr_scheduler=; pass only one.")
    if config.scheduler_name is not None:
        return build_scheduler(config.scheduler_name, config.scheduler_params, basic_optimizer)
    if client is not None and callable(client) and not hasattr(client, "step"):
        return client(basic_optimizer)
    return client


def note_inference(config: ZSpeedConfig, lr_scheduler, rank: int) -> None:
    """An engine without an optimizer: says so once, and that a scheduler (passed, or in the
    config) is ignored, as DeepSpeed configures none without an optimizer."""
    if lr_scheduler is not None or config.scheduler_name is not None:
        log.warning("zspeed: no optimizer, so the lr scheduler (%s) is ignored, as in DeepSpeed.",
                    config.scheduler_name or type(lr_scheduler).__name__)
    if rank == 0:
        log.info("zspeed: no optimizer (neither optimizer= nor an 'optimizer' section): the engine runs the "
                 "model's forward only (inference); backward and step raise NoOptimizerError.")


def dataloader(dataset, batch_size: int, collate_fn, shuffle: bool, config: ZSpeedConfig, world_size: int,
               rank: int) -> torch.utils.data.DataLoader:
    """engine.deepspeed_io's loader: batches of ``batch_size``; with several ranks each reads its
    own 1/world_size of every epoch, as DeepSpeed's loader does."""
    seed = config.seed
    drop = config.dataloader_drop_last
    if world_size > 1:
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=0 if seed is None else int(seed),
            drop_last=drop)
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn,
                                           drop_last=drop)
    gen = None if seed is None else torch.Generator().manual_seed(int(seed))
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=collate_fn,
                                       drop_last=drop, generator=gen)


def hook_parameters(params: list, module: torch.nn.Module, on_grad) -> None:
    """``on_grad`` (the engine's gradient hook) on every trained parameter (``params``: per group,
    per parameter), and on the module's parameters with sparse gradients the densifying, first
    of their accumulation hooks (they all see it dense)."""
    for ps in params:
        for p in ps:
            p.register_hook(on_grad)
    for p in sparse_grad_params(module):
        p.register_post_accumulate_grad_hook(densify_grad)


def record_used(plan, module: torch.nn.Module, handles: list) -> set | None:
    """zero_optimization.ignore_unused_parameters false: as DeepSpeed's stage 1-2 CPU offload, a
    step whose trained parameters did not all get a gradient is refused (backward.Accumulation
    checks): the set the module's trained parameters add their id to when their gradient is
    accumulated (the hooks' handles appended to ``handles``); None when nothing is checked."""
    if not plan.check_unused:
        return None
    got: set = set()
    for p in module.parameters():
        if p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(lambda q: got.add(id(q))))
    return got


def announce(config: ZSpeedConfig) -> None:
    """The config's log_level set (before anything logs, as in DeepSpeed), then its warnings
    logged by rank 0."""
    if config.log_level is not None:
        from .logs import set_log_level_from_string
        set_log_level_from_string(config.log_level)
    for w in config.warnings if comm.get_rank() == 0 else ():
        log.warning("zspeed: %s", w)


def world_size_of(config: ZSpeedConfig) -> int:
    """The process group's number of ranks, which must be the one the config was validated for."""
    n = comm.get_world_size()
    if n != config.world_size:
        raise ConfigError(f"the config was validated for a world size of {config.world_size}, but the process group "
                          f"has {n} ranks; pass the config to zspeed.initialize after the process group exists.")
    return n


def place_module(model: torch.nn.Module, placement, layout, config: ZSpeedConfig, param_dtype, buffer_dtype):
    """The model placed by the run's placement (assemble.py: on the device, in the training dtype,
    or partitioned), its floating-point buffers then in ``buffer_dtype`` (None: each as loaded),
    those of data_types.keep_in_fp32_modules in fp32."""
    loaded = float_buffers(model)
    keep = kept_buffers(model, keep_in_fp32_pattern(model, config.keep_in_fp32_modules, param_dtype))
    module = placement.place(model, layout)
    restore_buffers(module, loaded, buffer_dtype, keep)
    return module


def adopt_model(model: torch.nn.Module, config: ZSpeedConfig) -> None:
    """The model taken from earlier engines that still partition it, and its ZeRO-3 leaf modules
    (zero_optimization.leaf_module) marked for the fetcher."""
    _take_from_earlier_engines(model)
    from .z3_leaf import apply_zero_leaf_module_config
    apply_zero_leaf_module_config(model, config.leaf_module)


def _take_from_earlier_engines(model: torch.nn.Module) -> None:
    """A model an earlier engine still partitions at ZeRO-3 (Hugging Face's Trainer builds one
    engine for evaluate() and another for train()): that engine is closed, which puts its current
    weights back into the parameters (zero3.ParamFetcher.hand_back), and the new engine starts
    from them, as DeepSpeed's second initialize() starts from the partitioned parameters."""
    from .zero3 import engines_holding
    for old in engines_holding(model):
        log.warning("zspeed: the model is partitioned by an earlier engine (ZeRO-3); that engine is closed and the "
                    "new one starts from its current weights (in the training dtype: its fp32 masters and "
                    "optimizer state are not carried over; load a checkpoint for those).")
        old.close()
