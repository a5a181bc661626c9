"""DeepSpeed's ``deepspeed.utils`` names that training scripts use: the ``logger``,
``log_dist`` / ``log_dist_once`` (log on chosen ranks), ``set_log_level_from_string``,
``RepeatingLoader``, ``required_torch_version`` (also as ``deepspeed.utils.torch``) and the
ZeRO-3 leaf modules (``set_z3_leaf_modules`` and its siblings, z3_leaf_module.py).

The logger is the standard ``logging`` logger named "zspeed" (every zspeed module logs
under it). As a library, zspeed adds no handler of its own: a script that wants zspeed's
info messages configures logging (``logging.basicConfig(level=logging.INFO)``) or calls
``set_log_level_from_string("info")``, which also gives the logger a handler when the
application has none, so the messages appear.
"""
from __future__ import annotations

from . import logging  # noqa: F401  (deepspeed.utils.logging)
from ..runtime.dataloader import RepeatingLoader
from .tensor_fragment import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,
                              safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
                              safe_set_full_fp32_param, safe_set_full_grad, safe_set_full_optimizer_state,
                              safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
                              safe_update_full_grad_vectorized)
from .tensor_fragment import __all__ as _FRAGMENT_NAMES
from .logging import (get_current_level, get_dist_msg, get_log_level_from_string, log_dist, log_dist_once, logger,
                      print_dist, set_log_level_from_string, should_log_le)
from .nvtx import instrument_w_nvtx
from .z3_leaf_module import (get_z3_leaf_modules, set_z3_leaf_modules, set_z3_leaf_modules_by_name,
                             set_z3_leaf_modules_by_suffix, unset_z3_leaf_modules, z3_leaf_module,
                             z3_leaf_parameter)

__all__ = ["logger", "log_dist", "log_dist_once", "print_dist", "set_log_level_from_string",
           "get_log_level_from_string", "get_current_level", "should_log_le", "RepeatingLoader", "get_dist_msg", "required_torch_version",
           "set_z3_leaf_modules", "unset_z3_leaf_modules", "get_z3_leaf_modules", "set_z3_leaf_modules_by_name",
           "set_z3_leaf_modules_by_suffix", "z3_leaf_module", "z3_leaf_parameter", "instrument_w_nvtx",
           *_FRAGMENT_NAMES]

def _release(version: str) -> tuple:
    """(release numbers, 0 for a pre-release or dev build else 1) of a version string such as
    "2.11.0+cu130", "2.5.0a0" or 2.1; the local part after "+" does not count."""
    import re
    text = str(version).split("+", 1)[0].strip()
    m = re.match(r"v?(\d+(?:\.\d+)*)(.*)$", text)
    if m is None:
        raise ValueError(f"required_torch_version: {version!r} is not a version (write it as 2.1 or '2.1.0')")
    nums = [int(x) for x in m.group(1).split(".")]
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    rest = m.group(2).lower().lstrip(".-_")
    return tuple(nums), 0 if rest.startswith(("a", "b", "c", "rc", "pre", "dev")) else 1


def required_torch_version(min_version=None, max_version=None) -> bool:
    """DeepSpeed's ``deepspeed.utils.torch.required_torch_version``: whether the installed
    torch is at least ``min_version`` and at most ``max_version`` (either may be left out, not
    both; numbers such as 2.1 or strings such as "2.1.0"). A pre-release (2.5.0a0) counts as
    below its release."""
    if min_version is None and max_version is None:
        raise ValueError("required_torch_version: give min_version, max_version or both")
    from .._requires import require_torch
    require_torch()
    import torch
    have = _release(torch.__version__)
    if min_version is not None and have < _release(min_version):
        return False
    if max_version is not None and have > _release(max_version):
        return False
    return True
