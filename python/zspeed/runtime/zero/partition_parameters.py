"""DeepSpeed's ``deepspeed.runtime.zero.partition_parameters``: the names scripts and Hugging
Face transformers import from it.

``Init``, ``GatheredParameters`` and ``register_external_parameter`` are zspeed's (see the
package). ``zero_wrapper_for_fp_tensor_constructor`` and ``_orig_torch_arange`` exist
because transformers replaces the former around ``zero.Init`` (to keep ``torch.arange``'s
dtype): DeepSpeed's Init redirects tensor constructors to the device and dtype, zspeed's
does not (it converts each module's parameters when its constructor returns), so the
wrapper returns the constructor unchanged and replacing it changes nothing.
``ZeroParamStatus`` has DeepSpeed's values; a partitioned parameter is NOT_AVAILABLE between
uses.
"""
from __future__ import annotations

import torch

from . import GatheredParameters, Init, ZeroParamStatus, register_external_parameter  # noqa: F401
from . import _contradicting_single_rank_pg_error  # noqa: F401

__all__ = ["Init", "GatheredParameters", "register_external_parameter", "ZeroParamStatus",
           "zero_wrapper_for_fp_tensor_constructor"]

_orig_torch_arange = torch.arange


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype=None, target_device=None):
    """DeepSpeed's hook point for tensor constructors under Init; zspeed's Init leaves
    constructors alone, so this returns ``fn``."""
    del target_fp_dtype, target_device
    return fn


def get_accelerator():
    from ...accelerator import get_accelerator as _get
    return _get()
