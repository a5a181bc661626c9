"""Reading a checkpoint folder (checkpoint_files.py's guarantees, the reading half): ``open_for_load``
resolves ``latest`` and the tag under the folder's shared lock (repairing a save killed between
its renames), and a :class:`CheckpointReader` verifies each file's size and CRC-32 against the
manifest before its contents are used, parses JSON within bounds, and validates a safetensors
header whole (dtypes, shapes, offsets, no overlaps or gaps) before any tensor is read.
"""
from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import struct
import zlib
from pathlib import Path
from typing import Iterator

import torch

from .checkpoint_files import (_CHUNK, _OLD, _ST_DTYPES, FORMAT, MANIFEST, CheckpointError, _Dir, _Lock,
                               _open_regular, _oserror, _read_at, _recover_and_clean, _require_regular, log,
                               validate_tag)

__all__ = ["CheckpointReader", "open_for_load", "parse_json", "json_depth", "safetensors_index"]

# What a load accepts (a save refuses to write more: checkpoint.py)
_MAX_JSON = 256 << 20       # manifest.json / meta.json larger than this is not a zspeed file
_MAX_JSON_DEPTH = 64        # nor is JSON nested deeper (meta.json's own fields are 4 deep)
_MAX_HEADER = 100_000_000   # a safetensors header larger than this is malformed (safetensors' own bound)
_MAX_LATEST = 4096          # bytes of a 'latest' file


def _crc_of(fd: int, size: int) -> int:
    if size == 0:
        return 0
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as m:
        crc = 0
        view = memoryview(m)
        try:
            for start in range(0, size, _CHUNK):
                crc = zlib.crc32(view[start:start + _CHUNK], crc)
        finally:
            view.release()
        return crc


def json_depth(obj, limit: int = _MAX_JSON_DEPTH) -> int:
    """How deeply ``obj`` (parsed JSON) nests lists and objects (a scalar: 0), counted without
    recursion; the count stops early once it passes ``limit``."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, depth = stack.pop()
        children = o.values() if isinstance(o, dict) else o if isinstance(o, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the name {k!r} appears twice")
        out[k] = v
    return out


def parse_json(raw, where, what: str, unique: bool = False):
    """JSON text read from a checkpoint (bytes or str), bounded: at most ``_MAX_JSON`` bytes
    and ``_MAX_JSON_DEPTH`` levels of nesting; any problem is a CheckpointError naming
    ``where``. ``unique``: a name twice in one object is an error too."""
    if len(raw) > _MAX_JSON:
        raise CheckpointError(f"'{where}' is larger than {_MAX_JSON} bytes: not a zspeed {what}.")
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"'{where}' is not UTF-8 text (byte {e.start}); the file is corrupt.") from None
    deep = CheckpointError(f"'{where}' is nested more than {_MAX_JSON_DEPTH} levels deep: not a zspeed {what} "
                           f"(zspeed writes at most {_MAX_JSON_DEPTH}); the file is corrupt or was crafted.")
    try:
        obj = json.loads(raw, object_pairs_hook=_no_duplicates if unique else None)
    except RecursionError:  # the parser's own guard, for nesting deeper than the interpreter allows
        raise deep from None
    except ValueError as e:
        raise CheckpointError(f"'{where}' is not valid JSON ({e}); the file is corrupt.") from None
    if json_depth(obj) > _MAX_JSON_DEPTH:
        raise deep
    return obj


def _json_file(p: Path, what: str):
    """A JSON file not listed in a manifest (the manifest itself)."""
    try:
        fd = _open_regular(str(p), p)
    except OSError as e:
        raise _oserror(e, f"cannot read '{p}'") from None
    try:
        size = os.fstat(fd).st_size
        if size > _MAX_JSON:
            raise CheckpointError(f"'{p}' is larger than {_MAX_JSON} bytes: not a zspeed {what}.")
        raw = _read_at(fd, size, 0)
    except OSError as e:
        raise _oserror(e, f"cannot read '{p}'") from None
    finally:
        os.close(fd)
    return parse_json(raw, p, what)


# safetensors dtype codes zspeed reads: the ones it writes (this torch's), with their item sizes.
_FROM_ST = {code: dt for dt, code in _ST_DTYPES.items()}
_ST_SIZE = {code: torch.empty((), dtype=dt).element_size() for code, dt in _FROM_ST.items()}
_MAX_DIMS = 64


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _short_repr(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def safetensors_index(fd: int, size: int, where) -> tuple[dict, dict]:
    """(tensor name -> (dtype code, shape), the ``__metadata__``) of the safetensors file open
    as ``fd`` (``size`` bytes), after validating its whole header without reading any tensor:
    the header's length (within the file and at most ``_MAX_HEADER``), its JSON (bounded, no
    name twice), every dtype (one zspeed reads), shape (at most 64 dimensions of sizes >= 0)
    and byte range (its length the shape's, inside the file), and that the ranges tile the
    data exactly: no overlap, no gap, nothing after the last tensor."""
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"'{where}' is not a valid safetensors file: {why}; the file is corrupt or not a "
                               f"zspeed checkpoint file.")
    if size < 8:
        raise bad(f"it has {size} bytes, fewer than the 8 of a header length")
    n = struct.unpack("<Q", _read_at(fd, 8, 0))[0]
    if n > _MAX_HEADER:
        raise bad(f"its header claims {n} bytes, more than the {_MAX_HEADER} a header may have")
    if n > size - 8:
        raise bad(f"its header claims {n} bytes, but the file has {size - 8} after the header length")
    head = parse_json(_read_at(fd, n, 8), where, "safetensors header", unique=True)
    if not isinstance(head, dict):
        raise bad("its header is not a JSON object")
    meta = head.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise bad("its __metadata__ is not an object of strings")
    data = size - 8 - n
    index, ranges = {}, []
    for name, e in head.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"the entry of tensor '{name}' is malformed ({_short_repr(e)})")
        code, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if code not in _ST_SIZE:
            raise bad(f"tensor '{name}' has dtype {_short_repr(code)}, which zspeed does not read")
        if not isinstance(shape, list) or len(shape) > _MAX_DIMS or not all(_is_count(d) for d in shape):
            raise bad(f"tensor '{name}' has an invalid shape {_short_repr(shape)}")
        if not isinstance(offs, list) or len(offs) != 2 or not all(_is_count(o) for o in offs) or offs[0] > offs[1]:
            raise bad(f"tensor '{name}' has invalid data_offsets {_short_repr(offs)}")
        if offs[1] > data:
            raise bad(f"tensor '{name}' ends at byte {offs[1]} of the data, beyond the end of the file "
                      f"({data} bytes of data)")
        numel = math.prod(shape)
        if numel * _ST_SIZE[code] != offs[1] - offs[0]:
            raise bad(f"tensor '{name}' holds {numel} elements of {code} ({numel * _ST_SIZE[code]} bytes), but its "
                      f"data_offsets span {offs[1] - offs[0]} bytes")
        index[name] = (code, tuple(shape))
        ranges.append((offs[0], offs[1], name))
    at = 0
    for lo, hi, name in sorted(ranges):
        if lo < at:
            raise bad(f"tensor '{name}' (bytes {lo}-{hi} of the data) overlaps the tensor before it")
        if lo > at:
            raise bad(f"bytes {at}-{lo} of the data, before tensor '{name}', belong to no tensor")
        at = hi
    if at != data:
        raise bad(f"it has {data - at} bytes after its last tensor")
    return index, meta


class CheckpointReader:
    """A committed tag folder: its manifest, and files read only after their size and
    checksum matched it (and, for safetensors files, their header was validated)."""

    def __init__(self, path: Path):
        self.path = path
        self._verified: set = set()
        self._index: dict = {}      # safetensors file -> (tensor name -> (dtype code, shape), metadata)
        self._ids: dict = {}        # verified file -> the identity of what was verified (see _same_file)
        mp = path / MANIFEST
        if not os.path.lexists(mp):
            ds = sorted(path.glob("*model_states.pt")) if path.is_dir() else []
            if (path / "meta.json").is_file():
                detail = ("it holds meta.json without a manifest: it was written by an older zspeed, whose "
                          "checkpoints cannot be verified; re-save it with that version's weights loaded")
            elif ds:  # DeepSpeed's pickled files: say how to bring the weights over
                detail = (f"it holds DeepSpeed's checkpoint files ({ds[0].name}), which zspeed does not read "
                          f"(its checkpoints are safetensors: docs/COMPAT.md). To start from those weights, run "
                          f"DeepSpeed's zero_to_fp32.py from '{path.parent}' with DeepSpeed installed, load the "
                          f"written state dict into the model (model.load_state_dict) before zspeed.initialize, "
                          f"and train on without load_checkpoint (the optimizer state is not carried over)")
            else:
                detail = "it is not a zspeed checkpoint folder"
            raise CheckpointError(f"checkpoint '{path}' has no {MANIFEST}: {detail}.")
        m = _json_file(mp, "the manifest")
        files = m.get("files") if isinstance(m, dict) else None
        if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(files, dict):
            raise CheckpointError(f"'{mp}' is not a zspeed checkpoint manifest (format "
                                  f"{m.get('format') if isinstance(m, dict) else None!r}, expected {FORMAT!r}).")
        for name, e in files.items():
            ok = (isinstance(name, str) and name and "/" not in name and "\\" not in name and
                  not name.startswith(".") and isinstance(e, dict) and isinstance(e.get("bytes"), int) and
                  not isinstance(e.get("bytes"), bool) and e["bytes"] >= 0 and isinstance(e.get("crc32"), str))
            if not ok:
                raise CheckpointError(f"'{mp}': the entry for {name!r} is malformed ({e!r}); the manifest is "
                                      f"corrupt.")
        self.manifest = m
        self.files: dict = files
        self.save_id = str(m.get("save_id", ""))

    def has(self, name: str) -> bool:
        return name in self.files

    def _open_listed(self, name: str) -> tuple[int, Path, dict]:
        """(descriptor, path, manifest entry) of a listed regular file whose size matches."""
        p = self.path / name
        if name not in self.files:
            raise CheckpointError(f"checkpoint '{self.path}' has no {name} (its manifest does not list it).")
        want = self.files[name]
        try:
            fd = _open_regular(str(p), p)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint '{self.path}' is incomplete: {name}, listed in its manifest, "
                                  f"is missing.") from None
        except OSError as e:
            raise _oserror(e, f"cannot open '{p}'") from None
        try:
            size = os.fstat(fd).st_size
        except OSError as e:
            os.close(fd)
            raise _oserror(e, f"cannot read '{p}'") from None
        if size != want["bytes"]:
            os.close(fd)
            raise CheckpointError(f"'{p}' has {size} bytes, its manifest says {want['bytes']}: the file is "
                                  f"truncated or was changed after the save. Load another tag.")
        return fd, p, want

    def _check_crc(self, p: Path, crc: int, want: dict) -> None:
        if f"{crc:08x}" != want["crc32"]:
            raise CheckpointError(f"'{p}' is corrupt: its CRC-32 is {crc:08x}, its manifest says {want['crc32']} "
                                  f"(the data changed after the save: a disk or copy error). Load another tag.")

    def verify(self, name: str) -> Path:
        """The path of a listed file whose size and CRC-32 match the manifest; for a
        safetensors file, whose header is valid and whose save id (when it records one) is
        the manifest's."""
        p = self.path / name
        if name in self._verified:
            return p
        fd, p, want = self._open_listed(name)
        try:
            size = want["bytes"]
            self._ids[name] = _identity(os.fstat(fd))
            self._check_crc(p, _crc_of(fd, size), want)
            if name.endswith(".safetensors"):
                index, meta = safetensors_index(fd, size, p)
                sid = meta.get("save_id")
                if sid is not None and sid != self.save_id:
                    raise CheckpointError(f"'{p}' belongs to save {sid!r}, the manifest to {self.save_id!r}: the "
                                          f"folder mixes two saves (a file copied from another checkpoint). Load "
                                          f"another tag.")
                self._index[name] = (index, meta)
        except OSError as e:
            raise _oserror(e, f"cannot read '{p}'") from None
        finally:
            os.close(fd)
        self._verified.add(name)
        return p

    def json(self, name: str):
        """A listed JSON file, read once (size bounded before reading), checked and parsed."""
        fd, p, want = self._open_listed(name)
        try:
            if want["bytes"] > _MAX_JSON:
                raise CheckpointError(f"'{p}' is larger than {_MAX_JSON} bytes: not a zspeed {name}.")
            raw = _read_at(fd, want["bytes"], 0)
        except OSError as e:
            raise _oserror(e, f"cannot read '{p}'") from None
        finally:
            os.close(fd)
        self._check_crc(p, zlib.crc32(raw), want)
        self._verified.add(name)
        return parse_json(raw, p, name)

    def index(self, name: str) -> dict:
        """The verified safetensors file's tensors, name -> (dtype code, shape), nothing read."""
        self.verify(name)
        return self._index[name][0]

    def metadata(self, name: str) -> dict:
        """The verified safetensors file's ``__metadata__``."""
        self.verify(name)
        return self._index[name][1]

    def specs(self, name: str) -> dict:
        """The verified safetensors file's tensors as meta tensors (dtype and shape, no data),
        for checking names and shapes before anything is read."""
        return {k: torch.empty(shape, dtype=_FROM_ST[code], device="meta")
                for k, (code, shape) in self.index(name).items()}

    def _same_file(self, name: str) -> Path:
        """The verified file's path, after checking (without opening it) that the name still
        holds the regular file that was verified: safetensors opens files by path."""
        p = self.verify(name)
        try:
            st = os.stat(p)
        except OSError as e:
            raise _oserror(e, f"cannot read '{p}'") from None
        _require_regular(st, p)
        if _identity(st) != self._ids[name]:
            raise CheckpointError(f"'{p}' was replaced or changed after zspeed verified it (another process is "
                                  f"writing into the checkpoint folder?). Load again.")
        return p

    @contextlib.contextmanager
    def open_tensors(self, name: str):
        """The verified safetensors file ``name`` opened lazily (safetensors' ``safe_open``):
        tensors and slices are read when asked for. A malformed file is a CheckpointError."""
        p = self._same_file(name)
        safe_open = _safe_open()
        try:
            f = safe_open(str(p), framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error types for malformed files
            raise CheckpointError(f"cannot read '{p}' as safetensors: {e}.") from None
        with f:
            yield f

    def tensors(self, name: str, want=None) -> dict:
        """The tensors of the verified safetensors file whose names are in ``want`` (default:
        all), each read into memory of its own; the others are never read."""
        p = self._same_file(name)
        keys = [k for k in self._index[name][0] if want is None or k in want]
        safe_open = _safe_open()
        try:
            # get_tensor may return a view of the file's memory mapping; a copy owns its memory,
            # so nothing loaded keeps the file mapped (which would pin it, and on Windows stop
            # the next save from replacing the tag).
            with safe_open(str(p), framework="pt", device="cpu") as f:
                return {k: f.get_tensor(k).clone() for k in keys}
        except Exception as e:  # safetensors raises its own error types for malformed files
            raise CheckpointError(f"cannot read '{p}' as safetensors: {e}.") from None


def _identity(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _safe_open():
    try:
        from safetensors import safe_open
    except ImportError:
        raise CheckpointError("zspeed checkpoints need the 'safetensors' package: pip install "
                              "safetensors") from None
    return safe_open


def _read_latest(d: _Dir) -> str | None:
    try:
        fd = d.open_read("latest")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _oserror(e, f"cannot read '{d.path / 'latest'}'") from None
    try:
        raw = os.read(fd, _MAX_LATEST + 1)
    finally:
        os.close(fd)
    where = d.path / "latest"
    if len(raw) > _MAX_LATEST:
        raise CheckpointError(f"'{where}' is larger than {_MAX_LATEST} bytes: it should hold one tag name.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"'{where}' is not UTF-8 text (byte {e.start}): it should hold one tag "
                              f"name; the file is corrupt.") from None
    # A newline at the end (echo tag > latest) is tolerated; any other whitespace is part of the name.
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    try:
        return validate_tag(text)
    except CheckpointError as e:
        raise CheckpointError(f"'{where}' names an invalid tag: {e}") from None


@contextlib.contextmanager
def open_for_load(root, tag=None) -> Iterator[CheckpointReader | None]:
    """The reader of ``root/<tag>`` (default: the tag named by ``root/latest``) while the
    folder is locked for reading, or None when there is no checkpoint: no folder, no
    ``latest``, or an explicit tag that does not exist (DeepSpeed's "nothing to load").
    A ``latest`` that names a missing or invalid tag is a CheckpointError. When the
    folder is writable, leftovers of killed saves are repaired and removed first."""
    root = Path(root)
    if tag is not None:
        tag = validate_tag(tag)
    if not root.is_dir():
        yield None
        return
    try:
        d = _Dir.open(root)
    except OSError as e:
        raise _oserror(e, f"cannot open checkpoint folder '{root}'") from None
    lock = None
    try:
        try:
            lock = _Lock(d)
        except OSError:  # a read-only folder: nobody can be saving into it
            lock = None
        if lock is not None:
            if lock.acquire(exclusive=True, block=False):
                _recover_and_clean(d)
                lock.acquire(exclusive=False, block=True)  # downgrade: other loads may proceed
            else:
                lock.acquire(exclusive=False, block=True)
        from_latest = tag is None
        if from_latest:
            tag = _read_latest(d)
            if tag is None:
                log.warning("zspeed: no 'latest' file in %s: no checkpoint loaded", root)
                yield None
                return
        if not (root / tag).is_dir():  # a tag may be a symlink to a folder when loading
            if from_latest:
                stranded = [n for n in d.names() if n.startswith(_OLD) and n.endswith("-" + tag)]
                hint = (f" A save replacing it was killed; its previous version is in "
                        f"'{root / stranded[0]}' (a load with write access to the folder restores it)."
                        if stranded else "")
                raise CheckpointError(f"'{root / 'latest'}' names tag '{tag}', but '{root / tag}' is not a "
                                      f"checkpoint folder.{hint}")
            log.warning("zspeed: checkpoint %s does not exist: no checkpoint loaded", root / tag)
            yield None
            return
        yield CheckpointReader(root / tag)
    finally:
        if lock is not None:
            lock.release()
        d.close()
