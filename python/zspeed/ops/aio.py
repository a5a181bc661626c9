"""DeepSpeed-compatible asynchronous file I/O on libzspeed's aio engine.

:class:`AsyncIOHandle` has the method names, arguments, defaults and return
values of DeepSpeed's ``async_io`` ``aio_handle`` (``sync_pread``,
``async_pwrite``, ``wait``, ``new_cpu_locked_tensor``, ...), but runs on
Linux (io_uring or threads), Windows (IOCP) and macOS (threads) without a
compiled torch extension. Buffers may be torch CPU tensors, numpy arrays,
bytes-like objects and ctypes arrays, or CUDA tensors (staged through a
page-locked host buffer); see zspeed.ops._tensors. torch is imported only
when a tensor is passed, so this module imports without it.

Differences from DeepSpeed, all deliberate: failures raise
:class:`zspeed.NativeError` (with the C error name and a message saying what
failed and how to fix it) instead of asserting or printing; a read past the
end of a file is an error (``ZS_EOF``); buffers need no alignment.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any

from .._native import NativeError, ZSpeedError, check, lib
from .._signatures.aio import AioBackend, AioConfig, AioDirect, AioStats
from .._signatures.common import PinFlags
from ._lifetime import NativeHandleOwner
from ._tensors import INT32, INT64, Buf, buf, integer, is_torch

__all__ = ["AsyncIOHandle", "aio_handle", "aio_backend", "BACKENDS", "DIRECT"]

# The names users pass for the C enums: "auto", "io_uring", ... / "on", ...
BACKENDS = {m.name.lower(): m for m in AioBackend}
DIRECT = {m.name.lower(): m for m in AioDirect}
# DeepSpeed's get_alignment(): intra_op_parallelism * this.
_DS_O_DIRECT_ALIGNMENT = 512


def aio_backend(backend: str = "auto") -> tuple[str, str]:
    """(chosen backend, why) for a backend request, without a handle.

    Raises NativeError (ZS_ENOTSUP) if the backend is forced but unusable."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
    why = ctypes.create_string_buffer(512)
    rc = check(lib.zs_aio_backend_resolve(BACKENDS[backend], why, len(why)),
               "zs_aio_backend_resolve")
    return lib.zs_aio_backend_name(rc).decode(), why.value.decode()


class AsyncIOHandle(NativeHandleOwner):
    """DeepSpeed's ``aio_handle`` on zspeed.

    Arguments and defaults are DeepSpeed's (``block_size=1 MiB``,
    ``queue_depth=128``, ``single_submit=False``, ``overlap_events=False``,
    ``intra_op_parallelism=1``); ``backend`` (auto | io_uring | threads |
    iocp) and ``direct`` (auto | on | off) are zspeed's additions. The
    environment variable ZSPEED_AIO_BACKEND overrides backend="auto".
    """

    def __init__(self, block_size: int = 1048576, queue_depth: int = 128,
                 single_submit: bool = False, overlap_events: bool = False,
                 intra_op_parallelism: int = 1, *, backend: str = "auto",
                 direct: str = "auto"):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
        if direct not in DIRECT:
            raise ValueError(f"direct must be one of {sorted(DIRECT)}, got {direct!r}")
        cfg = AioConfig()
        lib.zs_aio_config_init(ctypes.byref(cfg))
        cfg.block_size = integer(block_size, "block_size", INT64)
        cfg.queue_depth = integer(queue_depth, "queue_depth", INT32)
        cfg.single_submit, cfg.overlap_events = int(bool(single_submit)), int(bool(overlap_events))
        cfg.intra_op_parallelism = integer(intra_op_parallelism, "intra_op_parallelism", INT32)
        cfg.backend, cfg.direct = BACKENDS[backend], DIRECT[direct]
        h = ctypes.c_void_p()
        check(lib.zs_aio_create(ctypes.byref(h), ctypes.byref(cfg)), "zs_aio_create")
        self._h = h
        self._cfg = cfg
        self._lock = threading.Lock()
        self._inflight: dict[int, Buf] = {}
        self._locked: dict[int, tuple[int, int, Any]] = {}

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Waits for outstanding requests and frees the handle."""
        if getattr(self, "_h", None):
            lib.zs_aio_destroy(self._h)
            self._h = None
            self._inflight.clear()

    def native(self):
        """The ``zs_aio *`` of this handle, for calls of libzspeed's C API that this class does not
        wrap (``zs_aio_file_*`` on a file opened once, as ZeRO-3's NVMe parameter store does);
        valid until :meth:`close`."""
        if not self._h:
            raise ZSpeedError("this AsyncIOHandle is closed")
        return self._h

    _handle = native

    # -------------------------------------------------------------- knobs
    def get_block_size(self) -> int:
        return self._cfg.block_size

    def get_queue_depth(self) -> int:
        return self._cfg.queue_depth

    def get_single_submit(self) -> bool:
        return bool(self._cfg.single_submit)

    def get_overlap_events(self) -> bool:
        return bool(self._cfg.overlap_events)

    def get_intra_op_parallelism(self) -> int:
        return self._cfg.intra_op_parallelism

    get_thread_count = get_intra_op_parallelism  # DeepSpeed before 0.15

    def get_alignment(self) -> int:
        """DeepSpeed's value (intra_op_parallelism * 512), for callers that pad
        tensors with it; zspeed itself accepts any size and offset."""
        return self._cfg.intra_op_parallelism * _DS_O_DIRECT_ALIGNMENT

    @property
    def backend(self) -> str:
        return lib.zs_aio_backend(self._handle()).decode()

    @property
    def backend_why(self) -> str:
        return lib.zs_aio_backend_why(self._handle()).decode()

    def stats(self) -> dict[str, int]:
        st = AioStats()
        lib.zs_aio_stats_get(self._handle(), ctypes.byref(st))
        return {name: getattr(st, name) for name, _ in AioStats._fields_}

    # ----------------------------------------------------------- requests
    def _submit(self, buffer: Any, filename: Any, file_offset: int, write: bool) -> int:
        off = integer(file_offset, "file_offset", INT64)
        b = buf(buffer, "buffer", writable=not write, allowed=None, stage=True)
        h = self._handle()
        if isinstance(filename, int):
            filename = _fd_path(filename)
        path = os.fsencode(filename)
        fn = lib.zs_aio_pwrite_path if write else lib.zs_aio_pread_path
        rid = fn(h, path, ctypes.c_void_p(b.ptr), b.nbytes, off)
        check(rid, "zs_aio_pwrite_path" if write else "zs_aio_pread_path")
        with self._lock:
            self._inflight[rid] = b
        return rid

    def _wait_ids(self, ids: list[int]) -> int:
        first: NativeError | None = None
        for rid in ids:
            rc = lib.zs_aio_wait(self._handle(), rid)
            with self._lock:
                b = self._inflight.pop(rid, None)
            if rc < 0:
                try:
                    check(rc, "wait")
                except NativeError as e:
                    first = first or e
            elif b is not None:
                b.finish()
        if first is not None:
            raise first
        return len(ids)

    def wait(self) -> int:
        """Waits for every asynchronous request; returns how many completed.

        Raises NativeError for the first failed one (all are collected)."""
        with self._lock:
            ids = sorted(self._inflight)
        return self._wait_ids(ids)

    def sync_pread(self, buffer: Any, filename: Any, file_offset: int = 0) -> int:
        """Reads buffer.nbytes from filename at file_offset; returns 1 (ops)."""
        return self._wait_ids([self._submit(buffer, filename, file_offset, False)])

    def sync_pwrite(self, buffer: Any, filename: Any, file_offset: int = 0) -> int:
        """Writes the buffer to filename at file_offset (file created if
        missing, never truncated); returns 1 (ops)."""
        return self._wait_ids([self._submit(buffer, filename, file_offset, True)])

    def async_pread(self, buffer: Any, filename: Any, file_offset: int = 0) -> int:
        """Starts a read; returns 0. wait() completes it."""
        self._submit(buffer, filename, file_offset, False)
        return 0

    def async_pwrite(self, buffer: Any, filename: Any = None, file_offset: int = 0, *, fd: Any = None) -> int:
        """Starts a write; returns 0. wait() completes it. The target is ``filename``, or
        an open file descriptor given positionally or as ``fd=`` (DeepSpeed's two
        overloads), never both."""
        if fd is not None:
            if filename is not None:
                raise TypeError("async_pwrite takes filename or fd=, not both")
            if isinstance(fd, bool) or not isinstance(fd, int):
                raise TypeError(f"fd must be an open file descriptor (an int), got {type(fd).__name__}")
            filename = fd
        if filename is None:
            raise TypeError("async_pwrite needs a filename or fd=")
        self._submit(buffer, filename, file_offset, True)
        return 0

    def _transfer(self, buffer: Any, filename: Any, validate: bool, async_op: bool,
                  file_offset: int, write: bool) -> int:
        """pread/pwrite: an async submit (returns 0), or a sync transfer, then the
        optional validation against the file."""
        if async_op:
            self._submit(buffer, filename, file_offset, write)
            return 0
        sync = self.sync_pwrite if write else self.sync_pread
        n = sync(buffer, filename, file_offset)
        if validate:
            _validate(buffer, filename, file_offset)
        return n

    def pread(self, buffer: Any, filename: Any, validate: bool, async_op: bool,
              file_offset: int = 0) -> int:
        """DeepSpeed's pread(buffer, filename, validate, async, file_offset)."""
        return self._transfer(buffer, filename, validate, async_op, file_offset, False)

    def pwrite(self, buffer: Any, filename: Any, validate: bool, async_op: bool,
               file_offset: int = 0) -> int:
        """DeepSpeed's pwrite(buffer, filename, validate, async, file_offset)."""
        return self._transfer(buffer, filename, validate, async_op, file_offset, True)

    def read(self, buffer: Any, filename: Any, validate: bool = False,
             file_offset: int = 0) -> int:
        """Synchronous read of the buffer's size; returns 0 like DeepSpeed."""
        self.pread(buffer, filename, validate, False, file_offset)
        return 0

    def write(self, buffer: Any, filename: Any, validate: bool = False,
              file_offset: int = 0) -> int:
        """Synchronous write of the buffer; returns 0 like DeepSpeed."""
        self.pwrite(buffer, filename, validate, False, file_offset)
        return 0

    # ------------------------------------------------------ locked memory
    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: Any):
        """A CPU tensor (or numpy array, if example_tensor is one) of num_elem
        elements of example_tensor's dtype in page-locked, page-aligned memory.
        If the OS refuses to lock (RLIMIT_MEMLOCK), the memory is unlocked but
        still aligned. Free it with free_cpu_locked_tensor."""
        if is_torch(example_tensor):
            import torch  # noqa: PLC0415 - only when a tensor is passed
            itemsize = torch.empty((), dtype=example_tensor.dtype).element_size()
        else:
            import numpy as np  # noqa: PLC0415
            itemsize = np.dtype(example_tensor.dtype).itemsize
        count = integer(num_elem, "num_elem", 0, INT64[1] // itemsize)
        nbytes = count * itemsize
        ptr = ctypes.c_void_p()
        locked = ctypes.c_int()
        check(lib.zs_alloc_pinned(ctypes.byref(ptr), max(nbytes, 1), PinFlags.FALLBACK,
                                  ctypes.byref(locked)), "zs_alloc_pinned")
        raw = (ctypes.c_ubyte * max(nbytes, 1)).from_address(ptr.value)
        if is_torch(example_tensor):
            t = torch.frombuffer(raw, dtype=example_tensor.dtype, count=count)
            key = t.data_ptr()
        else:
            import numpy as np  # noqa: PLC0415
            t = np.frombuffer(raw, dtype=example_tensor.dtype, count=count)
            key = t.ctypes.data
        self._locked[key] = (ptr.value, max(nbytes, 1), raw)
        return t

    def free_cpu_locked_tensor(self, tensor: Any) -> bool:
        """Frees a buffer from new_cpu_locked_tensor; False if it is not one.
        The tensor must not be used afterwards."""
        key = tensor.data_ptr() if is_torch(tensor) else tensor.ctypes.data
        entry = self._locked.pop(key, None)
        if entry is None:
            return False
        lib.zs_free_pinned(ctypes.c_void_p(entry[0]), entry[1])
        return True


def _fd_path(fd: int) -> str:
    """A path naming an open descriptor, for DeepSpeed's async_pwrite(fd)."""
    if sys.platform == "win32":  # the file's own name (Wine also has a /proc/self/fd naming another)
        return _windows_handle_path(fd)
    for cand in (f"/proc/self/fd/{fd}", f"/dev/fd/{fd}"):
        if os.path.exists(cand):
            return cand
    raise ZSpeedError(f"cannot use file descriptor {fd} on this platform; pass "
                      f"the file name instead")


def _windows_handle_path(fd: int) -> str:
    import msvcrt
    from ctypes import wintypes
    handle = msvcrt.get_osfhandle(fd)
    get = ctypes.windll.kernel32.GetFinalPathNameByHandleW
    get.argtypes = [wintypes.HANDLE, wintypes.LPWSTR, wintypes.DWORD, wintypes.DWORD]
    get.restype = wintypes.DWORD
    buf = ctypes.create_unicode_buffer(32768)
    n = get(handle, buf, len(buf), 0)
    if n == 0 or n >= len(buf):
        raise ZSpeedError(f"cannot find the file name of descriptor {fd}; pass the file name instead")
    path = buf.value
    return path[4:] if path.startswith("\\\\?\\") else path


def _validate(buffer: Any, filename: Any, file_offset: int) -> None:
    """DeepSpeed's validate=True: the file range must equal the buffer."""
    b = buf(buffer, "buffer", allowed=None, stage=True)
    data = ctypes.string_at(b.ptr, b.nbytes)
    with open(filename, "rb") as f:
        f.seek(file_offset)
        disk = f.read(b.nbytes)
    if disk != data:
        raise ZSpeedError(f"validation failed: {filename} at offset {file_offset} "
                          f"differs from the buffer ({b.nbytes} bytes)")


# DeepSpeed's name (AsyncIOBuilder().load().aio_handle): a drop-in alias.
aio_handle = AsyncIOHandle


def __getattr__(name):
    if name == "AsyncIOBuilder":  # DeepSpeed's deepspeed.ops.aio.AsyncIOBuilder
        from .op_builder import AsyncIOBuilder
        return AsyncIOBuilder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
