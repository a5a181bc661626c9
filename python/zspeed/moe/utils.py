"""``deepspeed.moe.utils`` helpers for models without expert parameters.

DeepSpeed marks expert parameters with ``param.allreduce = False`` (its MoE layer does);
zspeed has no MoE layer, so any such parameter came from code that expects expert
parallelism, and the helpers refuse it rather than train it wrongly."""
from __future__ import annotations

from typing import Any

from .layer import MoENotSupported

__all__ = ["is_moe_param", "has_moe_layers", "split_params_into_different_moe_groups_for_optimizer",
           "split_params_into_shared_and_expert_params", "is_moe_param_group"]


def is_moe_param(param) -> bool:
    """True for a parameter DeepSpeed would treat as an expert parameter (allreduce False)."""
    return hasattr(param, "allreduce") and not param.allreduce


def has_moe_layers(module) -> tuple[bool, int]:
    """(False, 0): zspeed has no MoE layers."""
    del module
    return False, 0


def is_moe_param_group(param_group: dict) -> bool:
    return bool(param_group.get("moe", False))


def _refuse(where: str):
    raise MoENotSupported(
        f"{where}: a parameter is marked as a mixture-of-experts expert parameter (allreduce=False), "
        f"but zspeed has no expert parallelism; train the model without MoE layers.")


def split_params_into_shared_and_expert_params(params) -> tuple[list, list]:
    """(all params, []) for a model without expert parameters."""
    params = list(params)
    if any(is_moe_param(p) for p in params):
        _refuse("split_params_into_shared_and_expert_params")
    return params, []


def split_params_into_different_moe_groups_for_optimizer(param_groups: Any, max_group_size=178956971) -> list:
    """DeepSpeed's helper that moves expert parameters into groups of their own. Without
    expert parameters (the only case zspeed trains) the groups are returned unchanged, as a
    list: a dict becomes a one-group list and a tuple becomes a list, as in DeepSpeed.
    ``max_group_size`` is accepted for DeepSpeed's signature; it applies to expert groups only."""
    del max_group_size
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"param_groups must be a dict, a list or a tuple of dicts, not "
                         f"{type(param_groups).__name__}")
    for group in param_groups:
        group["params"] = list(group["params"])
        if any(is_moe_param(p) for p in group["params"]):
            _refuse("split_params_into_different_moe_groups_for_optimizer")
    return param_groups
