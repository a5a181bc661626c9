"""ZeRO-3 parameter shards on NVMe (``offload_param.device "nvme"``, ZeRO-Infinity).

:class:`NVMeParamStore` is a parameter store (store.py) whose shards live in one file under
``offload_param.nvme_path`` instead of host memory. Each unit's shard
(one parameter's share on this rank, in the model's dtype) starts at a 4 KiB-aligned
offset of the file, so that reads are direct I/O through zspeed's aio engine
(include/zspeed/aio.h: io_uring, the portable thread pool, or IOCP on Windows).

What goes there. Parameters that nothing trains -- a frozen base model under LoRA, and
every weight under ``zspeed.init_inference`` -- are only ever read, so their shards go to
NVMe and host memory keeps none of them. Trained parameters keep their shards in host
memory even with ``nvme``: the optimizer writes every step's new 16-bit weights into a
host buffer of that size (offload_optimizer cpu: the shards themselves; nvme: the
swapper's output buffer), so a second copy on disk would cost a write per step and save
no memory. The engine logs this once.

How a read reaches the GPU. ``buffer_count`` page-locked host buffers, each as large as
the largest shard on NVMe (at most ``buffer_size`` elements; a larger shard is a config
error naming the size to set), form a pool. ParamFetcher starts a read into a free buffer
when it prefetches a parameter (the order the first forward recorded), lands it --
host-to-device copy on its side stream, or an all-gather with several ranks -- as soon as
the read is complete or the parameter is needed, and the buffer returns to the pool when
the copy's CUDA event has passed. ``max_in_cpu``: the first shards (in parameter order)
of up to that many elements stay in page-locked host memory instead, and are copied from
there as with offload_param cpu.

Failures. A failed read raises zspeed.NativeError naming the file and offset; the file is
unchanged, the buffer returns to the pool and the parameter stays released, so the same
call can simply be made again. Writes (``set_full``: checkpoint loads and
GatheredParameters with modifier_rank) go to a free region of the file and the shard's
offset moves there only once the write succeeded, so a failed write leaves the previous
value readable. The file is named like the optimizer's swap files
(``zspeed_swap_<random>_param.swap``), held (locked) while the store lives, deleted by
:meth:`NVMeParamStore.close` or when the store is garbage-collected, and removed at the
next start if a crash left it behind (nvme.reclaim_stale_swap_files).
"""
from __future__ import annotations

import ctypes
import logging
import os
import secrets
import shutil
import weakref

import torch

from .._native import NativeError, check, lib
from .config import ConfigError
from .collectives import Collectives
from .hostmem import ALIGN, aligned_host, unpin
from .nvme import SWAP_PREFIX, reclaim_stale_swap_files
from .store import ParamStore, empty_param, full_shape, shard_source

log = logging.getLogger("zspeed.zero3")

GiB = 2 ** 30

__all__ = ["NVMeParamStore"]


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


_CLAIM_TRIES = 8


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _claim(folder: str) -> tuple[str, int]:
    """(path, descriptor) of a new swap file this process holds: created exclusively and held
    at once (POSIX: an exclusive flock, taken before the aio engine opens the file; Windows:
    the descriptor itself refuses deletion). Another rank's start-up sweep
    (reclaim_stale_swap_files) may still lock and delete the file in the instant between its
    creation and the flock; the name is then checked to still be the locked file, and a new
    name is tried (each retry needs another such race)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(_CLAIM_TRIES):
        path = os.path.join(folder, f"{SWAP_PREFIX}{secrets.token_hex(8)}_param.swap")
        fd = os.open(path, flags, 0o600)
        if os.name == "nt":
            return path, fd
        import fcntl
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held, named = os.fstat(fd), os.stat(path, follow_symlinks=False)
            if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                return path, fd
        except OSError:  # EWOULDBLOCK: a sweep holds it (and deletes it); ENOENT: it is gone already
            pass
        os.close(fd)
    raise NativeError(-1, "ZS_EBUSY", "swap file claim raced", f"could not create a parameter swap file in "
                      f"'{folder}': each new file was removed at once {_CLAIM_TRIES} times (another process "
                      f"sweeping the folder?); give this job its own nvme_path.")


class _Disk:
    """The store's file: opened once for the aio engine, held against reclaim_stale_swap_files
    (an exclusive flock on POSIX; an open handle refuses deletion on Windows)."""

    def __init__(self, folder: str, aio: dict):
        from ..ops.aio import AsyncIOHandle
        self.path, self.lock_fd = _claim(folder)
        try:
            self.aio = AsyncIOHandle(block_size=int(aio.get("block_size", 1 << 20)),
                                     queue_depth=int(aio.get("queue_depth", 8)),
                                     intra_op_parallelism=int(aio.get("intra_op_parallelism", 1)))
            f = ctypes.c_void_p()
            check(lib.zs_aio_file_open(ctypes.byref(f), os.fsencode(self.path), 2), "zs_aio_file_open")  # RDWR
        except BaseException:
            os.close(self.lock_fd)
            _remove(self.path)
            raise
        self.f = f
        self.size = 0

    def reserve(self, size: int) -> None:
        if size > self.size:
            check(lib.zs_aio_file_preallocate(self.f, size), "zs_aio_file_preallocate")
            self.size = size

    def submit(self, buf: torch.Tensor, nbytes: int, off: int, write: bool) -> int:
        fn = lib.zs_aio_pwrite if write else lib.zs_aio_pread
        return check(fn(self.aio.native(), self.f, ctypes.c_void_p(buf.data_ptr()), nbytes, off),
                     "zs_aio_pwrite" if write else "zs_aio_pread")

    def test(self, rid: int) -> bool:
        return lib.zs_aio_test(self.aio.native(), rid) == 1

    def wait(self, rid: int, what: str) -> None:
        rc = lib.zs_aio_wait(self.aio.native(), rid)
        if rc < 0:
            try:
                check(rc, "zs_aio_wait")
            except NativeError as e:
                raise NativeError(e.code, e.name, e.strerror, f"{what}: {e.detail or e.strerror}",
                                  e.func) from None

    def close(self) -> None:
        if self.f is None:
            return
        try:
            lib.zs_aio_wait_all(self.aio.native())
        finally:
            lib.zs_aio_file_close(self.f)
            self.f = None
            self.aio.close()
            os.close(self.lock_fd)
            try:
                os.remove(self.path)
            except OSError as e:
                log.warning("zspeed: could not remove the parameter swap file %s: %s", self.path, e)


class NVMeParamStore(ParamStore):
    """This rank's shards of ``layout``'s parameters in a file under ``nvme_path`` (see the module
    docstring); the parameters themselves are emptied. Read by ParamFetcher through the pool."""

    nvme = True

    def __init__(self, layout, plan, device: torch.device, dtype: torch.dtype, comm: Collectives, *, nvme_path: str,
                 buffer_count: int, buffer_size: int, max_in_cpu: int, pin: bool, aio: dict | None = None):
        super().__init__(layout, plan, device, dtype, comm, param_device=torch.device("cpu"))
        self.esize = torch.empty((), dtype=dtype).element_size()
        # Where each unit's shard is: a host tensor (max_in_cpu) or [file offset, bytes].
        self.where: list[list] = []
        budget, end, biggest, biggest_shape = int(max_in_cpu), 0, 0, None
        for gi, gp in enumerate(plan.groups):
            row = []
            for ui, u in enumerate(gp.units):
                if u.shard <= budget:
                    budget -= u.shard
                    row.append(None)  # resident: allocated below
                else:
                    nb = _round(u.shard * self.esize)
                    row.append([end, nb])
                    end += nb
                    if u.shard > biggest:
                        biggest, biggest_shape = u.shard, tuple(_shape_of(layout, gp, gi, ui))
            self.where.append(row)
        if biggest > int(buffer_size):
            raise ConfigError(f"zero_optimization.offload_param.buffer_size = {int(buffer_size):,} elements is "
                              f"smaller than the largest parameter shard that goes to NVMe ({biggest:,} elements, "
                              f"a parameter of shape {biggest_shape}); set buffer_size to at least {biggest:,}.")
        spare = _round(biggest * self.esize)  # one free region for copy-on-write updates
        _check_space(nvme_path, end + spare)
        reclaim_stale_swap_files(nvme_path)
        self.disk = _Disk(nvme_path, aio or {})
        weakref.finalize(self, self.disk.close)
        self.free_regions: dict[int, list] = {spare: [end]} if spare else {}
        self.disk.reserve(end + spare)
        self.on_disk_elems = sum(gp.units[ui].shard for gi, gp in enumerate(plan.groups)
                                 for ui, w in enumerate(self.where[gi]) if w is not None)
        # The pool: buffers as large as the largest shard on NVMe, page-locked on CUDA.
        nbuf = max(1, int(buffer_count)) if biggest else 0
        self.bufs = [aligned_host(spare, pin, self._pinned_ptrs) for _ in range(nbuf)]
        self.free = list(range(nbuf))
        self.held: dict[int, object] = {}  # buffer -> CUDA event after which it is free again
        self._write_shards(pin)
        log.info("zspeed zero3: %.2f GiB of parameter shards on NVMe in %s, %.2f GiB in host memory (max_in_cpu), "
                 "%d buffers of %.1f MiB", self.on_disk_elems * self.esize / GiB, self.disk.path,
                 self.resident_elems * self.esize / GiB, nbuf, spare / 2 ** 20)

    # -- construction ---------------------------------------------------------------------------
    def _write_shards(self, pin: bool) -> None:
        """Copies every shard from the parameters (or zero.Init's ds_tensor) to its place, and
        empties the parameters."""
        plan, layout = self.plan, self.layout
        stage = self.bufs[0] if self.bufs else None
        self.resident_elems = 0
        with torch.no_grad():
            for gi, gp in enumerate(plan.groups):
                by_unit: dict[int, list] = {}
                for pc in plan.pieces(gi):
                    by_unit.setdefault(pc.unit, []).append(pc)
                for ui, u in enumerate(gp.units):
                    w = self.where[gi][ui]
                    if w is None:
                        t = aligned_host(u.shard * self.esize, pin, self._pinned_ptrs).view(self.dtype)
                        self.where[gi][ui] = t
                        self.resident_elems += u.shard
                    else:
                        t = stage[:u.shard * self.esize].view(self.dtype)
                    t.zero_()
                    base = gp.local_start[ui]
                    for pc in by_unit.get(ui, ()):
                        t[pc.at - base:pc.at - base + pc.length].copy_(
                            shard_source(layout.params[gi][pc.param], pc, plan, gp))
                    if w is not None:
                        rid = self.disk.submit(stage, w[1], w[0], True)
                        self.disk.wait(rid, "writing a parameter shard")
                for p in layout.params[gi]:
                    empty_param(p, self.dtype, self.device)

    # -- what the fetcher uses ------------------------------------------------------------------
    def on_disk(self, gi: int, ui: int) -> bool:
        return not torch.is_tensor(self.where[gi][ui])

    def acquire(self) -> int | None:
        """A free pool buffer, or None."""
        if not self.free:
            for b, ev in list(self.held.items()):
                if ev is None or ev.query():
                    del self.held[b]
                    self.free.append(b)
        return self.free.pop() if self.free else None

    def wait_held(self) -> bool:
        """Waits until the oldest buffer still read by a copy is free; False when none is."""
        if not self.held:
            return False
        b, ev = next(iter(self.held.items()))
        if ev is not None:
            ev.synchronize()
        del self.held[b]
        self.free.append(b)
        return True

    def start(self, b: int, gi: int, ui: int) -> int:
        off, nb = self.where[gi][ui]
        try:
            return self.disk.submit(self.bufs[b], nb, off, False)
        except BaseException:
            self.free.append(b)
            raise

    def done(self, rid: int) -> bool:
        return self.disk.test(rid)

    def finish(self, b: int, rid: int, gi: int, ui: int) -> torch.Tensor:
        """Waits for the read ``rid`` into buffer ``b``: the shard (a view of the buffer). On an
        error the buffer goes back to the pool and the error is raised."""
        try:
            self.disk.wait(rid, f"reading the shard of a parameter of shape {tuple(_shape_of(self.layout, self.plan.groups[gi], gi, ui))}")
        except BaseException:
            self.free.append(b)
            raise
        return self.bufs[b][:self.plan.groups[gi].units[ui].shard * self.esize].view(self.dtype)

    def hold(self, b: int, event) -> None:
        """Buffer ``b`` is free once ``event`` (None: now) has passed."""
        if event is None:
            self.free.append(b)
        else:
            self.held[b] = event

    # -- the store's interface ----------------------------------------------------------------------
    def shard(self, gi: int, ui: int) -> torch.Tensor:
        """This rank's shard of unit ui (a fresh host tensor when it is on NVMe)."""
        w = self.where[gi][ui]
        if torch.is_tensor(w):
            return w
        return self._read_raw(w)[:self.plan.groups[gi].units[ui].shard * self.esize].view(self.dtype)

    def _read_raw(self, w: list) -> torch.Tensor:
        """The region ``w`` ([offset, bytes]) of the file in a fresh aligned host buffer."""
        t = aligned_host(w[1], False, [])
        self.disk.wait(self.disk.submit(t, w[1], w[0], False), "reading a parameter shard")
        return t

    def set_full(self, gi: int, pi: int, value: torch.Tensor) -> None:
        """Writes this rank's shard of parameter pi from its whole value: into a free region of the
        file, which becomes the shard's place only once the write succeeded."""
        gp = self.plan.groups[gi]
        ui = gp.unit_of[pi]
        w = self.where[gi][ui]
        if torch.is_tensor(w):
            super().set_full(gi, pi, value)
            return
        if self.fetcher is not None:
            self.fetcher.settle(self)
        u = gp.units[ui]
        off, n = gp.offsets[pi] - u.start, gp.numels[pi]
        flat = value.detach().reshape(-1)
        buf = self._read_raw(w)
        t = buf[:u.shard * self.esize].view(self.dtype)
        lo, hi = max(off, self.rank * u.shard), min(off + n, (self.rank + 1) * u.shard)
        if hi > lo:
            at = lo - self.rank * u.shard
            t[at:at + hi - lo].copy_(flat[lo - off:hi - off].to("cpu", self.dtype))
        nb = w[1]
        regions = self.free_regions.setdefault(nb, [])
        if regions:
            new = regions.pop()
        else:
            new = self.disk.size
            self.disk.reserve(new + nb)
        try:
            self.disk.wait(self.disk.submit(buf, nb, new, True), "writing a parameter shard")
        except BaseException:
            regions.append(new)  # the shard keeps its previous place and value
            raise
        self.free_regions.setdefault(nb, []).append(w[0])
        w[0] = new
        if self.fetcher is not None:
            self.fetcher.mark_stale(self)

    def publish(self, src: list | None = None) -> None:
        raise RuntimeError("zspeed: parameters on NVMe are not trained (their shards are never written "
                           "by an optimizer step)")

    publish_unit = publish
    publish_shard = publish

    def close(self) -> None:
        """Deletes the file and frees the pool (idempotent); the parameters cannot be used after."""
        if self.fetcher is not None:
            self.fetcher.settle(self)
        self.disk.close()
        unpin(self._pinned_ptrs)
        self._pinned_ptrs.clear()


def _shape_of(layout, gp, gi: int, ui: int):
    pi = next(pi for pi, u in enumerate(gp.unit_of) if u == ui)
    return full_shape(layout.params[gi][pi])


def _check_space(path: str, need: int) -> None:
    if os.environ.get("ZSPEED_SKIP_MEMORY_CHECK") == "1":
        return
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return
    if need > free:
        from .memory import size_text
        raise ConfigError(f"offload_param nvme needs {size_text(need)} of free space in nvme_path '{path}' for "
                          f"the parameter shards, but it has {size_text(free)} free. Nothing was written. To fit: "
                          f"raise offload_param.max_in_cpu (keep more shards in host memory), use a larger disk, "
                          f"or more hosts. (ZSPEED_SKIP_MEMORY_CHECK=1 skips this check.)")
