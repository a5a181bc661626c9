"""What the checkpoint tests share: a snapshot of everything a load may change, its comparison,
and edits of a saved checkpoint that keep its manifest consistent (so that what follows tests
the validation of the contents, not the integrity check)."""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import torch


def snapshot(e) -> dict:
    """Everything a load may change, copied."""
    def clone(x):
        if torch.is_tensor(x):
            return x.detach().clone()
        if isinstance(x, dict):
            return {k: clone(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(clone(v) for v in x)
        return x
    return {"model": clone(e.module.state_dict()), "masters": clone(e._master_named()),
            "optim": clone(e.optimizer.state_dict()),
            "counters": (e.global_steps, e.global_samples, e.micro_steps, e.skipped_steps),
            "scale": e.loss_scale, "lr": e.get_lr(),
            "sched": clone(e.lr_scheduler.state_dict()) if e.lr_scheduler is not None else None}


def whole_masters(e) -> dict:
    """name -> fp32 master shaped like the parameter. Over a store's local space the engine names
    pieces ("name@offset", flat); on one rank (an offloaded optimizer's store) each piece is a
    whole parameter, "name@0", and is given its parameter's name and shape here."""
    shapes = {n: p.shape for n, p in e.module.named_parameters()}
    out = {}
    for k, m in e._master_named().items():
        name, _, off = k.rpartition("@")
        if off == "0" and name in shapes and m.numel() == shapes[name].numel():
            k, m = name, m.reshape(shapes[name])
        out[k] = m
    return out


def same(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def rewrite(tag_dir: Path, name: str, data: bytes) -> None:
    """Replaces a file of a checkpoint and its manifest entry, as a buggy or hostile writer
    would: the integrity check passes, so what follows tests the validation of the contents."""
    (tag_dir / name).write_bytes(data)
    m = json.loads((tag_dir / "manifest.json").read_text())
    m["files"][name] = {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}
    (tag_dir / "manifest.json").write_text(json.dumps(m))


def edit_meta(tag_dir: Path, fn) -> None:
    meta = json.loads((tag_dir / "meta.json").read_text())
    out = fn(meta)  # edits in place, or returns a list to replace the whole object
    meta = out if isinstance(out, list) else meta
    rewrite(tag_dir, "meta.json", json.dumps(meta).encode())


def leftovers(d: Path) -> list:
    return sorted(n for n in os.listdir(d) if n.startswith(".") and n != ".zspeed-lock")
