"""Every rank starts from rank 0's weights.

Ranks build their model independently (each from its own random init, or rank 0 alone
from a pretrained file), so right after construction their weights may differ. Data
parallelism assumes they do not: at stage 0 each rank would train its own model forever,
and at stages 1-3 each rank's shard would come from its own init, a hybrid. DeepSpeed
broadcasts rank 0's parameters while it builds the engine; zspeed does the same at every
stage, before anything is partitioned, and also rank 0's buffers (running statistics,
for instance), as torch's DistributedDataParallel does.

Parameters that ``zero.Init`` already cut into shards were broadcast by it as they were
made (zero/__init__.py) and are left alone here.

The tensors travel as bytes, in flat buckets of at most ``BUCKET_BYTES``: one code path
for every dtype (bool and integer buffers included), a bounded staging buffer whatever
the model's size, and on NCCL the bucket on the device while the tensors stay where
they are (host memory at ZeRO-3).
"""
from __future__ import annotations

import itertools

import torch
import torch.distributed as td

__all__ = ["broadcast_module", "BUCKET_BYTES"]

BUCKET_BYTES = 64 << 20
_ALIGN = 16  # bytes: the largest element size of any dtype (complex128)


def _replicated(module: torch.nn.Module) -> list:
    """The module's parameters and buffers that hold whole values, each once."""
    out, seen = [], set()
    for t in itertools.chain(module.parameters(), module.buffers()):
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        if hasattr(t, "ds_tensor") or t.device.type == "meta" or t.numel() == 0:
            continue  # zero.Init's shards (broadcast when cut), placeholders, empty tensors
        out.append(t)
    return out


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    return flat.view(torch.uint8)


def broadcast_module(module: torch.nn.Module, comm, src: int = 0, bucket_bytes: int = BUCKET_BYTES) -> int:
    """Overwrites every whole parameter and buffer of ``module`` with rank ``src``'s values
    (every rank must call it with the same module structure; the engine checks that first).
    ``comm``: the run's comm strategy (collectives.py); with one rank nothing moves. Returns
    the number of bytes broadcast."""
    if comm.solo:
        return 0
    comm_device, group = comm.device, comm.group
    tensors = _replicated(module)
    me = td.get_rank(group) if group is not None else td.get_rank()
    total, i = 0, 0
    with torch.no_grad():
        while i < len(tensors):
            bucket, n = [], 0  # (tensor, byte offset in the bucket)
            while i < len(tensors):
                nb = tensors[i].numel() * tensors[i].element_size()
                if bucket and n + nb > bucket_bytes:
                    break
                bucket.append((tensors[i], n))
                n += -(-nb // _ALIGN) * _ALIGN  # each tensor starts aligned, so its bytes view as its dtype
                i += 1
            flat = torch.zeros(n, dtype=torch.uint8, device=comm_device)
            if me == src:
                for t, at in bucket:
                    flat[at:at + t.numel() * t.element_size()].copy_(_as_bytes(t))
            td.broadcast(flat, src=src, group=group)
            if me != src:
                for t, at in bucket:
                    piece = flat[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
                    t.data.copy_(piece)
            total += n
    return total
