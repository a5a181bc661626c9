"""Checkpoints: DeepSpeed's directory layout, safetensors files, crash-safe writes.

Layout::

    save_dir/latest                  the tag of the newest complete checkpoint
    save_dir/<tag>/model.safetensors  module.state_dict() in the training dtype
    save_dir/<tag>/master.safetensors fp32 master weights by parameter name
    save_dir/<tag>/optim.safetensors  optimizer state tensors as "<param name>/<state key>"
    save_dir/<tag>/client.safetensors tensors found in client_state (if any)
    save_dir/<tag>/meta.json          counters, loss scaler, scheduler, optimizer groups,
                                      non-tensor state, client_state, config, save id

Every file is written under a temporary name, fsynced, renamed over its final
name (os.replace) and the directory fsynced. meta.json is written after the
tensor files and ``latest`` last, so a save killed at any point leaves ``latest``
naming the previous complete checkpoint. Each tensor file carries the save's
random id in its metadata, so a tag directory mixing files of two saves (a save
killed while overwriting the same tag) is detected at load time, not loaded.

``main_to_fp32(argv)`` implements ``zspeed to-fp32 CKPT OUT`` (DeepSpeed's
zero_to_fp32): one safetensors file of fp32 weights.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from .._native import ZSpeedError
from .._version import __version__

log = logging.getLogger("zspeed.checkpoint")

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "main_to_fp32", "FORMAT"]

FORMAT = "zspeed-checkpoint-1"
# Test hook: called with each file name right after it is in place (crash tests kill here).
_after_file_written: Callable[[str], None] | None = None


class CheckpointError(ZSpeedError, RuntimeError):
    """A checkpoint cannot be written or is incomplete, corrupt or incompatible."""


def _st():
    try:
        import safetensors.torch as st
    except ImportError:
        raise CheckpointError("zspeed checkpoints need the 'safetensors' package: pip install safetensors") from None
    return st


# -- crash-safe file writing -------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    if os.name == "nt":  # Windows cannot open directories for fsync; NTFS journals renames itself
        return
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(tmp: Path, final: Path) -> None:
    fd = os.open(str(tmp), os.O_RDWR | getattr(os, "O_BINARY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if _after_file_written is not None:
        _after_file_written(final.name)


def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def _write_bytes(final: Path, data: bytes) -> None:
    tmp = _tmp_name(final)
    with open(tmp, "wb") as f:
        f.write(data)
    _commit(tmp, final)


def _write_tensors(final: Path, tensors: dict, meta: dict) -> None:
    st = _st()
    tmp = _tmp_name(final)
    clean = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    st.save_file(clean, str(tmp), metadata=meta)
    _commit(tmp, final)


def _dedupe(tensors: dict) -> tuple[dict, dict]:
    """safetensors refuses shared storage (tied weights): keep one name, record aliases."""
    seen: dict = {}
    out, aliases = {}, {}
    for k, t in tensors.items():
        key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride())) if t.numel() else None
        if key is not None and key in seen:
            aliases[k] = seen[key]
            continue
        if key is not None:
            seen[key] = k
        out[k] = t
    return out, aliases


# -- client_state (JSON with tensors pulled out) ------------------------------------------------------
def _encode_client(obj: Any, path: str, tensors: dict):
    if torch.is_tensor(obj):
        key = f"client/{len(tensors)}"
        tensors[key] = obj
        return {"__tensor__": key}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise CheckpointError(f"client_state key {k!r} at '{path}' is not a string; "
                                      f"zspeed stores client_state as JSON (use string keys).")
            out[k] = _encode_client(v, f"{path}.{k}", tensors)
        return out
    if isinstance(obj, (list, tuple)):
        return [_encode_client(v, f"{path}[{i}]", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    raise CheckpointError(f"client_state value at '{path}' has type {type(obj).__name__}, which zspeed "
                          f"cannot store: client_state may hold dicts, lists, numbers, strings, None and "
                          f"torch tensors.")


def _decode_client(obj: Any, tensors: dict):
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        return {k: _decode_client(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_client(v, tensors) for v in obj]
    return obj


# -- save ---------------------------------------------------------------------------------------
def _optimizer_payload(engine) -> tuple[dict, dict]:
    """(tensors "<name>/<key>", JSON part) of the optimizer's state_dict."""
    sd = engine.optimizer.state_dict()
    names = [n for row in engine._names for n in row]
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        name = names[int(idx)]
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{name}/{k}"] = v
            else:
                scalars.setdefault(name, {})[k] = v
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
              for g in sd["param_groups"]]
    return tensors, {"class": engine.optimizer_path.checkpoint_class, "param_groups": groups,
                     "scalars": scalars}


def save_checkpoint(engine, save_dir, tag=None, client_state: dict | None = None, save_latest: bool = True) -> bool:
    """Writes ``save_dir/<tag>`` (default tag: ``global_step<N>``); returns True like DeepSpeed."""
    tag = f"global_step{engine.global_steps}" if tag is None else str(tag)
    if not tag or "/" in tag or "\\" in tag or tag in (".", "..") or tag.startswith("."):
        raise CheckpointError(f"checkpoint tag {tag!r} is not a valid directory name; use e.g. 'step100'.")
    root = Path(save_dir)
    d = root / tag
    d.mkdir(parents=True, exist_ok=True)
    save_id = secrets.token_hex(8)
    meta_common = {"format": FORMAT, "save_id": save_id}

    model_sd = {k: v for k, v in engine.module.state_dict().items() if torch.is_tensor(v)}
    model_t, aliases = _dedupe(model_sd)
    _write_tensors(d / "model.safetensors", model_t, meta_common)
    _write_tensors(d / "master.safetensors", engine._master_named(), meta_common)
    opt_t, opt_json = _optimizer_payload(engine)
    _write_tensors(d / "optim.safetensors", opt_t, meta_common)
    client_tensors: dict = {}
    client_json = _encode_client(client_state or {}, "client_state", client_tensors)
    files = ["model.safetensors", "master.safetensors", "optim.safetensors"]
    if client_tensors:
        _write_tensors(d / "client.safetensors", client_tensors, meta_common)
        files.append("client.safetensors")
    sched = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None and \
        hasattr(engine.lr_scheduler, "state_dict") else None
    meta = {
        **meta_common, "zspeed_version": __version__, "tag": tag, "files": files,
        "global_steps": engine.global_steps, "global_samples": engine.global_samples,
        "micro_steps": engine.micro_steps, "skipped_steps": engine.skipped_steps,
        "dtype": str(engine.dtype).replace("torch.", ""),
        "param_names": engine._names, "model_aliases": aliases,
        "loss_scaler": engine.loss_scaler.state_dict(), "lr_scheduler": sched,
        "optimizer": opt_json, "client_state": client_json, "config": engine.config,
    }
    try:
        text = json.dumps(meta, indent=1, default=_json_default)
    except TypeError as e:
        raise CheckpointError(f"checkpoint metadata is not JSON-serializable: {e}") from None
    _write_bytes(d / "meta.json", text.encode())
    if save_latest:
        _write_bytes(root / "latest", tag.encode())
    log.info("zspeed: saved checkpoint %s", d)
    return True


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON-serializable")


# -- load ---------------------------------------------------------------------------------------
def resolve_tag_dir(load_dir, tag=None) -> Path | None:
    root = Path(load_dir)
    if tag is None:
        latest = root / "latest"
        if not latest.is_file():
            return None
        tag = latest.read_text().strip()
    return root / str(tag)


def _read_meta(d: Path) -> dict:
    mp = d / "meta.json"
    if not mp.is_file():
        raise CheckpointError(f"checkpoint '{d}' is incomplete: meta.json is missing (the save that wrote it "
                              f"was interrupted). Load an earlier tag, or the one named in 'latest'.")
    try:
        meta = json.loads(mp.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint '{mp}' is not valid JSON ({e}); the file is corrupt.") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"'{d}' is not a zspeed checkpoint (format {meta.get('format')!r}, "
                              f"expected {FORMAT!r}).")
    return meta


def _read_tensors(d: Path, name: str, meta: dict, device="cpu") -> dict:
    st = _st()
    p = d / name
    if not p.is_file():
        raise CheckpointError(f"checkpoint '{d}' is incomplete: {name} is missing.")
    try:
        from safetensors import safe_open
        with safe_open(str(p), framework="pt", device=str(device)) as f:
            fmeta = f.metadata() or {}
            if fmeta.get("save_id") != meta["save_id"]:
                raise CheckpointError(
                    f"checkpoint '{d}' mixes files of two saves ({name} has save id "
                    f"{fmeta.get('save_id')!r}, meta.json {meta['save_id']!r}): a save over this tag was "
                    f"interrupted. Load another tag.")
            return {k: f.get_tensor(k) for k in f.keys()}
    except CheckpointError:
        raise
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise CheckpointError(f"cannot read '{p}': {e}. The file is truncated or corrupt.") from None
    finally:
        del st


def _check_shapes(what: str, expected: dict, got: dict, strict: bool) -> None:
    missing = [k for k in expected if k not in got]
    unexpected = [k for k in got if k not in expected]
    bad = [f"{k}: checkpoint {tuple(got[k].shape)} vs model {tuple(expected[k].shape)}"
           for k in expected if k in got and tuple(got[k].shape) != tuple(expected[k].shape)]
    problems = []
    if missing and strict:
        problems.append(f"missing {len(missing)}: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if unexpected and strict:
        problems.append(f"unexpected {len(unexpected)}: {', '.join(unexpected[:8])}"
                        f"{' ...' if len(unexpected) > 8 else ''}")
    if bad:
        problems.append("shape mismatch: " + "; ".join(bad[:8]))
    if problems:
        raise CheckpointError(f"{what} does not match the model ({' | '.join(problems)}). Build the same "
                              f"model as when the checkpoint was saved"
                              f"{', or pass load_module_strict=False' if (missing or unexpected) else ''}.")


def load_checkpoint(engine, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                    load_lr_scheduler_states=True):
    """Restores a checkpoint; returns (path, client_state) or (None, None) if there is none."""
    d = resolve_tag_dir(load_dir, tag)
    if d is None:
        log.warning("zspeed: no 'latest' file in %s: no checkpoint loaded", load_dir)
        return None, None
    if not d.is_dir():
        log.warning("zspeed: checkpoint %s does not exist: no checkpoint loaded", d)
        return None, None
    meta = _read_meta(d)
    model_sd = engine.module.state_dict()
    saved = _read_tensors(d, "model.safetensors", meta)
    for alias, target in meta.get("model_aliases", {}).items():
        if target in saved:
            saved[alias] = saved[target]
    _check_shapes(f"model weights in '{d}'", {k: v for k, v in model_sd.items() if torch.is_tensor(v)}, saved,
                  load_module_strict)
    masters = _read_tensors(d, "master.safetensors", meta)
    mine = engine._master_shapes()
    if load_optimizer_states:
        _check_shapes(f"fp32 master weights in '{d}'", mine, masters, True)
    opt_t = _read_tensors(d, "optim.safetensors", meta) if load_optimizer_states else {}
    client_t = _read_tensors(d, "client.safetensors", meta) if "client.safetensors" in meta.get("files", []) else {}

    # Everything is read and validated: now modify the engine.
    engine.module.load_state_dict({k: v for k, v in saved.items() if k in model_sd}, strict=False)
    if load_optimizer_states:
        engine._load_masters({n: masters[n] for n in mine})
    else:  # weights only: masters follow the (possibly low-precision) model weights
        params = dict(engine.module.named_parameters())
        engine._load_masters({n: params[n].detach().to(torch.float32) for n in mine})
    if load_optimizer_states:
        _load_optimizer(engine, meta, opt_t, d)
        engine.loss_scaler.load_state_dict(meta["loss_scaler"])
        engine.global_steps = int(meta["global_steps"])
        engine.global_samples = int(meta["global_samples"])
        engine.micro_steps = int(meta["micro_steps"])
        engine.skipped_steps = int(meta["skipped_steps"])
    if load_lr_scheduler_states and engine.lr_scheduler is not None and meta.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(meta["lr_scheduler"])
    client = _decode_client(meta.get("client_state", {}), client_t)
    log.info("zspeed: loaded checkpoint %s", d)
    return str(d), client


def _load_optimizer(engine, meta: dict, tensors: dict, d: Path) -> None:
    names = [n for row in engine._names for n in row]
    saved_names = [n for row in meta["param_names"] for n in row]
    if [len(r) for r in meta["param_names"]] != [len(r) for r in engine._names] or saved_names != names:
        raise CheckpointError(f"optimizer state in '{d}' was saved for different parameter groups "
                              f"({len(saved_names)} parameters) than this engine has ({len(names)}); "
                              f"pass load_optimizer_states=False to load the weights only.")
    opt = meta["optimizer"]
    mine = engine.optimizer_path.checkpoint_class
    if opt["class"] != mine:
        raise CheckpointError(f"optimizer state in '{d}' belongs to {opt['class']}, but this engine runs "
                              f"{mine}; pass load_optimizer_states=False.")
    state: dict = {}
    for i, n in enumerate(names):
        st = {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith(n + "/")
              and "/" not in k[len(n) + 1:]}
        st.update(opt["scalars"].get(n, {}))
        if st:
            state[i] = st
    groups, start = [], 0
    for g, row in zip(opt["param_groups"], engine._names):
        g = dict(g)
        if "betas" in g and isinstance(g["betas"], list):
            g["betas"] = tuple(g["betas"])
        g["params"] = list(range(start, start + len(row)))
        start += len(row)
        groups.append(g)
    try:
        engine.optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"optimizer state in '{d}' cannot be loaded: {e}") from None


# -- zspeed to-fp32 -----------------------------------------------------------------------------
def consolidate_fp32(ckpt: str | os.PathLike, out: str | os.PathLike, tag: str | None = None) -> Path:
    """One safetensors file with every model tensor in fp32 (masters where trained)."""
    root = Path(ckpt)
    d = root if (root / "meta.json").is_file() else resolve_tag_dir(root, tag)
    if d is None or not d.is_dir():
        raise CheckpointError(f"no checkpoint at '{ckpt}': expected a tag directory (with meta.json) or a "
                              f"directory with a 'latest' file.")
    meta = _read_meta(d)
    model = _read_tensors(d, "model.safetensors", meta)
    masters = _read_tensors(d, "master.safetensors", meta)
    result = {}
    for k, t in model.items():
        src = masters.get(k, t)
        result[k] = src.to(torch.float32) if src.is_floating_point() else src
    for k, t in masters.items():
        result.setdefault(k, t.to(torch.float32))
    aliases = meta.get("model_aliases", {})
    outp = Path(out)
    outp.parent.mkdir(parents=True, exist_ok=True)
    _write_tensors(outp, result, {"format": "zspeed-fp32", "source": str(d), "aliases": json.dumps(aliases)})
    return outp


def main_to_fp32(argv: list[str] | None = None) -> int:
    """``zspeed to-fp32 CKPT OUT [--tag TAG]``: DeepSpeed's zero_to_fp32 for zspeed checkpoints."""
    import argparse
    ap = argparse.ArgumentParser(prog="zspeed to-fp32",
                                 description="Consolidate a zspeed checkpoint's weights into one fp32 "
                                             "safetensors file.")
    ap.add_argument("checkpoint", help="checkpoint directory (with 'latest') or one tag directory")
    ap.add_argument("output", help="output .safetensors file")
    ap.add_argument("--tag", default=None, help="tag to read (default: the one in 'latest')")
    a = ap.parse_args(argv)
    try:
        out = consolidate_fp32(a.checkpoint, a.output, a.tag)
    except CheckpointError as e:
        print(f"zspeed to-fp32: {e}", file=sys.stderr)
        return 1
    n = sum(t.numel() for t in _st().load_file(str(out)).values())
    print(f"wrote {out} ({n} fp32 values)")
    return 0
