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
checkpoint_files.py (checkpoint_read.py the reading). This module turns the engine into those
files; checkpoint_load.py reads them back:

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
import secrets
from typing import Any

import torch

from .._version import __version__
from .checkpoint_files import (CheckpointError, Deferred, SaveTransaction, StagingWriter, TagMismatchError, is_tensor,
                               validate_tag)
from .checkpoint_read import _MAX_JSON, _MAX_JSON_DEPTH, json_depth
from .checkpoint_shards import all_gather, describe, master_file, optim_file, partition_meta, piece_key, raise_failed
from .nvme import nvme_tiers
from .parts import Lockstep

log = logging.getLogger("zspeed.checkpoint")

__all__ = ["CheckpointError", "save_checkpoint", "FORMAT"]

FORMAT = "zspeed-checkpoint-2"


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
