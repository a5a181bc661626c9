"""Checkpoint folders on disk: transactional saves, a manifest with checksums, verified reads.

What this module guarantees (docs/CHECKPOINTS.md states it for users):

- A save is a transaction over a staging folder. The folder is created
  exclusively inside ``save_dir`` under an unpredictable name
  (``.zspeed-staging-<random>``); every file is created inside it with
  O_EXCL and without following symbolic links, written, fsynced and closed;
  ``manifest.json`` (every file with its size and CRC-32) is written last,
  then the folder itself is fsynced. Only then does the folder become the tag:
  a new tag is one rename; an existing tag is renamed aside
  (``.zspeed-old-<random>-<tag>``), the staging folder renamed in, and the old
  one removed. ``latest`` is replaced the same way (temporary file, fsync,
  rename). A crash at any point therefore leaves the old or the new tag
  complete, and ``latest`` naming a complete tag; the one moment when the tag
  name is absent (between the two renames) is repaired by the next save or
  load, which renames the old folder back.
- Leftovers of killed saves (staging folders, old folders, temporary
  ``latest`` files) are removed by the next save, and by the next load that
  may write to the folder. A lock file (``.zspeed-lock``) held by every save,
  and shared by loads, makes "leftover" exact: whatever staging folder exists
  while the lock is held exclusively belongs to a dead save.
- Reads verify each file's size and CRC-32 against the manifest before its
  contents are used, so a truncated, torn or bit-flipped file is an error
  naming the file, never silently loaded.
- A folder that others can write cannot make a read hang, exhaust memory or
  write elsewhere: every file is opened only after its stat says it is a
  regular file, and with O_NONBLOCK (a FIFO swapped in between cannot block
  the open); JSON is bounded in size and nesting; a safetensors header is
  validated whole (dtypes, shapes, offsets inside the file, no overlaps, gaps
  or trailing bytes, its length bounded) before any tensor is read, and the
  callers read only the tensors they expect, after checking their shapes.
  Recovery renames back only real folders (never a symbolic link).

Several ranks (data-parallel ZeRO) share one transaction: rank 0 opens it
(lock, clean-up, staging folder) and tells the others the staging folder's
name; every rank writes its own files into it through a :class:`StagingWriter`
(:meth:`StagingWriter.open_existing` re-opens the folder rank 0 created, never
through a symbolic link) and returns their manifest entries; rank 0 commits
with every rank's entries, or aborts. The ranks must share the file system;
the protocol itself is checkpoint_shards.py.

Tensor files are safetensors, streamed here tensor by tensor through a file
descriptor opened as above (safetensors' own writer takes a path and follows
symlinks, and would need the whole file in memory to checksum it), and read
back with the safetensors package. The reading side (the manifest's checks, the safetensors index,
``open_for_load``) is checkpoint_read.py.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import secrets
import shutil
import stat
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Callable

import torch

from .._native import ZSpeedError

log = logging.getLogger("zspeed.checkpoint")

__all__ = ["CheckpointError", "TagMismatchError", "validate_tag", "SaveTransaction", "StagingWriter",
           "Deferred", "real", "materialized", "reading", "is_tensor", "write_file_atomic", "MANIFEST", "MAX_TAG_BYTES"]

FORMAT = "zspeed-checkpoint-2"
MANIFEST = "manifest.json"
LOCK = ".zspeed-lock"
_STAGING = ".zspeed-staging-"
_OLD = ".zspeed-old-"
_TMP = ".zspeed-tmp-"
_ATOMIC_TMP = re.compile(r"\..+\.zspeed-tmp-[0-9a-f]{16}")  # checkpoint._atomic_output's temporary names
# Tags are directory names: 200 bytes leave room for the old-folder prefix within the
# 255-byte name limit of common file systems.
MAX_TAG_BYTES = 200
_CHUNK = 16 << 20           # bytes per write call and per checksum update
_WIN_BAD = set('<>:"|?*')   # characters Windows refuses in file names

# Test hook: called with a short description at each point of a save where a crash leaves a
# different state on disk (the kill -9 tests stop the process there).
_crash_hook: Callable[[str], None] | None = None
# The one function that writes file data; tests replace it to simulate a full disk.
_write = os.write


class CheckpointError(ZSpeedError, RuntimeError):
    """A checkpoint cannot be written or is incomplete, corrupt or incompatible."""


class LoadIncompleteError(CheckpointError):
    """A checkpoint load failed after it had begun putting the checkpoint in place (a disk error
    reading it after its checks passed, or writing the NVMe swap files): the engine holds part
    of it, and refuses to train or save until a load succeeds."""


class TagMismatchError(CheckpointError, AssertionError):
    """Ranks asked to save under different tags (an AssertionError too, as DeepSpeed's
    checkpoint.tag_validation "Fail" raises; zspeed refuses it in every mode: docs/COMPAT.md)."""


def _crash_point(what: str) -> None:
    if _crash_hook is not None:
        _crash_hook(what)


def validate_tag(tag) -> str:
    """The tag as a string, or CheckpointError saying what is wrong with it."""
    if not isinstance(tag, str):
        tag = str(tag)
    problem = None
    if not tag:
        problem = "it is empty"
    elif tag != tag.strip():
        problem = "it has whitespace at the start or the end"
    elif "\x00" in tag:
        problem = "it contains a NUL character"
    elif any(ord(c) < 32 for c in tag):
        problem = "it contains a control character"
    elif "/" in tag or "\\" in tag or (os.sep in tag) or (os.altsep and os.altsep in tag):
        problem = "it contains a path separator"
    elif tag.startswith("."):
        problem = "it starts with '.' (reserved for zspeed's temporary folders)"
    elif tag == "latest":
        problem = "'latest' is the name of the file that points at the newest tag"
    elif _WIN_BAD.intersection(tag):
        problem = f"it contains one of {''.join(sorted(_WIN_BAD))}, which Windows cannot store"
    else:
        try:
            n = len(tag.encode("utf-8"))
        except UnicodeEncodeError:
            n, problem = 0, "it is not valid Unicode text"
        if n > MAX_TAG_BYTES:
            problem = f"it is {n} bytes long (at most {MAX_TAG_BYTES})"
    if problem:
        shown = tag if len(tag) <= 80 else tag[:77] + "..."
        raise CheckpointError(f"checkpoint tag {shown!r} is not a valid tag: {problem}. Use a plain folder "
                              f"name such as 'step100' or 'best'.")
    return tag


def _oserror(e: OSError, doing: str) -> CheckpointError:
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        why = "the disk is full (or the quota is exceeded)"
    else:
        why = e.strerror or str(e)
    return CheckpointError(f"{doing}: {why} [{errno.errorcode.get(e.errno, e.errno)}]")


# -- directories addressed through a descriptor --------------------------------------------------
_DIR_FD = os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd and hasattr(os, "O_DIRECTORY")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return what
    return "not a plain file"


def _require_regular(st: os.stat_result, where) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"'{where}' is not a regular file ({_kind(st.st_mode)}); a checkpoint folder holds "
                              f"regular files only, so zspeed did not read it. Remove it, or load another "
                              f"checkpoint.")


def _open_regular(name: str, where, dir_fd: int | None = None, follow: bool = True) -> int:
    """A descriptor for reading the regular file ``name`` (relative to ``dir_fd`` when given).
    Anything else (a FIFO, a device, a folder; a symbolic link when ``follow`` is off) is a
    CheckpointError naming ``where``, decided on its stat before it is opened; the open
    itself uses O_NONBLOCK (cleared after it), so a FIFO swapped in meanwhile cannot block
    it, and the descriptor is checked again. A missing file is FileNotFoundError."""
    kw = {"dir_fd": dir_fd} if dir_fd is not None else {}
    _require_regular(os.stat(name, follow_symlinks=follow, **kw), where)
    fd = os.open(name, os.O_RDONLY | _NONBLOCK | _BINARY | _CLOEXEC | (0 if follow else _NOFOLLOW), **kw)
    try:
        _require_regular(os.fstat(fd), where)
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_at(fd: int, n: int, offset: int) -> bytes:
    """n bytes at ``offset`` (fewer only at the end of the file)."""
    parts, got = [], 0
    if not hasattr(os, "pread"):  # Windows
        os.lseek(fd, offset, os.SEEK_SET)
    while got < n:
        b = os.pread(fd, n - got, offset + got) if hasattr(os, "pread") else os.read(fd, n - got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


class _Dir:
    """A directory whose entries are created, renamed and listed relative to an open
    descriptor where the OS allows it (POSIX), so a directory renamed or replaced by a
    symlink after it was opened cannot redirect them; by path elsewhere (Windows)."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: Path, follow: bool = True) -> "_Dir":
        if not _DIR_FD:
            if not path.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
            return cls(path, None)
        flags = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC | (0 if follow else _NOFOLLOW)
        return cls(path, os.open(str(path), flags))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _kw(self) -> dict:
        return {"dir_fd": self.fd} if self.fd is not None else {}

    def _p(self, name: str) -> str:
        return name if self.fd is not None else str(self.path / name)

    def create(self, name: str) -> int:
        """A new file, created exclusively (an existing file or symlink of that name is an error)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY | _CLOEXEC
        return os.open(self._p(name), flags, 0o666, **self._kw())

    def open_flags(self, name: str, flags: int) -> int:
        """os.open of ``name`` in this folder with ``flags`` (mode 0o666 where it creates)."""
        return os.open(self._p(name), flags, 0o666, **self._kw())

    def open_read(self, name: str) -> int:
        """A regular file of this folder for reading, never through a symbolic link (see
        :func:`_open_regular`)."""
        return _open_regular(self._p(name), self.path / name, dir_fd=self.fd, follow=False)

    def mkdir(self, name: str) -> None:
        os.mkdir(self._p(name), 0o777, **self._kw())

    def open_sub(self, name: str) -> "_Dir":
        """The folder ``name`` inside this one, opened without following a symbolic link
        (where the OS allows it; elsewhere a name that is a symlink is refused first)."""
        if self.fd is None:
            if stat.S_ISLNK(self.lstat(name).st_mode):
                raise OSError(errno.ELOOP, "is a symbolic link", str(self.path / name))
            return _Dir.open(self.path / name)
        flags = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC | _NOFOLLOW
        return _Dir(self.path / name, os.open(name, flags, dir_fd=self.fd))

    def rename(self, src: str, dst: str) -> None:
        if self.fd is not None:
            os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        else:
            os.rename(self.path / src, self.path / dst)

    def replace(self, src: str, dst: str) -> None:
        if self.fd is not None:
            os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        else:
            os.replace(self.path / src, self.path / dst)

    def unlink(self, name: str) -> None:
        os.unlink(self._p(name), **self._kw())

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(self._p(name), follow_symlinks=False, **self._kw())

    def names(self) -> list:
        return os.listdir(self.fd if self.fd is not None else str(self.path))

    def fsync(self) -> None:
        """Makes the directory's entries durable (a no-op on Windows, which cannot open a
        directory for fsync and whose NTFS journals renames itself)."""
        if self.fd is not None:
            os.fsync(self.fd)
        elif os.name != "nt":
            fd = os.open(str(self.path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def rmtree(self, name: str) -> None:
        # shutil.rmtree never follows symlinks inside the tree; the entry itself was listed here.
        target = self.path / name
        if stat.S_ISDIR(self.lstat(name).st_mode):
            shutil.rmtree(target)
        else:
            self.unlink(name)


def _exists(d: _Dir, name: str) -> bool:
    try:
        d.lstat(name)
        return True
    except FileNotFoundError:
        return False


# -- the folder lock --------------------------------------------------------------------------------
_NO_LOCKS = {getattr(errno, n) for n in ("ENOLCK", "EOPNOTSUPP", "ENOTSUP", "ENOSYS", "EINVAL") if hasattr(errno, n)}
_warned_no_locks = False


def _warn_no_locks(e: OSError) -> None:
    global _warned_no_locks
    _warned_no_locks = True
    log.warning("zspeed: the checkpoint folder's file system does not support locks (%s); saves and "
                "loads proceed without one, so two processes must not save into one folder at once", e)


class _Lock:
    """An advisory lock on ``<folder>/.zspeed-lock``: exclusive for saves, shared for loads
    (exclusive on Windows, which offers no shared lock through msvcrt). Released when the
    process dies, so a killed save never blocks the next one."""

    def __init__(self, d: _Dir):
        where = d.path / LOCK
        with contextlib.suppress(FileNotFoundError):  # a FIFO or device there is never opened
            st = d.lstat(LOCK)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):  # a symlink: O_NOFOLLOW refuses it
                _require_regular(st, where)
        self.fd = d.open_flags(LOCK, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _BINARY | _CLOEXEC)
        try:
            _require_regular(os.fstat(self.fd), where)
            if _NONBLOCK:
                os.set_blocking(self.fd, True)
        except BaseException:
            os.close(self.fd)
            raise
        self.held = False

    def acquire(self, exclusive: bool, block: bool) -> bool:
        """Takes (or, held already, converts) the lock; False when ``block`` is off and another
        process holds it."""
        if os.name == "nt":
            if self.held:  # one kind of lock only: already held is held
                return True
            import msvcrt
            os.lseek(self.fd, 0, os.SEEK_SET)
            while True:
                try:
                    msvcrt.locking(self.fd, msvcrt.LK_NBLCK, 1)
                    self.held = True
                    return True
                except OSError:
                    if not block:
                        return False
                    time.sleep(0.05)
        import fcntl
        op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if block else fcntl.LOCK_NB)
        try:
            fcntl.flock(self.fd, op)
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                raise
            # A file system without locks (some FUSE and network mounts): saves still work,
            # but nothing keeps two processes from saving into the folder at once.
            if not _warned_no_locks:
                _warn_no_locks(e)
        self.held = True
        return True

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if os.name == "nt":
                import msvcrt
                os.lseek(self.fd, 0, os.SEEK_SET)
                with contextlib.suppress(OSError):
                    msvcrt.locking(self.fd, msvcrt.LK_UNLCK, 1)
            else:
                import fcntl
                with contextlib.suppress(OSError):  # closing the descriptor releases it anyway
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None


def _recover_and_clean(d: _Dir) -> None:
    """With the folder locked exclusively: puts back a tag whose replacement was killed
    between its two renames, then removes every leftover of killed saves."""
    names = d.names()
    for name in names:
        if name.startswith(_OLD) and len(name) > len(_OLD) + 17:
            tag = name[len(_OLD) + 17:]
            try:
                validate_tag(tag)
                # Only a real folder is what a save renamed aside; a symbolic link (or anything
                # else) of that name was planted, and is removed below, never made a tag.
                real = stat.S_ISDIR(d.lstat(name).st_mode)
            except (CheckpointError, OSError):
                continue
            if real and not _exists(d, tag):
                d.rename(name, tag)
                d.fsync()
                log.warning("zspeed: restored checkpoint tag %s from %s (a save replacing it was killed)",
                            tag, name)
    for name in d.names():
        # (also the temporary file of an output written beside the tags, such as the recovery
        # scripts zero_to_fp32.py / zero_to_torch.py: ".<name>.zspeed-tmp-<16 hex>")
        if name.startswith((_STAGING, _OLD, _TMP)) or _ATOMIC_TMP.fullmatch(name):
            try:
                d.rmtree(name)
                log.info("zspeed: removed %s, left by a killed checkpoint save", d.path / name)
            except OSError as e:  # cleanup is best effort; the next save tries again
                log.warning("zspeed: cannot remove %s: %s", d.path / name, e)


# -- writing --------------------------------------------------------------------------------------
_crc_thread = None


def _crc_executor():
    global _crc_thread
    if _crc_thread is None:
        from concurrent.futures import ThreadPoolExecutor
        _crc_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zspeed-crc")
    return _crc_thread


def _write_all(fd: int, data, crc: int) -> int:
    """Writes the whole buffer (in chunks), returning the CRC-32 continued over it. For large
    buffers the checksum of each chunk runs on a helper thread while the chunk is written
    (zlib and os.write both release the GIL), so where a core is free it overlaps the write."""
    mv = memoryview(data).cast("B")
    if len(mv) <= _CHUNK:
        crc = zlib.crc32(mv, crc)
        _write_chunk(fd, mv)
        return crc
    pool, done = _crc_executor(), None
    try:
        for start in range(0, len(mv), _CHUNK):
            chunk = mv[start:start + _CHUNK]
            # One worker runs these in order, so the previous chunk's result is ready.
            done = pool.submit(lambda c=chunk, prev=done: zlib.crc32(c, prev.result() if prev else crc))
            _write_chunk(fd, chunk)
        return done.result()
    finally:
        if done is not None:
            done.exception()  # the helper is done with the buffer before the caller reuses it


def _write_chunk(fd: int, chunk: memoryview) -> None:
    while len(chunk):
        n = _write(fd, chunk)
        chunk = chunk[n:]


_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
              torch.uint8: "U8", torch.bool: "BOOL"}
for _name, _code in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
                     ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _ST_DTYPES[getattr(torch, _name)] = _code


def _safetensors_header(tensors: dict, metadata: dict, file: str) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file holding ``tensors`` in
    order, padded with spaces to a multiple of 8 bytes as the format asks."""
    head: dict = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}} if metadata else {}
    off = 0
    for name, t in tensors.items():
        code = _ST_DTYPES.get(t.dtype)
        if code is None:
            raise CheckpointError(f"cannot store tensor '{name}' in {file}: dtype {t.dtype} has no "
                                  f"safetensors encoding.")
        n = t.numel() * t.element_size()
        head[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


class Deferred:
    """A tensor read only when it is used (``load()`` returns it): what a save writes one
    tensor at a time (:meth:`StagingWriter.write_tensors` needs only dtype and shape for the
    header), and what a load reads from the checkpoint's files as it puts each tensor in place
    (checked on the files' headers first). It answers what checks ask (dtype, shape, numel,
    is_floating_point, dim) without reading; :func:`real` gives the tensor."""

    def __init__(self, dtype: torch.dtype, shape, load: Callable[[], torch.Tensor]):
        self.dtype, self.shape, self.load = dtype, torch.Size(shape), load

    def numel(self) -> int:
        return self.shape.numel()

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def dim(self) -> int:
        return len(self.shape)

    def reshape(self, *shape) -> "Deferred":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape = tuple(self.numel() // max(known, 1) if d == -1 else d for d in shape)
        if math.prod(shape) != self.numel():
            raise RuntimeError(f"shape {list(shape)} is invalid for a tensor of {self.numel()} elements")
        if torch.Size(shape) == self.shape:
            return self
        return Deferred(self.dtype, shape, lambda: self.load().reshape(shape))

    view = reshape


def real(v):
    """``v`` itself, or the tensor a :class:`Deferred` reads (a tensor of its own)."""
    return v.load() if isinstance(v, Deferred) else v


def reading(read: Callable[[], torch.Tensor], where) -> Callable[[], torch.Tensor]:
    """``read`` of a load's Deferred tensor, whose failures (an I/O error of the disk, after
    every check passed) are a CheckpointError that says what it means for the engine."""
    def run():
        try:
            return read()
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"cannot read '{where}' ({type(e).__name__}: {e}) after it was verified. If the "
                                  f"load had begun putting tensors in place, this engine holds part of the "
                                  f"checkpoint: load a checkpoint again before training on.") from e
    return run


def materialized(state: dict) -> dict:
    """A torch-style optimizer ``state`` (index -> {key: value}) with every Deferred tensor read."""
    return {i: ({k: real(v) for k, v in st.items()} if isinstance(st, dict) else st) for i, st in state.items()}


def is_tensor(v) -> bool:
    """A tensor, or a :class:`Deferred` one."""
    return torch.is_tensor(v) or isinstance(v, Deferred)


_STAGING_NAME_LEN = len(_STAGING) + 16


class StagingWriter:
    """Writes files into a staging folder; every write returns the file's manifest entry.
    Any rank may hold one over the same staging folder (each writing its own files)."""

    def __init__(self, d: _Dir):
        self.dir = d

    @classmethod
    def open_existing(cls, root, name: str, owner: int | None = None) -> "StagingWriter":
        """A writer over the staging folder ``root/name`` that another rank's
        :class:`SaveTransaction` created: the name must be a staging folder's, the entry a
        real folder (a symbolic link is refused, never followed) and, when ``owner`` is
        given, owned by that user id (what rank 0 saw when it created it). Close it with
        :meth:`close`."""
        ok = isinstance(name, str) and name.startswith(_STAGING) and len(name) == _STAGING_NAME_LEN and \
            all(c in "0123456789abcdef" for c in name[len(_STAGING):])
        if not ok:
            raise CheckpointError(f"{name!r} is not the name of a zspeed staging folder.")
        try:
            parent = _Dir.open(Path(root))
        except OSError as e:
            raise _oserror(e, f"cannot open the checkpoint folder '{root}'") from None
        try:
            st = parent.lstat(name)
            if not stat.S_ISDIR(st.st_mode):
                raise CheckpointError(f"'{parent.path / name}' is not a folder (a symbolic link or a file): "
                                      f"it is not the staging folder rank 0 created; refusing to write "
                                      f"into it.")
            if owner is not None and os.name != "nt" and st.st_uid != owner:
                raise CheckpointError(f"'{parent.path / name}' belongs to user {st.st_uid}, but rank 0 "
                                      f"created it as user {owner}; refusing to write into it.")
            return cls(parent.open_sub(name))
        except OSError as e:
            raise _oserror(e, f"cannot open the staging folder '{parent.path / name}'") from None
        finally:
            parent.close()

    def close(self) -> None:
        self.dir.close()

    def _file(self, name: str, body: Callable[[int], int]) -> dict:
        fd = None
        try:
            fd = self.dir.create(name)
            crc = body(fd)
            size = os.fstat(fd).st_size
            os.fsync(fd)
        except OSError as e:
            raise _oserror(e, f"cannot write checkpoint file {name} in '{self.dir.path}'") from None
        finally:
            if fd is not None:
                os.close(fd)
        _crash_point(f"staged {name}")
        return {"bytes": size, "crc32": f"{crc:08x}"}

    def write_bytes(self, name: str, data: bytes) -> dict:
        return self._file(name, lambda fd: _write_all(fd, data, 0))

    def write_tensors(self, name: str, tensors: dict, metadata: dict) -> dict:
        """A safetensors file, streamed one tensor at a time (a tensor on another device is
        copied to the CPU when its turn comes)."""
        if sys.byteorder != "little":
            raise CheckpointError("zspeed writes checkpoints on little-endian machines only "
                                  "(safetensors stores little-endian data).")
        header = _safetensors_header(tensors, metadata, name)

        def body(fd: int) -> int:
            crc = _write_all(fd, header, 0)
            _crash_point(f"partial {name}")
            for t in tensors.values():
                if t.numel() == 0:
                    continue
                if isinstance(t, Deferred):
                    d, t = t, t.load()
                    if t.dtype != d.dtype or t.numel() != d.numel():
                        raise CheckpointError(f"zspeed internal error: a tensor of {name} was announced as "
                                              f"{d.dtype} {tuple(d.shape)} and read as {t.dtype} "
                                              f"{tuple(t.shape)}; nothing was saved.")
                t = t.detach()
                if t.device.type != "cpu":
                    t = t.to("cpu")
                raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
                crc = _write_all(fd, raw, crc)
            return crc

        return self._file(name, body)


class SaveTransaction:
    """One save of one tag (see the module docstring). Use as a context manager: leaving it
    without :meth:`commit` (an exception) removes the staging folder."""

    def __init__(self, root, tag: str):
        self.tag = validate_tag(tag)
        self.root_path = Path(root)
        self._lock = None
        self.dir: _Dir | None = None
        self.staging: str | None = None
        self._committed = False
        try:
            self.root_path.mkdir(parents=True, exist_ok=True)
            self.dir = _Dir.open(self.root_path)
            self._lock = _Lock(self.dir)
            if not self._lock.acquire(exclusive=True, block=False):
                log.info("zspeed: waiting for another save or load of %s to finish", self.root_path)
                self._lock.acquire(exclusive=True, block=True)
            _recover_and_clean(self.dir)
            self.replaces = self._check_target()
            self.staging = _STAGING + secrets.token_hex(8)
            self.dir.mkdir(self.staging)
            self.writer = StagingWriter(_Dir.open(self.root_path / self.staging, follow=False))
        except OSError as e:
            self._release()
            raise _oserror(e, f"cannot start a checkpoint save in '{self.root_path}'") from None
        except BaseException:
            self._release()
            raise

    def _check_target(self) -> bool:
        """Whether the tag exists (and may be replaced: it is a zspeed checkpoint folder)."""
        try:
            st = self.dir.lstat(self.tag)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            raise CheckpointError(f"'{self.root_path / self.tag}' exists and is not a folder; zspeed will not "
                                  f"replace it with the checkpoint. Choose another tag or remove it.")
        inside = set(os.listdir(self.root_path / self.tag))
        if inside and not inside & {MANIFEST, "meta.json"}:
            raise CheckpointError(f"'{self.root_path / self.tag}' exists and is not a zspeed checkpoint "
                                  f"(no {MANIFEST}); zspeed will not replace it. Choose another tag or remove "
                                  f"the folder.")
        return True

    def __enter__(self) -> "SaveTransaction":
        return self

    def __exit__(self, *exc) -> None:
        if not self._committed and self.staging is not None:
            with contextlib.suppress(OSError):
                self.dir.rmtree(self.staging)
        self._release()

    def _release(self) -> None:
        if getattr(self, "writer", None) is not None:
            self.writer.dir.close()
            self.writer = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self.dir is not None:
            self.dir.close()

    def commit(self, entries: dict, save_id: str, save_latest: bool, world_size: int = 1) -> Path:
        """Writes the manifest listing ``entries`` (file name -> entry, from every writer),
        makes the staging folder the tag, and points ``latest`` at it. ``world_size``: the
        number of ranks whose partition files the tag holds."""
        manifest = {"format": FORMAT, "tag": self.tag, "save_id": save_id, "world_size": world_size,
                    "files": dict(sorted(entries.items()))}
        d = self.dir
        try:
            # The manifest is not listed in itself: it is the root of the integrity check.
            self.writer.write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())
            self.writer.dir.fsync()
            _crash_point("staging synced")
            if self.replaces:
                old = f"{_OLD}{secrets.token_hex(8)}-{self.tag}"
                d.rename(self.tag, old)
                _crash_point("old tag moved aside")
                try:
                    d.rename(self.staging, self.tag)
                except OSError:
                    d.rename(old, self.tag)  # the previous version goes back under its name
                    raise
                self._committed = True
                d.fsync()
                _crash_point("new tag in place")
            else:
                d.rename(self.staging, self.tag)
                self._committed = True
                d.fsync()
                _crash_point("new tag in place")
            if save_latest:
                write_file_atomic(d, "latest", self.tag.encode("utf-8"))
                _crash_point("latest replaced")
            if self.replaces:
                d.rmtree(old)
                _crash_point("old tag removed")
        except OSError as e:
            raise _oserror(e, f"cannot commit checkpoint '{self.root_path / self.tag}'") from None
        return self.root_path / self.tag


def write_file_atomic(d: _Dir, name: str, data: bytes) -> None:
    """Replaces ``d/name`` with ``data``: a temporary file created exclusively, fsynced and
    renamed over the name (which replaces a symlink there, never its target)."""
    tmp = _TMP + secrets.token_hex(8)
    fd = d.create(tmp)
    try:
        try:
            _write_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        _crash_point(f"temporary {name} written")
        d.replace(tmp, name)
    except BaseException:
        with contextlib.suppress(OSError):
            d.unlink(tmp)
        raise
    d.fsync()
