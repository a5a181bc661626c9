"""Checkpoints of several data-parallel ranks: the partition files, reading any part of
any parameter from them, and the collectives that make the ranks agree.

Layout (docs/CHECKPOINTS.md). A checkpoint saved by N > 1 ranks of ZeRO stage 1 or 2
holds rank 0's shared files (model.safetensors, meta.json, client.safetensors) and, per
rank r, the part of the optimizer it stepped:

    master.rank<r>.safetensors   "<param name>@<offset>" -> fp32 master of one piece (flat)
    optim.rank<r>.safetensors    "<param name>@<offset>/<state key>" -> state tensors of a
                                 piece; its safetensors metadata "scalars" holds the
                                 non-tensor state (CPUAdam's step) as JSON by piece

A piece is the part of a parameter that falls into one rank's shard (partition.py);
``offset`` is its first element in the flattened parameter. meta.json records
``world_size`` and ``partition`` (align, unit_elems and every group's parameter sizes),
from which :class:`SavedLayout` recomputes which rank's file holds which range of which
parameter, without reading a file. A checkpoint of one process (or of ZeRO stage 0,
where every rank holds everything) has world size 1: whole parameters by name in
master.safetensors and optim.safetensors.

:class:`PieceReader` reads the range [offset, offset + length) of a parameter's master
and optimizer state from whichever files hold it, through safetensors' lazy slices, so
a loading rank reads (after verifying the files' checksums) only what overlaps its own
pieces. A range that is exactly one saved piece is returned as stored, bit for bit, in
every state dtype; otherwise fp32 and bf16 states are cut and joined exactly, and 8-bit
states (blocks of 256 elements counted from each saved piece's start) are dequantized
to fp32, for the loader to convert to the engine's state dtype.

:func:`all_gather` exchanges small Python objects between the ranks (torch.distributed
over the default group; a rank that died turns into a CheckpointError on the others
instead of a hang) and :func:`raise_failed` turns the gathered results into the same
CheckpointError on every rank.
"""
from __future__ import annotations

import contextlib
import math

import torch

from .._signatures.optim import OPTIM_QBLOCK
from .checkpoint_files import CheckpointError, Deferred, reading
from .checkpoint_read import _FROM_ST, CheckpointReader, parse_json
from .partition import GroupPlan, PartitionPlan
from .store import per_element_shape

__all__ = ["SavedLayout", "PieceReader", "piece_key", "master_file", "optim_file", "partition_meta",
           "saved_world_size", "all_gather", "describe", "raise_failed", "MAX_WORLD"]

MAX_WORLD = 1 << 20  # a world size in meta.json above this is not a checkpoint zspeed wrote
_Q8 = ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale")
_Q8_CODES = {"exp_avg": "I8", "exp_avg_sq": "U8"}


def piece_key(name: str, offset: int) -> str:
    return f"{name}@{offset}"


def master_file(rank: int) -> str:
    return f"master.rank{rank}.safetensors"


def optim_file(rank: int) -> str:
    return f"optim.rank{rank}.safetensors"


def partition_meta(plan: PartitionPlan) -> dict:
    """What meta.json records of a partition plan (enough to recompute every rank's pieces)."""
    return {"align": plan.align, "unit_elems": plan.unit_elems, "numels": [list(g.numels) for g in plan.groups]}


def _bad(where, field: str, value, want: str) -> CheckpointError:
    r = repr(value)
    r = r if len(r) <= 60 else r[:57] + "..."
    return CheckpointError(f"'{where}': field '{field}' = {r} {want}; the checkpoint is corrupt or was not "
                           f"written by zspeed.")


def _int(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def saved_world_size(meta: dict, where) -> int:
    ws = meta.get("world_size", 1)
    if not _int(ws, 1, MAX_WORLD):
        raise _bad(where, "world_size", ws, f"must be an integer in [1, {MAX_WORLD}]")
    return ws


def param_names(meta: dict, where) -> list:
    names = meta.get("param_names")
    if not isinstance(names, list) or not all(isinstance(r, list) and all(isinstance(n, str) for n in r)
                                              for r in names):
        raise _bad(where, "param_names", names, "must be a list of lists of parameter names")
    return names


class SavedLayout:
    """Which file holds which range of which parameter (see the module docstring)."""

    def __init__(self, meta: dict, where):
        self.where = where
        self.world_size = saved_world_size(meta, where)
        self.names = param_names(meta, where)
        # name -> (numel, [(rank, offset, length), ...] in offset order); None for world size 1,
        # whose sizes come from master.safetensors itself.
        self.index: dict | None = None
        # Whole-parameter files (master.safetensors, optim.safetensors): a checkpoint of one
        # process without a partition. A partition (several ranks, or ZeRO-3 on one) is in pieces.
        self.whole = self.world_size == 1 and meta.get("partition") is None
        if self.whole:
            return
        part = meta.get("partition")
        if not isinstance(part, dict):
            raise _bad(where, "partition", part, "must be an object (a checkpoint of several ranks)")
        align, unit = part.get("align"), part.get("unit_elems")
        if not _int(align, 1, 1 << 40):
            raise _bad(where, "partition.align", align, "must be an integer >= 1")
        if not _int(unit, 1, 1 << 62):
            raise _bad(where, "partition.unit_elems", unit, "must be an integer >= 1")
        numels = part.get("numels")
        if not isinstance(numels, list) or [len(r) if isinstance(r, list) else None for r in numels] != \
                [len(r) for r in self.names] or not all(_int(n, 0, 1 << 62) for r in numels for n in r):
            raise _bad(where, "partition.numels", numels, "must give an integer size >= 0 for every "
                       "parameter of param_names")
        self.index = {}
        for names, sizes in zip(self.names, numels):
            gp = GroupPlan(tuple(sizes), self.world_size, align, unit)
            for u in gp.units:
                for pi in range(u.first, u.first + u.count):
                    off, n = gp.offsets[pi], gp.numels[pi]
                    pieces = []
                    if n:
                        first, last = (off - u.start) // u.shard, (off + n - 1 - u.start) // u.shard
                        for rk in range(first, last + 1):
                            lo = max(off, u.start + rk * u.shard)
                            hi = min(off + n, u.start + (rk + 1) * u.shard)
                            pieces.append((rk, lo - off, hi - lo))
                    if names[pi] in self.index:
                        raise _bad(where, "param_names", names[pi], "appears twice")
                    self.index[names[pi]] = (n, pieces)

    def owned_by(self, rank: int) -> set:
        """The piece keys rank's files must hold (world size > 1)."""
        return {piece_key(name, off) for name, (_, pieces) in self.index.items()
                for rk, off, _ in pieces if rk == rank}


def _flat_slice(sl, lo: int, hi: int) -> torch.Tensor:
    """Elements [lo, hi) of a stored tensor as if flattened, reading whole rows of its first
    dimension only (so no more than the range plus two rows comes into memory)."""
    shape = sl.get_shape()
    if len(shape) <= 1:
        return sl[lo:hi] if shape else sl[...].reshape(1)[lo:hi]
    row = math.prod(shape[1:])
    if row == 0 or lo >= hi:
        return sl[0:0].reshape(-1)
    r0, r1 = lo // row, -(-hi // row)
    return sl[r0:r1].reshape(-1)[lo - r0 * row:hi - r0 * row]


class _File:
    """An open rank file (or world-size-1 file): its lazy reader and its keys by piece."""

    def __init__(self, handle, keys: dict, scalars: dict):
        self.f, self.keys, self.scalars = handle, keys, scalars


class PieceReader:
    """Ranges of parameters' masters and optimizer states, from a checkpoint of any world
    size (see the module docstring). A context manager: the files stay open inside it.
    ``lazy``: masters and per-element states come as :class:`Deferred` tensors, checked on
    the files' headers now and read when used (inside the context)."""

    def __init__(self, r: CheckpointReader, meta: dict, where, lazy: bool = False):
        self.r, self.where, self.lazy = r, where, lazy
        self.layout = SavedLayout(meta, where)
        self.world_size = self.layout.world_size
        self._stack = contextlib.ExitStack()
        self._files: dict = {}
        self._scalars1 = None
        self.whole = self.layout.whole
        if self.whole:
            opt = meta.get("optimizer")
            sc = opt.get("scalars", {}) if isinstance(opt, dict) else {}
            if not isinstance(sc, dict) or not all(isinstance(v, dict) for v in sc.values()):
                raise _bad(where, "optimizer.scalars", sc, "must map parameter names to objects")
            self._scalars1 = sc

    def __enter__(self) -> "PieceReader":
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    # -- the files ------------------------------------------------------------------------------
    def _open(self, name: str, rank: int | None, optim: bool) -> _File:
        f = self._files.get(name)
        if f is not None:
            return f
        handle = self._stack.enter_context(self.r.open_tensors(name))
        where = self.r.path / name
        keys: dict = {}
        for k in handle.keys():
            prefix, _, sub = k.rpartition("/") if optim else (k, "", "")
            keys.setdefault(prefix, {})[sub] = k
        scalars: dict = {}
        if rank is not None:
            # Every rank file belongs to the save that meta.json and the manifest belong to, as
            # the rank its name says: a file copied in from another save is refused.
            meta = self.r.metadata(name)
            if meta.get("save_id") != self.r.save_id:
                raise CheckpointError(f"'{where}' belongs to save {meta.get('save_id')!r}, the manifest and meta.json "
                                      f"to {self.r.save_id!r}: the folder mixes two saves. Load another tag.")
            if meta.get("rank") != str(rank):
                raise CheckpointError(f"'{where}' holds the partition of rank {meta.get('rank')!r}, not of rank "
                                      f"{rank}; the checkpoint is corrupt.")
            mine = self.layout.owned_by(rank)
            strange = [k for k in keys if k not in mine]
            if strange:
                raise CheckpointError(f"'{where}' holds '{strange[0]}', which is no piece of rank {rank}'s "
                                      f"partition in this checkpoint's layout; the checkpoint is corrupt.")
            if optim:
                raw = meta.get("scalars", "{}")
                try:
                    scalars = parse_json(raw, where, "metadata 'scalars'")
                except CheckpointError:
                    scalars = None
                if not isinstance(scalars, dict) or not all(isinstance(v, dict) for v in scalars.values()):
                    raise CheckpointError(f"'{where}': its metadata 'scalars' is not a JSON object of objects; "
                                          f"the file is corrupt.")
                strange = [k for k in scalars if k not in mine]
                if strange:
                    raise CheckpointError(f"'{where}': metadata 'scalars' names '{strange[0]}', which is no "
                                          f"piece of rank {rank}'s partition; the file is corrupt.")
        f = self._files[name] = _File(handle, keys, scalars)
        return f

    def _source(self, rank, optim: bool) -> tuple[str, _File]:
        if self.whole:
            name = "optim.safetensors" if optim else "master.safetensors"
        else:
            name = optim_file(rank) if optim else master_file(rank)
        return name, self._open(name, None if self.whole else rank, optim)

    # -- what the checkpoint holds --------------------------------------------------------------------
    def names(self) -> list:
        """Every saved parameter's name, in group order."""
        return [n for row in self.layout.names for n in row]

    def numel(self, name: str) -> int | None:
        """The saved parameter's number of elements (None: the checkpoint has no master for it)."""
        if self.layout.index is not None:
            entry = self.layout.index.get(name)
            return None if entry is None else entry[0]
        _, f = self._source(None, False)
        if name not in f.keys:
            return None
        return math.prod(f.f.get_slice(name).get_shape())

    def shape(self, name: str) -> tuple | None:
        """The master's stored shape for world size 1, None for pieces (flat)."""
        if self.layout.index is not None:
            return None
        _, f = self._source(None, False)
        return tuple(f.f.get_slice(name).get_shape()) if name in f.keys else None

    def _sources(self, name: str, off: int, n: int) -> list:
        """(rank, piece offset, piece length, lo, hi) of the saved pieces overlapping [off, off + n),
        lo/hi relative to the piece."""
        if self.layout.index is None:
            total = self.numel(name)
            pieces = [(None, 0, total)]
        else:
            total, pieces = self.layout.index[name]
        if off < 0 or off + n > total:
            raise CheckpointError(f"'{self.where}': the checkpoint's {name} has {total} elements; "
                                  f"elements [{off}, {off + n}) were asked for.")
        out = []
        for rk, so, sn in pieces:
            lo, hi = max(off, so), min(off + n, so + sn)
            if lo < hi:
                out.append((rk, so, sn, lo - so, hi - so))
        return out

    def _key(self, name: str, so: int) -> str:
        return name if self.whole else piece_key(name, so)

    # -- masters -------------------------------------------------------------------------------------
    def master(self, name: str, off: int, n: int) -> torch.Tensor:
        """fp32 elements [off, off + n) of the parameter's master, flat (a tensor of its own)."""
        parts = []
        for rk, so, sn, lo, hi in self._sources(name, off, n):
            fname, f = self._source(rk, False)
            key = self._key(name, so)
            if key not in f.keys:
                raise CheckpointError(f"'{self.r.path / fname}' has no master weight '{key}'; the checkpoint is "
                                      f"incomplete or corrupt.")
            sl = f.f.get_slice(key)
            if sl.get_dtype() != "F32" or math.prod(sl.get_shape()) != sn:
                raise CheckpointError(f"'{self.r.path / fname}': master weight '{key}' has dtype "
                                      f"{sl.get_dtype()} and shape {sl.get_shape()}, not float32 of {sn} "
                                      f"elements; the checkpoint is corrupt.")
            parts.append((sl, lo, hi))

        def read():
            got = [_flat_slice(sl, lo, hi) for sl, lo, hi in parts]
            if not got:
                return torch.empty(0, dtype=torch.float32)
            return got[0].clone() if len(got) == 1 else torch.cat(got)
        return self._maybe(torch.float32, (n,), read)

    def _maybe(self, dtype, shape, read):
        """``read()`` now, or (lazy) a Deferred tensor of that dtype and shape that reads it."""
        return Deferred(dtype, shape, reading(read, self.r.path)) if self.lazy else read()

    # -- optimizer state -----------------------------------------------------------------------------
    def _piece_state(self, rk, name: str, so: int) -> tuple[str, _File, dict, dict]:
        fname, f = self._source(rk, True)
        key = self._key(name, so)
        tensors = f.keys.get(key, {})
        scalars = (self._scalars1 if self.whole else f.scalars).get(key, {})
        return fname, f, tensors, scalars

    def state(self, name: str, off: int, n: int) -> dict:
        """The optimizer state of elements [off, off + n) of the parameter: per-element tensors
        flat (or as stored, for a range that is exactly one saved piece), the rest (step) as
        saved; {} when the checkpoint has no state for them."""
        srcs = self._sources(name, off, n)
        if len(srcs) == 1 and srcs[0][3] == 0 and srcs[0][4] == srcs[0][2]:
            rk, so, sn, _, _ = srcs[0]
            fname, f, tensors, scalars = self._piece_state(rk, name, so)
            out = {k: self._whole_state(fname, f, full, sn) for k, full in tensors.items()}
            out.update(scalars)
            return out
        parts = [(*self._piece_state(rk, name, so), sn, lo, hi) for rk, so, sn, lo, hi in srcs]
        keysets = [set(p[2]) | set(p[3]) for p in parts]
        odd = next((ks for ks in keysets if ks != keysets[0]), None)
        if odd is not None:
            raise CheckpointError(f"'{self.where}': the saved pieces of {name} hold different optimizer state "
                                  f"keys ({sorted(keysets[0])} and {sorted(odd)}); the checkpoint is corrupt.")
        if not parts or not keysets[0]:
            return {}
        q8 = "exp_avg_scale" in keysets[0]
        out = {k: self._join(name, k, parts) for k in sorted(keysets[0]) if not (q8 and k in _Q8)}
        if q8:
            reads = [self._q8_range(fname, f, tensors, sn, lo, hi) for fname, f, tensors, _, sn, lo, hi in parts]
            total = sum(hi - lo for *_, lo, hi in parts)
            made: dict = {}

            def moment(i):  # both moments come from one dequantization; each is taken once
                if i not in made:
                    ranges = [rd() for rd in reads]
                    made.update({0: torch.cat([m for m, _ in ranges]), 1: torch.cat([v for _, v in ranges])})
                return made.pop(i)
            out["exp_avg"] = self._maybe(torch.float32, (total,), lambda: moment(0))
            out["exp_avg_sq"] = self._maybe(torch.float32, (total,), lambda: moment(1))
        return out

    def _whole_state(self, fname: str, f: _File, key: str, sn: int) -> torch.Tensor:
        """The state tensor ``key`` of a saved piece of sn elements, read whole after checking on
        the header that it has no more elements than the piece (no optimizer state has more)."""
        code, shape = self.r.index(fname)[key]
        if math.prod(shape) > max(sn, 1):
            raise CheckpointError(f"'{self.r.path / fname}': optimizer state '{key}' has shape {list(shape)}, more "
                                  f"elements than its piece ({sn}); the checkpoint is corrupt.")
        read = lambda: f.f.get_tensor(key).clone()  # noqa: E731
        if math.prod(shape) == sn and sn > 1:  # per element (a step is read now: it is checked)
            return self._maybe(_FROM_ST[code], shape, read)
        return read()

    def _join(self, name: str, k: str, parts: list):
        """State ``k`` over several saved pieces: per-element tensors cut and joined (in their
        dtype, fp32 if the pieces disagree), any other value taken once after checking that
        every piece holds the same."""
        vals = []
        for fname, f, tensors, scalars, sn, lo, hi in parts:
            if k in scalars:
                vals.append(("value", scalars[k], fname))
                continue
            sl = f.f.get_slice(tensors[k])
            shape = sl.get_shape()
            if per_element_shape(k, shape, sn):
                vals.append(("elements", (sl, lo, hi), fname))
            else:
                vals.append(("value", self._whole_state(fname, f, tensors[k], sn), fname))
        kinds = {v[0] for v in vals}
        if kinds == {"elements"}:
            dts = {_FROM_ST[v[1][0].get_dtype()] for v in vals}
            dt = dts.pop() if len(dts) == 1 else torch.float32

            def read():
                return torch.cat([_flat_slice(sl, lo, hi).to(dt) for _, (sl, lo, hi), _ in vals])
            return self._maybe(dt, (sum(hi - lo for _, (_, lo, hi), _ in vals),), read)
        if len(kinds) > 1:
            raise CheckpointError(f"'{self.where}': optimizer state '{k}' of {name} is stored differently in its "
                                  f"pieces; the checkpoint is corrupt.")
        first = vals[0][1]
        for _, v, fname in vals[1:]:
            same = torch.equal(v, first) if torch.is_tensor(first) and torch.is_tensor(v) else v == first
            if not same:
                raise CheckpointError(f"'{self.r.path / fname}': the pieces of {name} were saved with different "
                                      f"'{k}' values ({_short(first)} and {_short(v)}); the checkpoint is corrupt.")
        return first

    def _q8_range(self, fname: str, f: _File, tensors: dict, sn: int, lo: int, hi: int):
        """fp32 exp_avg, exp_avg_sq of elements [lo, hi) of one saved 8-bit piece of sn elements:
        the blocks that overlap them are read and dequantized."""
        from ..ops import qblocks
        from ..ops.adam import q8_dequantize
        sls = {}
        for k in _Q8:
            full = tensors.get(k)
            sl = f.f.get_slice(full) if full is not None else None
            want = (_Q8_CODES[k], sn) if k in _Q8_CODES else ("F32", qblocks(sn))
            if sl is None or sl.get_dtype() != want[0] or math.prod(sl.get_shape()) != want[1] or \
                    (k not in _Q8_CODES and len(sl.get_shape()) != 1):
                raise CheckpointError(f"'{self.r.path / fname}': the 8-bit optimizer state of a piece has no "
                                      f"{want[0]} '{k}' of {want[1]} values; the checkpoint is corrupt.")
            sls[k] = sl
        b0, b1 = lo // OPTIM_QBLOCK, -(-hi // OPTIM_QBLOCK)
        e0, e1 = b0 * OPTIM_QBLOCK, min(b1 * OPTIM_QBLOCK, sn)

        def read():
            cm = _flat_slice(sls["exp_avg"], e0, e1).contiguous()
            cv = _flat_slice(sls["exp_avg_sq"], e0, e1).contiguous()
            sm = sls["exp_avg_scale"][b0:b1].contiguous()
            sv = sls["exp_avg_sq_scale"][b0:b1].contiguous()
            m = torch.empty(e1 - e0, dtype=torch.float32)
            v = torch.empty(e1 - e0, dtype=torch.float32)
            q8_dequantize(cm, sm, cv, sv, m, v)
            return m[lo - e0:hi - e0], v[lo - e0:hi - e0]
        return read


def _short(v) -> str:
    r = repr(v.tolist() if torch.is_tensor(v) else v)
    return r if len(r) <= 40 else r[:37] + "..."


# -- agreement between the ranks ------------------------------------------------------------------
def all_gather(obj, doing: str) -> list:
    """Every rank's ``obj`` (small, picklable), in rank order. A collective that fails (a rank
    died or is stuck past the timeout) is a CheckpointError saying so."""
    import torch.distributed as td
    if not (td.is_available() and td.is_initialized()):  # one process: nothing to exchange
        return [obj]
    out: list = [None] * td.get_world_size()
    try:
        td.all_gather_object(out, obj)
    except RuntimeError as e:
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"rank {td.get_rank()} of {td.get_world_size()}: {doing} failed: the ranks could not exchange "
            f"their status ({text}). Another rank has most likely stopped (crashed, killed, out of memory) "
            f"or is stuck: look at the other ranks' output. The collective timeout is DEEPSPEED_TIMEOUT "
            f"minutes (default 10).") from e
    return out


def describe(e: BaseException) -> str:
    """An exception as one rank reports it to the others."""
    return str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"


def raise_failed(results: list, doing: str, own: BaseException | None = None) -> None:
    """Raises the same CheckpointError on every rank when any rank's entry of ``results`` (the
    gathered tuples whose first item is an error message or None) reports an error, naming
    each failed rank and its reason; ``own`` (this rank's exception) is chained to it."""
    bad = [(r, res[0]) for r, res in enumerate(results) if res[0] is not None]
    if bad and len(results) == 1 and own is not None:
        raise own  # one rank: its own error, as it was raised
    if bad:
        ranks = ", ".join(str(r) for r, _ in bad)
        raise CheckpointError(f"{doing} failed on rank{'s' if len(bad) > 1 else ''} {ranks} of {len(results)}: "
                              + "; ".join(f"rank {r}: {e}" for r, e in bad)) from own
