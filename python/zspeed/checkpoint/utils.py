"""``deepspeed.checkpoint.utils.clone_tensors_for_torch_save``."""
from __future__ import annotations

__all__ = ["clone_tensors_for_torch_save"]


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
