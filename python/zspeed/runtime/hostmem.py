"""Page-locked host memory, in one place (offload buffers, ZeRO-3 host shards, NVMe pools).

On CUDA, host buffers are page-locked by registering them with the driver
(cudaHostRegister through torch.cuda.cudart) rather than allocated with
pin_memory=True, whose caching allocator rounds every block up to a power of two
(a 10 GiB request would take 16 GiB). If the driver refuses (memlock limits, WSL2,
some containers) the buffer stays pageable, copies become synchronous, and a
warning says so: slower, never wrong. Each owner keeps the addresses it registered
in a list and unregisters them with :func:`unpin` (weakref.finalize).
"""
from __future__ import annotations

import sys
import warnings

import torch

__all__ = ["alloc_host", "advise_huge_pages", "pin_in_place", "pin_filled", "aligned_host", "unpin", "ALIGN"]

ALIGN = 4096  # bytes: an aligned_host buffer's address (any direct-I/O alignment divides it)

_warned_pin = False


def _clear_cuda_error() -> None:
    """A failed runtime call leaves a sticky 'last error' that torch's next kernel-launch
    check would report as its own failure; read it back once to clear it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart" in line}
        for p in paths:
            ctypes.CDLL(p).cudaGetLastError()
    except OSError:  # best effort: nothing else to do if the runtime cannot be found
        pass


def pin_in_place(t: torch.Tensor) -> bool | None:
    """Registers a CPU tensor's memory with the CUDA driver.

    True: pinned. False: the driver refused (a warning says why). None: this torch
    has no cudaHostRegister binding (the caller may use pin_memory=True instead)."""
    global _warned_pin
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return True
    try:
        register = torch.cuda.cudart().cudaHostRegister
    except (AttributeError, RuntimeError):
        return None
    rc = register(t.data_ptr(), nbytes, 0)
    code = int(getattr(rc, "value", rc))
    if code == 0:
        return True
    _clear_cuda_error()
    if not _warned_pin:
        _warned_pin = True
        warnings.warn(
            f"zspeed: could not page-lock {nbytes / 2**20:.0f} MiB of host memory (cudaHostRegister "
            f"error {code}); offload buffers stay pageable, so host<->device copies will not overlap "
            f"computation. Raise the locked-memory limit (ulimit -l / the container's memlock) to fix this.",
            RuntimeWarning, stacklevel=3)
    return False


def unpin(ptrs: list) -> None:
    if not ptrs:
        return
    try:
        cudart = torch.cuda.cudart()
        for p in ptrs:
            cudart.cudaHostUnregister(p)
    except Exception:  # interpreter shutdown: the driver releases everything anyway
        pass


HUGE_PAGES_FROM = 8 << 20  # bytes: host buffers at least this large are advised to use huge pages


def advise_huge_pages(t: torch.Tensor) -> None:
    """Asks the OS to back a fresh, large host tensor with huge pages when it is first touched
    (libzspeed's zs_advise_huge_pages; Linux: MADV_HUGEPAGE): filling tens of GiB of masters
    or shards then takes about 512 times fewer page faults, which set the pace of the engine's
    start-up. Advice only: nothing happens where the OS (or a missing libzspeed) has none."""
    nbytes = t.numel() * t.element_size()
    if nbytes < HUGE_PAGES_FROM or t.device.type != "cpu":
        return
    try:
        from .._native import lib
        lib.zs_advise_huge_pages(t.data_ptr(), nbytes)
    except (ImportError, OSError, AttributeError):
        pass


def alloc_host(numel: int, dtype, pin: bool, registered: list) -> tuple[torch.Tensor, bool]:
    """(a host tensor of numel elements, whether it is page-locked). With pin, its memory is
    registered with the CUDA driver (the address goes into ``registered``, for unpin), or, where
    this torch has no registration binding, comes from torch's pinned allocator; a refusal leaves it
    pageable with a warning. Large ones are advised to use huge pages (:func:`advise_huge_pages`)."""
    t = torch.empty(numel, dtype=dtype)
    advise_huge_pages(t)
    if not pin:
        return t, False
    ok = pin_in_place(t)
    if ok:
        registered.append(t.data_ptr())
        return t, True
    if ok is None:  # no driver registration binding: torch's pinned allocator (rounds sizes up)
        try:
            return torch.empty(numel, dtype=dtype, pin_memory=True), True
        except RuntimeError as e:
            warnings.warn(f"zspeed: pinned host allocation refused ({e}); offload buffers stay "
                          f"pageable and copies will not overlap computation.", RuntimeWarning, stacklevel=3)
    return t, False


def pin_filled(flat: torch.Tensor, registered: list) -> torch.Tensor:
    """``flat`` (already filled) page-locked in place, or, where this torch cannot register
    memory, copied into torch's pinned allocator; a refusal leaves it pageable with
    alloc_host's warning."""
    ok = pin_in_place(flat)
    if ok:
        registered.append(flat.data_ptr())
        return flat
    if ok is None:
        pinned, is_pinned = alloc_host(flat.numel(), flat.dtype, True, registered)
        if is_pinned:
            pinned.copy_(flat)
            return pinned
    return flat


def aligned_host(nbytes: int, pin: bool, registered: list) -> torch.Tensor:
    """A uint8 host tensor of ``nbytes`` at an ALIGN-aligned address (direct I/O), page-locked
    with ``pin`` where the driver allows it."""
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
    at = (-raw.data_ptr()) % ALIGN
    t = raw[at:at + nbytes]
    if pin and nbytes:
        ok = pin_in_place(t)
        if ok:
            registered.append(t.data_ptr())
        elif ok is None:  # no driver registration binding: torch's pinned allocator
            raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=True)
            at = (-raw.data_ptr()) % ALIGN
            t = raw[at:at + nbytes]
    return t
