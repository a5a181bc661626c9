"""Checkpoints of the engine: DeepSpeed's folder layout, safetensors files, all-or-nothing
saves and loads, for one process or several data-parallel ranks.

Layout::

    save_dir/latest                     the tag of the newest checkpoint
    save_dir/<tag>/manifest.json        every file below with its size and CRC-32
    save_dir/<tag>/model.safetensors    module.state_dict() in the training dtype
    save_dir/<tag>/master.safetensors   fp32 master weights by parameter name
    save_dir/<tag>/optim.safetensors    optimizer state tensors as "<param name>/<state key>"
    save_dir/<tag>/client.safetensors   tensors found in client_state (if any)
    save_dir/<tag>/meta.json            counters, loss scaler, scheduler, optimizer groups,
                                        non-tensor state, client_state, config, world_size

Where a store keeps the parameters as pieces (several ranks at ZeRO stage 1 or 2, and
ZeRO-3 at any rank count), master.safetensors and optim.safetensors are replaced by each
rank's partition files, master.rank<r>.safetensors and optim.rank<r>.safetensors, and
meta.json records the partition (checkpoint_shards.py); _WholeFiles and _PieceFiles are the
two, chosen once from the store. One save and one load serve any number of ranks: with one
the exchanges between the phases are the rank's own results, and an error is raised as it
was.

How the folder is written and read (transactions, the manifest, crash safety) is
checkpoint_files.py. This module turns the engine into those files and back:

- save: everything that can be refused (the tag, client_state, the metadata) is
  checked before the first byte is written; the files then go into one transaction.
  With several ranks every rank calls save: rank 0 opens the transaction and writes
  the shared files, every rank writes its own partition files into the same staging
  folder, and rank 0 commits only when every rank succeeded (else every rank raises
  the same CheckpointError and nothing becomes visible).
- load: every file is verified and everything is read and checked against the
  engine first (shapes, dtypes, optimizer class and groups, every meta.json field,
  the loss scaler, the scheduler); only then is the engine changed. A failure is a
  CheckpointError naming the file and the field, and leaves the engine as it was.
  With several ranks each rank reads what it needs and the ranks compare their
  results before any of them changes: every rank loads, or none changes. A
  checkpoint loads at any world size: each rank reads the ranges of the saved
  pieces that overlap its own (checkpoint_shards.PieceReader).

Across precisions and state dtypes: the loss scaler follows loss_scaler.py (an fp16
scale never reaches a bf16/fp32 engine); the optimizer's state dtype
(``state_dtype``: fp32, bf16 or int8 for zspeed's Adam) is the engine's configured
one, and saved states are converted to it, on the cpu and nvme paths alike.

``zspeed to-fp32`` (DeepSpeed's zero_to_fp32) is checkpoint_fp32.py.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
from pathlib import Path
from typing import Any

import torch

from .._optimizers import checkpoint_classes
from .._version import __version__
from .store import full_numel, per_element
from .checkpoint_files import (CheckpointError, Deferred, LoadIncompleteError,
                               SaveTransaction, StagingWriter, TagMismatchError, is_tensor, materialized, reading,
                               real, validate_tag)
from .checkpoint_read import _MAX_JSON, _MAX_JSON_DEPTH, CheckpointReader, json_depth, open_for_load
from .checkpoint_shards import (PieceReader, all_gather, describe, master_file, optim_file, partition_meta,
                                piece_key, raise_failed, saved_world_size)
from .loss_scaler import check_state_dict as _check_scaler_state
from .nvme import nvme_tiers
from .parts import Lockstep
from .optimizers import adam_state_dtype, convert_adam_state

log = logging.getLogger("zspeed.checkpoint")

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "FORMAT"]

FORMAT = "zspeed-checkpoint-2"
_MISSING = object()


# -- client_state (JSON with tensors pulled out) ------------------------------------------------
# A tensor is stored as {"__tensor__": "<key in client.safetensors>"}. A user's own dict whose only
# key is "__tensor__" or "__dict__" is wrapped as {"__dict__": {...}}, so no user value can be
# mistaken for a tensor reference.
_REF, _WRAP = "__tensor__", "__dict__"


# meta.json holds client_state one level down (what wrapping or tensor references add is
# caught by the check of the whole meta.json in _prepare).
_CLIENT_DEPTH = _MAX_JSON_DEPTH - 2


def _encode_client(obj: Any, path: str, tensors: dict, depth: int = 0):
    if depth > _CLIENT_DEPTH and isinstance(obj, (dict, list, tuple)):
        raise CheckpointError(f"client_state at '{path}' is nested more than {_CLIENT_DEPTH} levels deep; a zspeed "
                              f"checkpoint holds JSON nested at most {_MAX_JSON_DEPTH} levels (a load refuses "
                              f"deeper). Flatten it, or store it as a tensor.")
    if torch.is_tensor(obj):
        key = f"client/{len(tensors)}"
        tensors[key] = obj
        return {_REF: key}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise CheckpointError(f"client_state key {k!r} at '{path}' is not a string; "
                                      f"zspeed stores client_state as JSON (use string keys).")
            out[k] = _encode_client(v, f"{path}.{k}", tensors, depth + 1)
        return {_WRAP: out} if len(out) == 1 and next(iter(out)) in (_REF, _WRAP) else out
    if isinstance(obj, (list, tuple)):
        return [_encode_client(v, f"{path}[{i}]", tensors, depth + 1) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    raise CheckpointError(f"client_state value at '{path}' has type {type(obj).__name__}, which zspeed "
                          f"cannot store: client_state may hold dicts, lists, numbers, strings, None and "
                          f"torch tensors.")


def _client_refs(obj: Any) -> set:
    """The keys of client.safetensors that client_state refers to (the tensors a load reads)."""
    refs, stack = set(), [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            if len(o) == 1 and isinstance(o.get(_REF), str):
                refs.add(o[_REF])
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return refs


def _decode_client(obj: Any, tensors: dict, where: str):
    if isinstance(obj, dict):
        if len(obj) == 1 and _REF in obj:
            key = obj[_REF]
            if not isinstance(key, str) or key not in tensors:
                raise CheckpointError(f"'{where}': client_state refers to tensor {key!r}, which "
                                      f"client.safetensors does not hold; the checkpoint is corrupt.")
            return tensors[key]
        if len(obj) == 1 and _WRAP in obj and isinstance(obj[_WRAP], dict):
            obj = obj[_WRAP]
        return {k: _decode_client(v, tensors, where) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_client(v, tensors, where) for v in obj]
    return obj


# -- save ---------------------------------------------------------------------------------------
def _dedupe(tensors: dict) -> tuple[dict, dict]:
    """Tied weights (shared storage) are stored once: keep one name, record the aliases."""
    seen: dict = {}
    out, aliases = {}, {}
    for k, t in tensors.items():
        if isinstance(t, Deferred):  # a ZeRO-3 weight gathered when written: tied ones share the object
            key = ("deferred", id(t))
        else:
            key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride())) if t.numel() else None
        if key is not None and key in seen:
            aliases[k] = seen[key]
            continue
        if key is not None:
            seen[key] = k
        out[k] = t
    return out, aliases


def _optimizer_payload(ck) -> tuple[dict, dict]:
    """(tensors "<name>/<key>", JSON part) of the optimizer's state_dict (its state as the path
    saves it: Deferred tensors where it lives in swap files)."""
    names = [n for row in ck.optim.names for n in row]
    tensors, scalars = {}, {}
    for idx, st in ck.optim.path.saved_state().items():
        name = names[int(idx)]
        for k, v in st.items():
            if is_tensor(v):
                tensors[f"{name}/{k}"] = v
            else:
                scalars.setdefault(name, {})[k] = v
    return tensors, {"class": ck.optim.checkpoint_class, "param_groups": _groups_json(ck),
                     "scalars": scalars}



def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON-serializable")


class _Save:
    """What a save writes, prepared and checked before the first byte is written."""
    tag: str
    save_id: str | None
    meta: bytes | None         # meta.json (the rank that writes the shared files)
    gathers: Lockstep          # the ZeRO-3 weights' gathers, made as model.safetensors is written
    model: dict | None         # model.safetensors
    client: dict | None        # client.safetensors (None: no tensors in client_state)
    optim: dict | None         # optim.safetensors (one process's layout)


def _groups_json(ck) -> list:
    return [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
            for g in ck.optim.optimizer.param_groups]


class _WholeFiles:
    """The optimizer state of whole parameters (the model's own, replicated on every rank): rank
    0 writes master.safetensors and optim.safetensors, meta.json holds the non-tensor state."""
    every_rank_writes = False

    def world_size(self, ck) -> int:
        return 1

    def optimizer(self, ck, sv: "_Save", meta: dict) -> dict:
        """meta.json's "optimizer" (and what else meta.json records of the layout)."""
        sv.optim, opt_json = _optimizer_payload(ck)
        return opt_json

    def write(self, ck, w: StagingWriter, sv: "_Save", file_meta: dict, rank: int) -> dict:
        if sv.optim is None:  # not the rank that writes the shared files
            return {}
        return {"master.safetensors": w.write_tensors("master.safetensors", ck.optim.master_named(saved=True),
                                                      file_meta),
                "optim.safetensors": w.write_tensors("optim.safetensors", sv.optim, file_meta)}


class _PieceFiles(_WholeFiles):
    """The optimizer state of a store's pieces (sharded over the ranks, or partitioned at ZeRO-3,
    one rank too): every rank writes master.rank<r> and optim.rank<r> (checkpoint_shards.py),
    meta.json records the partition."""
    every_rank_writes = True

    def world_size(self, ck) -> int:
        return ck.world_size

    def optimizer(self, ck, sv: "_Save", meta: dict) -> dict:
        meta["partition"] = partition_meta(ck.optim.store.plan)
        return {"class": ck.optim.checkpoint_class, "param_groups": _groups_json(ck), "scalars": {}}

    def write(self, ck, w: StagingWriter, sv: "_Save", file_meta: dict, rank: int) -> dict:
        return _write_partition(ck, w, file_meta, rank)


def _files_of(ck) -> _WholeFiles:
    """How ``ck``'s optimizer state goes into files: whole parameters, or a store's pieces."""
    return _FILES[ck.optim.store is not None]


_FILES = {False: _WholeFiles(), True: _PieceFiles()}


def optimizer_file(ck) -> str:
    """The name of the file in a tag folder that holds this rank's optimizer state, as ``ck`` saves
    it (the engine's ``_get_optimizer_ckpt_name``)."""
    return f"optim.rank{ck.rank}.safetensors" if _files_of(ck).every_rank_writes else "optim.safetensors"


def _prepare(ck, tag, client_state, *, shared: bool) -> _Save:
    """The tag and, for the rank that writes the shared files, everything they hold."""
    sv = _Save()
    sv.tag = validate_tag(f"global_step{ck.counters.global_steps}" if tag is None else tag)
    sv.save_id = sv.meta = sv.model = sv.client = sv.optim = None
    # ZeRO-3: every rank takes part in gathering the whole weights, one at a time as rank 0
    # writes them (the others drain sv.gathers in the same order).
    sv.gathers = Lockstep()
    model_sd = ck.model.state_for_save(sv.gathers)
    if not shared:
        return sv
    files = _files_of(ck)
    client_tensors: dict = {}
    client_json = _encode_client(client_state or {}, "client_state", client_tensors)
    sv.model, aliases = _dedupe(model_sd)
    sched = ck.scheduler
    has_sched = sched is not None and hasattr(sched, "state_dict")
    sv.save_id = secrets.token_hex(8)
    meta = {
        "format": FORMAT, "save_id": sv.save_id, "zspeed_version": __version__, "tag": sv.tag,
        **ck.counters.state_dict(),
        "dtype": str(ck.dtype).replace("torch.", ""),
        "param_names": ck.optim.names, "model_aliases": aliases,
        "loss_scaler": ck.scaler.state_dict(),
        "lr_scheduler": sched.state_dict() if has_sched else None,
        "lr_scheduler_class": type(sched).__name__ if has_sched else None,
        "optimizer": None, "client_state": client_json, "config": ck.config,
        "world_size": files.world_size(ck),
    }
    meta["optimizer"] = files.optimizer(ck, sv, meta)
    try:
        sv.meta = json.dumps(meta, indent=1, default=_json_default).encode()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint metadata is not JSON-serializable: {e}") from None
    # Nothing is written that a load would refuse (checkpoint_read.parse_json's bounds).
    if len(sv.meta) > _MAX_JSON:
        raise CheckpointError(f"the checkpoint's meta.json would be {len(sv.meta)} bytes, more than a load accepts "
                              f"({_MAX_JSON}); keep large values of client_state in tensors.")
    if json_depth(json.loads(sv.meta)) > _MAX_JSON_DEPTH:
        raise CheckpointError(f"the checkpoint's meta.json would nest more than {_MAX_JSON_DEPTH} levels deep, more "
                              f"than a load accepts; flatten the config or client_state.")
    sv.client = client_tensors or None
    return sv


def _write_files(ck, w: StagingWriter, sv: _Save, save_id: str, rank: int) -> dict:
    """Writes this rank's files; returns their manifest entries. The shared files come from
    ``sv`` (prepared on the rank that writes them), the optimizer's from the path."""
    file_meta = {"format": FORMAT, "save_id": save_id}
    entries = {}
    if sv.model is not None:
        entries["model.safetensors"] = w.write_tensors("model.safetensors", sv.model, file_meta)
    entries.update(_files_of(ck).write(ck, w, sv, file_meta, rank))
    if sv.client is not None:
        entries["client.safetensors"] = w.write_tensors("client.safetensors", sv.client, file_meta)
    if sv.meta is not None:
        entries["meta.json"] = w.write_bytes("meta.json", sv.meta)
    return entries


def _write_partition(ck, w: StagingWriter, file_meta: dict, rank: int) -> dict:
    """master.rank<r> and optim.rank<r>: this rank's pieces (never the padding), keyed
    "<name>@<offset>"; the non-tensor state (the step) as JSON in optim's metadata."""
    path = ck.optim.path
    sm = ck.optim.store
    masters, tensors, scalars = {}, {}, {}
    for gi, (entries, ms, sts) in enumerate(zip(sm.pieces, path.saved_masters(), path.param_states(saved=True))):
        for (pc, _at, _n), m, st in zip(entries, ms, sts):
            if pc is None:
                continue
            key = piece_key(ck.optim.names[gi][pc.param], pc.offset)
            masters[key] = m
            for k, v in (st or {}).items():
                if is_tensor(v):
                    tensors[f"{key}/{k}"] = v
                else:
                    scalars.setdefault(key, {})[k] = v
    meta = {**file_meta, "rank": str(rank)}
    try:
        scalar_text = json.dumps(scalars, default=_json_default)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"the optimizer's non-tensor state is not JSON-serializable: {e}") from None
    return {master_file(rank): w.write_tensors(master_file(rank), masters, meta),
            optim_file(rank): w.write_tensors(optim_file(rank), tensors, {**meta, "scalars": scalar_text})}


def save_host_bytes(ck) -> dict:
    """What a save holds in host memory at once beside the training state: {what: bytes}. A save
    streams: the model's partitioned (ZeRO-3) parameters are gathered one at a time (the unit
    whole, at ZeRO-3 the parameter itself, then the parameter cut from it), and the NVMe tier's
    masters and optimizer states are read one swap partition at a time (as fp32, converted per
    piece)."""
    whole = 0
    for sm, gi, pi in ck.model.partitioned().values():
        gp = sm.plan.groups[gi]
        whole = max(whole, (gp.units[gp.unit_of[pi]].padded + gp.numels[pi]) * sm.dtype.itemsize)
    out = {"the model's largest parameter, gathered with its unit": whole} if whole else {}
    part = piece = 0
    for t in nvme_tiers(ck.optim.path):
        part = max([part, *(max(sw.sizes) for sw in t.swappers if sw.sizes)])
        piece = max([piece, *(n for ns in t.layout.numels for n in ns)])
    if part:  # a partition's master and states as fp32, and one piece's tensor and its conversion
        out["one NVMe swap partition and one piece of its master or state"] = int(12 * part + 8 * piece)
    return out


def _check_save_memory(ck) -> None:
    """CheckpointError, before anything is gathered or written, when a save would need more
    host memory than this host has available (it would be killed midway otherwise)."""
    from .memory import GiB, _skipped, available_host_bytes
    need = save_host_bytes(ck)
    avail = available_host_bytes()
    if _skipped() or avail is None or sum(need.values()) <= avail:
        return
    raise CheckpointError(
        f"save_checkpoint would hold {sum(need.values()) / GiB:.2f} GiB in host memory at once ("
        + "; ".join(f"{w} {b / GiB:.2f} GiB" for w, b in need.items())
        + f"), but {avail / GiB:.2f} GiB are available: nothing was gathered or written, and training can go on. "
        f"Free host memory (other processes) and save again. (ZSPEED_SKIP_MEMORY_CHECK=1 skips this check.)")


def save_checkpoint(ck, save_dir, tag=None, client_state: dict | None = None, save_latest: bool = True) -> bool:
    """Writes ``save_dir/<tag>`` (default tag: ``global_step<N>``) as one transaction; returns
    True like DeepSpeed. On any failure (CheckpointError: a bad tag or client_state, a full
    disk, an I/O error) the folder holds what it held before. With several ranks every rank
    must call it (rank 0's tag and client_state are saved); a failure on any rank is a
    CheckpointError on every rank.

    The save of any number of ranks (one is the case without exchanges): prepare and open,
    write, commit, with the ranks' results exchanged after each phase so that all of them go
    on or all fail."""
    rank, ws = ck.rank, ck.world_size
    files = _files_of(ck)
    doing = "the checkpoint save"
    with contextlib.ExitStack() as stack:
        sv = staging = owner = err = own = None
        tx = None
        try:
            _check_save_memory(ck)
            sv = _prepare(ck, tag, client_state, shared=rank == 0)
            if rank == 0:
                tx = stack.enter_context(SaveTransaction(save_dir, sv.tag))
                staging, owner = tx.staging, tx.dir.lstat(tx.staging).st_uid
        except Exception as e:  # reported to every rank below, then raised on every rank
            err, own = describe(e), e
        opened = all_gather((err, sv.tag if sv else None, staging, owner, sv.save_id if sv else None), doing)
        raise_failed(opened, doing, own)
        tags = [o[1] for o in opened]
        if any(t != tags[0] for t in tags):
            r = next(r for r, t in enumerate(tags) if t != tags[0])
            raise TagMismatchError(f"{doing}: rank {r} asked for tag {tags[r]!r}, rank 0 for {tags[0]!r}; every rank "
                                   f"must save the same tag (or leave it to the default, global_step<N>).")
        _, _, staging, owner, save_id = opened[0]

        entries = {}
        try:
            if rank == 0:
                entries = _write_files(ck, tx.writer, sv, save_id, rank)
            else:
                sv.gathers.drain()  # rank 0 gathers the weights as it writes them
                if files.every_rank_writes:
                    w = StagingWriter.open_existing(save_dir, staging, owner)
                    try:
                        entries = _write_files(ck, w, sv, save_id, rank)
                    finally:
                        w.close()
        except Exception as e:
            err, own = describe(e), e
        if err is not None:  # stopped partway: the gathers not made yet are made, so no rank waits
            try:
                sv.gathers.drain()
            except Exception as e:  # noqa: BLE001 - the first failure is the one reported
                log.debug("zspeed: a gather after a failed save write failed too: %s", e)
        written = all_gather((err, entries), doing)
        raise_failed(written, doing, own)  # rank 0 leaves the transaction uncommitted: staging removed

        if rank == 0:
            try:
                merged = {}
                for _, ent in written:
                    merged.update(ent)
                d = tx.commit(merged, save_id, save_latest, world_size=files.world_size(ck))
                log.info("zspeed: saved checkpoint %s (%d rank%s)", d, ws, "s"[:ws - 1])
            except Exception as e:
                err, own = describe(e), e
    # The transaction is closed (its lock released) before the last exchange.
    raise_failed(all_gather((err,), doing), doing, own)
    return True


# -- load: validation helpers -------------------------------------------------------------------
def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _bad(where, field: str, value, want: str) -> CheckpointError:
    return CheckpointError(f"'{where}': field '{field}' = {_short(value)} {want}; the checkpoint is corrupt or "
                           f"was not written by zspeed.")


def _field(meta: dict, where, key: str):
    v = meta.get(key, _MISSING)
    if v is _MISSING:
        raise CheckpointError(f"'{where}': field '{key}' is missing; the checkpoint is corrupt or was not "
                              f"written by zspeed.")
    return v


def _count(meta: dict, where, key: str) -> int:
    v = _field(meta, where, key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2 ** 63:
        raise _bad(where, key, v, "must be an integer >= 0")
    return v


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _like(value, mine, where, field: str):
    """``value`` (from JSON) checked against the type of the engine's current ``mine``."""
    if isinstance(mine, bool):
        if not isinstance(value, bool):
            raise _bad(where, field, value, "must be true or false")
        return value
    if torch.is_tensor(mine) and mine.numel() == 1:
        if not _is_num(value):
            raise _bad(where, field, value, "must be a finite number")
        return torch.tensor(value, dtype=mine.dtype, device=mine.device)
    if isinstance(mine, (int, float)):
        if not _is_num(value):
            raise _bad(where, field, value, "must be a finite number")
        return value
    if isinstance(mine, (list, tuple)):
        if not isinstance(value, list) or len(value) != len(mine):
            raise _bad(where, field, value, f"must be a list of {len(mine)} values")
        out = [_like(v, m, where, f"{field}[{i}]") for i, (v, m) in enumerate(zip(value, mine))]
        return tuple(out) if isinstance(mine, tuple) else out
    if isinstance(mine, str):
        if not isinstance(value, str):
            raise _bad(where, field, value, "must be a string")
        return value
    if isinstance(mine, dict):
        if not isinstance(value, dict):
            raise _bad(where, field, value, "must be an object")
        return {k: (_like(v, mine[k], where, f"{field}.{k}") if k in mine else v) for k, v in value.items()}
    return value  # None or another type the engine holds: taken as saved


def _check_shapes(what: str, expected: dict, got: dict, strict: bool) -> None:
    missing = [k for k in expected if k not in got]
    unexpected = [k for k in got if k not in expected]
    bad = [f"{k}: checkpoint {tuple(got[k].shape)} vs model {tuple(expected[k].shape)}"
           for k in expected if k in got and tuple(got[k].shape) != tuple(expected[k].shape)]
    kinds = [f"{k}: checkpoint {got[k].dtype} vs model {expected[k].dtype}" for k in expected
             if k in got and expected[k].device.type != "meta" and
             (got[k].is_floating_point(), got[k].dtype == torch.bool) !=
             (expected[k].is_floating_point(), expected[k].dtype == torch.bool)]
    problems = []
    if missing and strict:
        problems.append(f"missing {len(missing)}: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    if unexpected and strict:
        problems.append(f"unexpected {len(unexpected)}: {', '.join(unexpected[:8])}"
                        f"{' ...' if len(unexpected) > 8 else ''}")
    if bad:
        problems.append("shape mismatch: " + "; ".join(bad[:8]))
    if kinds:
        problems.append("dtype mismatch: " + "; ".join(kinds[:8]))
    if problems:
        raise CheckpointError(f"{what} does not match the model ({' | '.join(problems)}). Build the same "
                              f"model as when the checkpoint was saved"
                              f"{', or pass load_module_strict=False' if (missing or unexpected) else ''}.")


# -- load: optimizer state ----------------------------------------------------------------------
# Per optimizer class as checkpoints record it: its per-element state keys, and whether the
# step counter is a plain integer (zspeed's classes) or a tensor (torch's).
_CLASSES = checkpoint_classes()
_Q8_SCALES = ("exp_avg_scale", "exp_avg_sq_scale")
# Group settings that choose how the optimizer runs or stores its state, not the training's
# trajectory: the engine's configuration wins over the checkpoint's.
_ENGINE_WINS = {"state_dtype", "fused", "foreach", "capturable", "differentiable"}


def _convert_adam_state(st: dict, target: str, numel: int, shape, where, name: str) -> dict:
    """An Adam state (fp32, bf16 or 8-bit) in the configured state dtype ``target``."""
    have = adam_state_dtype(st)
    if have != target:  # converted now, in memory (a load streams only what keeps its dtype)
        st = {k: real(v) for k, v in st.items()}
    try:
        out = convert_adam_state(st, target, numel, shape)
    except ValueError as e:
        raise CheckpointError(f"'{where}': {name}/{e}; the checkpoint is corrupt.") from None
    if have != target:
        log.info("zspeed: optimizer state of %s converted from %s to the configured state_dtype %s", name, have,
                 target)
    return out


def _check_param_state(cls: str, st: dict, p: torch.Tensor, where, name: str) -> None:
    spec = _CLASSES.get(cls)
    if spec is None:  # a client optimizer's class: its own load_state_dict judges the state
        return
    keys, step_kind = spec
    for k in keys:
        t = st.get(k)
        if not is_tensor(t):
            raise CheckpointError(f"'{where}': the optimizer state of {name} has no tensor '{k}', which "
                                  f"{cls} keeps; the checkpoint is corrupt.")
        if t.numel() != p.numel():
            raise CheckpointError(f"'{where}': optimizer state {name}/{k} has shape {tuple(t.shape)}, the "
                                  f"parameter {tuple(p.shape)}; the checkpoint is corrupt.")
        st[k] = t.reshape(p.shape)  # the optimizer's own shape (the offloaded paths keep flat masters)
        q8 = cls == "CPUAdam" and t.dtype == (torch.int8 if k == "exp_avg" else torch.uint8)
        if not (t.is_floating_point() or q8):
            raise CheckpointError(f"'{where}': optimizer state {name}/{k} has dtype {t.dtype}; {cls} keeps "
                                  f"floating-point (or 8-bit) state.")
    if cls == "CPUAdam" and adam_state_dtype(st) == "int8":
        from ..ops import qblocks
        for k in _Q8_SCALES:
            t = st.get(k)
            if not is_tensor(t) or t.dtype != torch.float32 or tuple(t.shape) != (qblocks(p.numel()),):
                raise CheckpointError(f"'{where}': the 8-bit optimizer state of {name} needs an fp32 '{k}' "
                                      f"of {qblocks(p.numel())} block scales; the checkpoint is corrupt.")
        if st["exp_avg_sq"].dtype != torch.uint8:
            raise CheckpointError(f"'{where}': 8-bit {name}/exp_avg_sq must be uint8.")
    step = st.get("step", _MISSING)
    if step_kind == "int" and (not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2 ** 62):
        raise _bad(where, f"optimizer.scalars.{name}.step", None if step is _MISSING else step,
                   "must be an integer >= 0")
    if step_kind == "tensor":
        ok = (torch.is_tensor(step) and step.numel() == 1 and math.isfinite(float(step)) and float(step) >= 0) \
            or (step is not _MISSING and _is_num(step) and step >= 0)
        if not ok:
            raise _bad(where, f"{name}/step", None if step is _MISSING else step, "must be a number >= 0")


def _groups_differ(saved: list, mine: list) -> str:
    """What differs between the saved and the engine's parameter names by group (the first
    difference)."""
    if [len(r) for r in saved] != [len(r) for r in mine]:
        def sizes(rows):
            return ", ".join(str(len(r)) for r in rows) or "no"
        return f"groups of {sizes(saved)} parameters in the checkpoint, of {sizes(mine)} in this engine"
    for gi, (a, b) in enumerate(zip(saved, mine)):
        for pi, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"parameter {pi} of group {gi} is {x!r} in the checkpoint, {y!r} in this engine"
    return "the same names"  # not reached: the caller found a difference


def _plan_groups(ck, meta: dict, where) -> tuple[str, list, dict]:
    """(the optimizer class, the param_groups for ``load_state_dict`` (the checkpoint's
    hyperparameters, the engine's run settings), the saved non-tensor state by parameter),
    checked against the engine."""
    names = [n for row in ck.optim.names for n in row]
    saved_names = _field(meta, where, "param_names")
    if not isinstance(saved_names, list) or not all(isinstance(r, list) and all(isinstance(n, str) for n in r)
                                                     for r in saved_names):
        raise _bad(where, "param_names", saved_names, "must be a list of lists of parameter names")
    if [len(r) for r in saved_names] != [len(r) for r in ck.optim.names] or \
            [n for r in saved_names for n in r] != names:
        raise CheckpointError(f"optimizer state in '{where}' was saved for different parameter groups "
                              f"({sum(map(len, saved_names))} parameters) than this engine has ({len(names)}): "
                              f"{_groups_differ(saved_names, ck.optim.names)}; pass load_optimizer_states=False "
                              f"to load the weights only.")
    opt = _field(meta, where, "optimizer")
    if not isinstance(opt, dict):
        raise _bad(where, "optimizer", opt, "must be an object")
    cls = opt.get("class")
    mine = ck.optim.checkpoint_class
    if cls != mine:
        raise CheckpointError(f"optimizer state in '{where}' belongs to {cls}, but this engine runs "
                              f"{mine}; pass load_optimizer_states=False.")
    saved_groups, scalars = opt.get("param_groups"), opt.get("scalars", {})
    if not isinstance(saved_groups, list) or len(saved_groups) != len(ck.optim.optimizer.param_groups):
        raise _bad(where, "optimizer.param_groups", saved_groups,
                   f"must be a list of {len(ck.optim.optimizer.param_groups)} groups")
    if not isinstance(scalars, dict) or not all(isinstance(v, dict) for v in scalars.values()):
        raise _bad(where, "optimizer.scalars", scalars, "must map parameter names to objects")
    groups, start = [], 0
    for gi, (g, cur) in enumerate(zip(saved_groups, ck.optim.optimizer.param_groups)):
        if not isinstance(g, dict):
            raise _bad(where, f"optimizer.param_groups[{gi}]", g, "must be an object")
        merged = {k: v for k, v in cur.items() if k != "params"}
        for k, v in g.items():
            if k != "params" and k in cur and k not in _ENGINE_WINS:
                merged[k] = _like(v, cur[k], where, f"optimizer.param_groups[{gi}].{k}")
        if "lr" in merged and float(merged["lr"]) < 0:
            raise _bad(where, f"optimizer.param_groups[{gi}].lr", g.get("lr"), "must be >= 0")
        if isinstance(merged.get("betas"), tuple) and not all(0 <= float(b) < 1 for b in merged["betas"]):
            raise _bad(where, f"optimizer.param_groups[{gi}].betas", g.get("betas"), "must lie in [0, 1)")
        n = len(cur["params"])
        merged["params"] = list(range(start, start + n))
        start += n
        groups.append(merged)
    return cls, groups, scalars


def _plan_optimizer(ck, meta: dict, where, tensors: dict, scalars: dict | None = None) -> dict:
    """The validated state_dict for ``ck.optim.optimizer.load_state_dict`` (states converted
    to the configured state dtype); ``scalars`` (the non-tensor state by parameter) replaces
    meta.json's when the checkpoint keeps them elsewhere (in its partition files)."""
    cls, groups, saved_scalars = _plan_groups(ck, meta, where)
    scalars = saved_scalars if scalars is None else scalars
    names = [n for row in ck.optim.names for n in row]
    known = set(names)
    by_name: dict = {}
    for k, v in tensors.items():
        pname, _, key = k.rpartition("/")
        if pname not in known:
            raise CheckpointError(f"'{where}': optim.safetensors holds '{k}', which belongs to no parameter of "
                                  f"this engine; the checkpoint is corrupt.")
        by_name.setdefault(pname, {})[key] = v
    unknown = [n for n in scalars if n not in known]
    if unknown:
        raise CheckpointError(f"'{where}': optimizer.scalars names {unknown[0]!r}, which is no parameter of "
                              f"this engine; the checkpoint is corrupt.")
    shapes = [p.shape for g in ck.optim.optimizer.param_groups for p in g["params"]]
    targets = ck.optim.state_dtypes()
    state: dict = {}
    for i, n in enumerate(names):
        st = dict(by_name.get(n, {}))
        st.update(scalars.get(n, {}))
        if not st:
            continue
        _check_param_state(cls, st, torch.empty(shapes[i], device="meta"), where, n)
        if cls == "CPUAdam" and targets[i] in ("fp32", "bf16", "int8"):
            st = _convert_adam_state(st, targets[i], math.prod(shapes[i]), shapes[i], where, n)
        state[i] = st
    sd = {"state": state, "param_groups": groups}
    try:
        ck.optim.validate(sd)
    except ValueError as e:
        raise CheckpointError(f"optimizer state in '{where}' cannot be loaded: {e}") from None
    return sd


def _plan_scheduler(ck, meta: dict, where):
    sch = ck.scheduler
    sd = meta.get("lr_scheduler")
    if sd is None or sch is None or not hasattr(sch, "load_state_dict"):
        return None
    if not isinstance(sd, dict):
        raise _bad(where, "lr_scheduler", sd, "must be an object")
    saved_cls = meta.get("lr_scheduler_class")
    if saved_cls is not None and saved_cls != type(sch).__name__:
        raise CheckpointError(f"the lr scheduler state in '{where}' belongs to {saved_cls}, but this engine runs "
                              f"{type(sch).__name__}; pass load_lr_scheduler_states=False.")
    mine = sch.state_dict() if hasattr(sch, "state_dict") else {}
    from .lr_schedules import SCHEDULERS
    ours = isinstance(sch, tuple(SCHEDULERS.values()))
    out = {}
    for k, v in sd.items():
        if k in mine:
            out[k] = _like(v, mine[k], where, f"lr_scheduler.{k}")
        elif not ours:
            out[k] = v
    if ours:
        missing = [k for k in mine if k not in sd]
        if missing:
            raise CheckpointError(f"'{where}': field 'lr_scheduler.{missing[0]}' is missing; the checkpoint is "
                                  f"corrupt.")
        it = out["last_batch_iteration"]
        if not isinstance(it, int) or isinstance(it, bool) or not -1 <= it < 2 ** 62:
            raise _bad(where, "lr_scheduler.last_batch_iteration", it, "must be an integer >= -1")
    return out


class _Plan:
    """Everything a load will put into the engine, read and checked."""
    model: dict
    masters: dict | None          # by parameter name (one process's layout)
    local_masters: list | None    # per group, per entry of this rank's local space (several ranks)
    optimizer: dict | None
    scaler: dict | None
    counters: dict | None
    scheduler: dict | None
    client: Any


def _whole_params(ck, r: CheckpointReader, meta: dict, where, saved_model: dict) -> tuple:
    """(masters by name, optimizer tensors "<name>/<key>", non-tensor state by name or None for
    meta.json's) of whole parameters: a world-size-1 checkpoint's files as they are, or a
    checkpoint of several ranks assembled from its pieces (8-bit states dequantized where a
    parameter spans pieces)."""
    if saved_world_size(meta, where) == 1 and meta.get("partition") is None:
        return _whole_masters(ck, r), _whole_optim(ck, r, where), None
    masters, tensors, scalars = {}, {}, {}
    with PieceReader(r, meta, where) as src:
        for name in src.names():
            n = src.numel(name)
            m = saved_model.get(name)
            masters[name] = src.master(name, 0, n).view(m.shape if m is not None and m.numel() == n else (n,))
            for k, v in src.state(name, 0, n).items():
                if torch.is_tensor(v):
                    tensors[f"{name}/{k}"] = v
                else:
                    scalars.setdefault(name, {})[k] = v
    return masters, tensors, scalars


def _whole_masters(ck, r: CheckpointReader) -> dict:
    """master.safetensors of a world-size-1 checkpoint: names, shapes and dtypes checked on
    its header, then only this engine's masters read."""
    mine = ck.optim.master_shapes()
    specs = r.specs("master.safetensors")
    _check_shapes(f"fp32 master weights in '{r.path}'", mine, specs, True)
    wrong = [k for k in mine if specs[k].dtype != torch.float32]
    if wrong:
        raise CheckpointError(f"'{r.path / 'master.safetensors'}': master weight {wrong[0]} has dtype "
                              f"{specs[wrong[0]].dtype}, not float32; the checkpoint is corrupt.")
    return r.tensors("master.safetensors", want=mine)


def _whole_optim(ck, r: CheckpointReader, where) -> dict:
    """optim.safetensors of a world-size-1 checkpoint ("<param name>/<state key>"), each tensor
    checked on the header before anything is read: it belongs to a parameter of this engine
    and has no more elements than the parameter (no optimizer state has more)."""
    params = ck.optim.master_shapes()
    for k, t in r.specs("optim.safetensors").items():
        pname = k.rpartition("/")[0]
        if pname not in params:
            raise CheckpointError(f"'{where}': optim.safetensors holds '{k}', which belongs to no parameter of "
                                  f"this engine; the checkpoint is corrupt.")
        if t.numel() > max(params[pname].numel(), 1):
            raise CheckpointError(f"'{where}': optimizer state {k} has shape {tuple(t.shape)}, the parameter "
                                  f"{tuple(params[pname].shape)}; the checkpoint is corrupt.")
    return r.tensors("optim.safetensors")


def _zero_state(key: str, v, n: int, ref_n: int):
    """The state of n padding elements, shaped after the value ``v`` of a real piece of ref_n
    elements: zeros where ``v`` holds one value per element, else ``v`` itself (the step)."""
    if not is_tensor(v):
        return v
    if key in _Q8_SCALES:
        from ..ops import qblocks
        return torch.zeros(qblocks(n), dtype=v.dtype)
    return torch.zeros(n, dtype=v.dtype) if per_element(key, v, ref_n) else real(v).clone()


def _plan_pieces(ck, r: CheckpointReader, meta: dict, where, files: contextlib.ExitStack) -> tuple[list, dict]:
    """A store's local space (several ranks, or ZeRO-3): (this rank's masters per entry of its
    local space, its optimizer's state_dict), from the ranges of the saved pieces (of any world
    size) that overlap this rank's pieces. Padding gets zeros, and the state of a real piece of
    its group with zeros (same step). Checked on the files' headers; the masters and
    per-element states are Deferred tensors, read from the files (kept open in ``files``) as
    the load puts each in place, so a load holds one piece at a time beside the engine."""
    path = ck.optim.path
    sm = ck.optim.store
    cls, groups, _ = _plan_groups(ck, meta, where)
    targets = ck.optim.group_state_dtypes()
    masters, states = [], []
    src = files.enter_context(PieceReader(r, meta, where, lazy=True))
    mine = {n: torch.empty(full_numel(p), device="meta") for names, ps in zip(ck.optim.names, ck.optim.params)
            for n, p in zip(names, ps)}
    got = {n: torch.empty(k, device="meta") for n in src.names() if (k := src.numel(n)) is not None}
    _check_shapes(f"fp32 master weights in '{r.path}'", mine, got, True)
    for gi, entries in enumerate(sm.pieces):
        mrow, srow = [], []
        for pc, _at, n in entries:
            if pc is None:
                mrow.append(torch.zeros(n, dtype=torch.float32))
                srow.append(None)
                continue
            name = ck.optim.names[gi][pc.param]
            label = f"{name}[{pc.offset}:{pc.offset + n}]"
            mrow.append(src.master(name, pc.offset, n))
            st = src.state(name, pc.offset, n)
            if st:
                _check_param_state(cls, st, torch.empty(n, device="meta"), where, label)
                if cls == "CPUAdam" and targets[gi] in ("fp32", "bf16", "int8"):
                    st = _convert_adam_state(st, targets[gi], n, (n,), where, label)
            srow.append(st or None)
        at = next((i for i, st in enumerate(srow) if st is not None), None)
        if at is not None:
            ref, ref_n = srow[at], entries[at][2]
            srow = [st if pc is not None else {k: _zero_state(k, v, n, ref_n) for k, v in ref.items()}
                    for (pc, _at, n), st in zip(entries, srow)]
        masters.append(mrow)
        states.append(srow)
    try:
        sd = path.state_dict_from(states, groups)
        ck.optim.validate(sd)
    except ValueError as e:
        raise CheckpointError(f"optimizer state in '{where}' cannot be loaded: {e}") from None
    return masters, sd


def _plan_load(ck, r: CheckpointReader, strict: bool, load_optimizer_states: bool,
               load_lr_scheduler_states: bool, load_counters: bool, files: contextlib.ExitStack) -> _Plan:
    where, meta = _open_meta(r)
    if meta.get("format") != FORMAT:
        raise _bad(where, "format", meta.get("format"), f"must be {FORMAT!r}")
    if meta.get("save_id") != r.save_id:
        raise CheckpointError(f"'{where}' belongs to save {meta.get('save_id')!r}, the manifest to "
                              f"{r.save_id!r}: the folder mixes two saves.")
    plan = _Plan()

    model_sd = ck.model.shapes()
    aliases = _aliases(meta, where)
    # Names and shapes are checked on the header; only the tensors this model has are read.
    specs = r.specs("model.safetensors")
    stored = {k: k for k in specs}
    for alias, target in aliases.items():
        if target in specs:
            stored[alias] = target
    saved = {k: specs[src] for k, src in stored.items()}
    _check_shapes(f"model weights in '{r.path}'", model_sd, saved, strict)
    # Read as the load puts each in place (the file stays open in ``files``).
    weights = files.enter_context(r.open_tensors("model.safetensors"))
    plan.model = {k: Deferred(saved[k].dtype, saved[k].shape,
                              reading(lambda k=stored[k]: weights.get_tensor(k).clone(), r.path / "model.safetensors"))
                  for k in saved if k in model_sd}

    plan.masters = plan.local_masters = plan.optimizer = plan.scaler = plan.counters = None
    if load_optimizer_states:
        if ck.optim.store is not None:
            plan.local_masters, plan.optimizer = _plan_pieces(ck, r, meta, where, files)
        else:
            masters, opt_t, scalars = _whole_params(ck, r, meta, where, saved)
            mine = ck.optim.master_shapes()
            _check_shapes(f"fp32 master weights in '{r.path}'", mine, masters, True)
            wrong = [k for k in mine if masters[k].dtype != torch.float32]
            if wrong:
                raise CheckpointError(f"'{r.path / 'master.safetensors'}': master weight {wrong[0]} has dtype "
                                      f"{masters[wrong[0]].dtype}, not float32; the checkpoint is corrupt.")
            plan.masters = {n: masters[n] for n in mine}
            plan.optimizer = _plan_optimizer(ck, meta, where, opt_t, scalars)
        try:
            plan.scaler = _check_scaler_state(_field(meta, where, "loss_scaler"))
        except ValueError as e:
            raise CheckpointError(f"'{where}': field 'loss_scaler': {e}; the checkpoint is corrupt.") from None
    if load_counters:  # as DeepSpeed: the step counters come back unless only the module is loaded
        plan.counters = {k: _count(meta, where, k)
                         for k in ("global_steps", "global_samples", "micro_steps", "skipped_steps")}
    plan.scheduler = _plan_scheduler(ck, meta, where) if load_lr_scheduler_states else None
    client = meta.get("client_state", {})
    client_t = r.tensors("client.safetensors", want=_client_refs(client)) if r.has("client.safetensors") else {}
    plan.client = _decode_client(client, client_t, where)
    return plan


def _load_optimizer(ck, sd: dict, where: Path) -> None:
    """ck.optim.optimizer.load_state_dict(sd), the one step of a load that the optimizer itself
    may still refuse (a client optimizer's checks). The ranks compare outcomes, and a rank
    whose load succeeded while another's failed puts its previous state back, so that every
    rank keeps its optimizer unchanged."""
    err = own = None
    opt = ck.optim.optimizer
    # An optimizer that validates first (nvme) cannot refuse after the plan's checks; for the
    # others the previous state_dict (references to the current tensors, no copy) is kept.
    before = None if ck.optim.validates_first else opt.state_dict()
    if not ck.optim.path.takes_deferred:  # its optimizer wants tensors: the state is read now
        sd = {**sd, "state": materialized(sd["state"])}
    try:
        opt.load_state_dict(sd)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        err, own = f"optimizer state in '{where}' cannot be loaded: {e}", e
    outcomes = all_gather((err,), "the checkpoint load")
    if any(o[0] is not None for o in outcomes) and err is None and before is not None:
        opt.load_state_dict(before)
    if len(outcomes) == 1 and err is not None:
        raise CheckpointError(err) from None
    raise_failed(outcomes, "the checkpoint load", own)


def _apply(ck, plan: _Plan, where: Path) -> None:
    """Puts a checked plan into the engine. The optimizer goes first: it is the only part
    whose own load could still refuse (a client optimizer's checks), and then nothing else
    has changed yet."""
    if plan.optimizer is not None:
        _load_optimizer(ck, plan.optimizer, where)
    ck.model.load(plan.model)
    if plan.local_masters is not None:
        ck.optim.load_local_masters(plan.local_masters)
    elif plan.masters is not None:
        ck.optim.load_masters(plan.masters)
    else:  # weights only: masters follow the (possibly low-precision) model weights
        ck.optim.load_masters({n: w.to(torch.float32) for n, w in ck.whole_weights(plan.model).items()})
    if plan.scaler is not None:
        if not plan.scaler["dynamic"] and ck.scaler.dynamic:
            log.info("zspeed: the checkpoint in %s has no dynamic loss scale (it was not trained with dynamic "
                     "fp16); the loss scale starts at its configured initial value", where)
        elif plan.scaler["dynamic"] and not ck.scaler.dynamic:
            log.info("zspeed: the dynamic fp16 loss scale saved in %s (%g) is not used: this engine's scale is "
                     "%g", where, plan.scaler["cur_scale"], ck.scaler.loss_scale)
        ck.scaler.load_state_dict(plan.scaler)
    if plan.counters is not None:
        ck.counters.load_state_dict(plan.counters)
    if plan.scheduler is not None:
        ck.scheduler.load_state_dict(plan.scheduler)


def load_checkpoint(ck, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                    load_lr_scheduler_states=True, load_counters=True, before_apply=None):
    """Restores a checkpoint; returns (path, client_state), or (None, None) when there is none
    (no folder, no ``latest``, or an explicit tag that does not exist). Every problem with
    the checkpoint is a CheckpointError, raised before the engine changes. With several
    ranks every rank must call it; they load the same checkpoint, at any world size, or
    all raise the same CheckpointError and none changes (a disk error while the tensors are
    read, after every check passed, is the one exception: checkpoint_files.reading). ``load_counters``: the step counters
    (global_steps, global_samples, micro_steps, skipped_steps), restored also without the
    optimizer states, as DeepSpeed does; only a module-only load leaves them. ``before_apply()``
    runs once the checkpoint is found and checked on every rank, just before the engine starts
    changing (the engine abandons a torn step there: a load that finds nothing, or refuses the
    checkpoint, leaves it pending). A failure while the checkpoint is put in place (a disk error
    reading it, or writing the NVMe swap files) is a :class:`LoadIncompleteError`: the engine
    then holds part of the checkpoint."""
    return _load_ranks(ck, load_dir, tag, load_module_strict, load_optimizer_states, load_lr_scheduler_states,
                       load_counters, before_apply)


def _load_ranks(ck, load_dir, tag, strict, load_optimizer_states, load_lr_scheduler_states, load_counters,
                before_apply=None):
    """The load of any number of ranks (one is the case without exchanges). Every rank plans its
    load (checks what it needs on the files' checksums and headers, with the folder locked for
    reading, and keeps the files open), the ranks compare (after the lock is released: on
    Windows the lock is exclusive), and only when every rank succeeded with the same checkpoint
    do they apply, each tensor read from the open files as it is put in place."""
    doing = "the checkpoint load"
    with contextlib.ExitStack() as files:  # the checkpoint's files, open until the load is applied
        return _load_opened(ck, load_dir, tag, strict, load_optimizer_states, load_lr_scheduler_states,
                            load_counters, files, doing, before_apply)


def _load_opened(ck, load_dir, tag, strict, load_optimizer_states, load_lr_scheduler_states, load_counters,
                 files, doing, before_apply=None):
    plan = path = save_id = err = own = None
    try:
        with open_for_load(load_dir, tag) as r:
            if r is not None:
                path, save_id = str(r.path), r.save_id
                plan = _plan_load(ck, r, strict, load_optimizer_states, load_lr_scheduler_states, load_counters,
                                  files)
    except Exception as e:  # reported to every rank, then raised on every rank
        err, own = describe(e), e
    found = all_gather((err, path, save_id), doing)
    raise_failed(found, doing, own)
    # The save id (random per save) identifies the checkpoint; the paths may differ between
    # hosts that mount the shared folder at different places.
    if any(f[2] != found[0][2] for f in found):
        r = next(r for r, f in enumerate(found) if f[2] != found[0][2])
        raise CheckpointError(f"{doing}: rank {r} found {found[r][1] or 'no checkpoint'} (save "
                              f"{found[r][2]}), rank 0 {found[0][1] or 'no checkpoint'} (save {found[0][2]}); "
                              f"was another job saving into '{load_dir}' meanwhile? Nothing was loaded.")
    if plan is None:
        return None, None
    try:
        if before_apply is not None:
            before_apply()
        _apply(ck, plan, Path(path))
    except LoadIncompleteError:
        raise
    except Exception as e:  # the engine has begun changing: it holds part of the checkpoint
        raise LoadIncompleteError(
            f"{doing} of '{path}' failed while putting it in place ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"this engine now holds part of the checkpoint and part of its earlier state, and refuses to train or "
            f"save until a load succeeds: load a checkpoint again (after fixing the cause: disk space, I/O "
            f"errors of the disk under the checkpoint or nvme_path).") from e
    log.info("zspeed: loaded checkpoint %s", path)
    return path, plan.client


# -- load: meta.json fields the fp32 export reads too ------------------------------------------
def _open_meta(r) -> tuple[Path, dict]:
    """(path, object) of the tag's meta.json, which must hold a JSON object."""
    where = r.path / "meta.json"
    meta = r.json("meta.json")
    if not isinstance(meta, dict):
        raise CheckpointError(f"'{where}' must hold a JSON object; the file is corrupt.")
    return where, meta


def _aliases(meta: dict, where: Path) -> dict:
    """meta.json's model_aliases (tied names -> the name stored), checked."""
    aliases = _field(meta, where, "model_aliases")
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in aliases.items()):
        raise _bad(where, "model_aliases", aliases, "must map names to names")
    return aliases
