"""``deepspeed.checkpoint.utils``: ``clone_tensors_for_torch_save`` and
``get_model_ckpt_name_for_rank``."""
from __future__ import annotations

import os

__all__ = ["clone_tensors_for_torch_save", "get_model_ckpt_name_for_rank"]


def get_model_ckpt_name_for_rank(base_folder, mp_rank_str):
    """The file of the module's state in a tag folder ``base_folder``: zspeed's
    ``model.safetensors`` (DeepSpeed's ``mp_rank_<mp>_model_states.pt``; docs/COMPAT.md). zspeed
    has no model parallelism, so the one model-parallel rank is "00"."""
    if str(mp_rank_str) not in ("0", "00"):
        raise ValueError(f"get_model_ckpt_name_for_rank: model-parallel rank {mp_rank_str!r}: zspeed has no "
                         f"model parallelism, so a checkpoint has one module state file (rank '00')")
    return os.path.join(base_folder, "model.safetensors")


def clone_tensors_for_torch_save(item, device=None):
    """A copy of ``item`` (a tensor, or lists, tuples and dicts of them at any depth) in which
    every tensor is a detached clone with storage of its own, on ``device`` (default: where it
    is), so that torch.save writes only the tensor's elements and not the whole storage of the
    view or flat buffer it may live in. Other values are returned as they are."""
    import torch

    if torch.is_tensor(item):
        if device is None:
            return item.detach().clone()
        return item.detach().to(device).clone() if torch.device(device) == item.device \
            else item.detach().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        out = {k: clone_tensors_for_torch_save(v, device) for k, v in item.items()}
        try:
            return type(item)(out)  # OrderedDict and other dict types built from a dict
        except TypeError:  # e.g. defaultdict, whose constructor wants a factory first
            return out
    return item
