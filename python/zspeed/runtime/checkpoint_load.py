"""Loading a checkpoint into the engine (checkpoint.py's layout and guarantees): every file is
verified and everything is read and checked against the engine first (shapes, dtypes, optimizer
class and groups, every meta.json field, the loss scaler, the scheduler); only then is the engine
changed. With several ranks each rank reads the ranges of the saved pieces that overlap its own
and the ranks compare their results before any of them changes.
"""
from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

import torch

from .._optimizers import checkpoint_classes
from .checkpoint import FORMAT, _client_refs, _decode_client
from .checkpoint_files import CheckpointError, Deferred, LoadIncompleteError, is_tensor, materialized, reading, real
from .checkpoint_read import CheckpointReader, open_for_load
from .checkpoint_shards import PieceReader, all_gather, describe, raise_failed, saved_world_size
from .loss_scaler import check_state_dict as _check_scaler_state
from .optimizers import adam_state_dtype, convert_adam_state
from .store import full_numel, per_element

log = logging.getLogger("zspeed.checkpoint")

__all__ = ["load_checkpoint"]

_MISSING = object()


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
    from .schedulers import SCHEDULERS
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
