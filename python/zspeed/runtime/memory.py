"""What a run will hold on each memory tier (the GPU, host memory, the NVMe swap files),
checked before anything is allocated.

An offloaded run that does not fit would otherwise end minutes into its start-up, killed
by the kernel's OOM killer (or a CUDA out-of-memory error) with no useful message. Each
component of the engine reports what it will hold, per tier, from the run plan and the
sizes of the model (``bytes_needed(plan, config, sizes)`` on the placement and the
optimizer path classes, collected by assemble.footprint); this module holds the sizes,
the sums and the checks, and knows no component:

  host   compared with the memory the system can give (MemAvailable on Linux,
         ullAvailPhys on Windows) plus the host memory the model's own parameters hold
         now (freed as they move into shards or onto the GPU), times the ranks on this host
  nvme   each nvme_path's free space, for the swap files of the ranks on this host
  gpu    the engine's own tensors, compared with the memory this process may still use
         (free memory, within a per-process fraction set with
         torch.cuda.set_per_process_memory_fraction)

What the components count (bytes per element of the rank's part, ``local``, or of the
whole model, ``total``): the weights (stages 0-2: the whole model on the GPU; stage 3:
the shards on their medium, plus on the GPU the working set: the parameters of the
modules on the deepest path of the module tree (a module's parameters stay gathered while
its children run), the prefetch window and the persistent small parameters; parameters
nothing trains partitioned the same way, on NVMe beyond max_in_cpu with offload_param
nvme), and the optimizer path's gradients, fp32 masters and state (Adam's two moments in
optimizer.params.state_dtype: fp32 8 bytes, bf16 4, int8 about 2).

Activations depend on the batch and the model's code and are not estimated: a
configuration is refused only when the engine's own tensors cannot fit, and the message
says the activations come on top. ZSPEED_SKIP_MEMORY_CHECK=1 turns the checks off.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from .._optimizers import ALGORITHMS
from .errors import ConfigError

__all__ = ["available_host_bytes", "gpu_room", "state_bytes", "moment_bytes", "Sizes", "Need", "by_tier", "check_host_memory",
           "check_nvme_space", "check_gpu_memory", "deepest_path_elems", "TIERS"]

GiB = float(1 << 30)


def available_host_bytes() -> int | None:
    """Memory the system can give new allocations (None where unknown)."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            return None
        return None
    if sys.platform == "win32":
        import ctypes

        class MemoryStatus(ctypes.Structure):
            _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                        ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                        ("ullTotalPageFile", ctypes.c_ulonglong), ("ullAvailPageFile", ctypes.c_ulonglong),
                        ("ullTotalVirtual", ctypes.c_ulonglong), ("ullAvailVirtual", ctypes.c_ulonglong),
                        ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]
        st = MemoryStatus()
        st.dwLength = ctypes.sizeof(MemoryStatus)
        if ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(st)):
            return int(st.ullAvailPhys)
    return None


_STATE_BYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0 + 4.0 / 256}  # per moment and element (int8: + scales)
TIERS = ("gpu", "host", "nvme")


def state_bytes(config) -> tuple[str, float]:
    """(state dtype, bytes of optimizer state per element) of the config's optimizer."""
    moments = len(ALGORITHMS[config.optimizer_name or "AdamW"].states)
    sd = str((config.optimizer_params or {}).get("state_dtype", "fp32")).lower()
    return sd, moments * moment_bytes(sd)


def moment_bytes(state_dtype: str) -> float:
    """Bytes per element of one optimizer moment kept in ``state_dtype`` (int8: with its scales)."""
    return _STATE_BYTES.get(str(state_dtype).lower(), 4.0)


@dataclass(frozen=True)
class Sizes:
    """The element counts the components' footprints are made of."""
    esize: int          # bytes per element of the training dtype
    total: int          # elements of the trained parameters
    local: int          # ... this rank's part of them (``total`` when nothing is sharded)
    model: int = 0      # elements of every parameter of the model (trained or not)
    frozen: int = 0     # this rank's part of the floating-point parameters nothing trains (stage 3)
    working: int = 0    # elements gathered on the GPU at once at stage 3 (deepest path + prefetch + persistent)
    cpu_share: float = 1.0  # the CPU's share of the optimizer's elements (offload_optimizer.ratio)
    host_elems: int = 0     # of an NVMe share, the elements kept in host memory (offload_optimizer.max_in_cpu)


@dataclass(frozen=True)
class Need:
    """Bytes one component holds on one tier (``where``: the folder, for the NVMe tier)."""
    tier: str
    what: str
    bytes: int
    where: str = ""


def by_tier(needs: list) -> dict:
    """{tier: {what: bytes}} of ``needs`` (tiers with nothing left out)."""
    out: dict = {}
    for n in needs:
        out.setdefault(n.tier, {})
        out[n.tier][n.what] = out[n.tier].get(n.what, 0) + int(n.bytes)
    return out


def of_tier(needs: list, tier: str) -> list:
    """The needs of one tier."""
    return [n for n in needs if n.tier == tier]


def _skipped() -> bool:
    return os.environ.get("ZSPEED_SKIP_MEMORY_CHECK") == "1"


_SKIP = " (ZSPEED_SKIP_MEMORY_CHECK=1 skips this check.)"


def check_nvme_space(needs: list, ranks_here: int, fixes: list) -> None:
    """ConfigError when an nvme_path has too little free space for the swap files of the
    ``ranks_here`` ranks on this host."""
    if _skipped():
        return
    import shutil
    ranks = max(1, ranks_here)
    folders: dict = {}
    for n in of_tier(needs, "nvme"):
        folders.setdefault(n.where, []).append(n)
    for path, items in folders.items():
        try:
            free = shutil.disk_usage(path).free
        except OSError:
            continue  # the path's own validation reports a missing folder
        need = sum(n.bytes for n in items) * ranks
        if need <= free:
            continue
        raise ConfigError(
            f"nvme offload needs {size_text(need)} of free space in nvme_path '{path}' for the swap files ("
            + "; ".join(f"{ranks} rank(s) x {n.what} {size_text(n.bytes)}" for n in items)
            + f"), but it has {size_text(free)} free. Nothing was written. To fit: "
            + "; or ".join(fixes + ["a larger disk, or more hosts"]) + "." + _SKIP)


def size_text(n: int) -> str:
    """A byte count for a message, in the unit that shows it (a small need was "0.0 GiB")."""
    for unit, size in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{int(n)} bytes"


def check_host_memory(need: dict, freeable: int, ranks_here: int, fixes: list) -> None:
    """ConfigError when this host cannot hold what ``ranks_here`` ranks allocate in host memory
    (``need``: {what: bytes} per rank); ``freeable``: host bytes the model holds now that the
    engine frees."""
    if _skipped() or not need:
        return
    avail = available_host_bytes()
    if avail is None:
        return
    ranks = max(1, ranks_here)
    per_rank = sum(need.values())
    total = per_rank * ranks
    if total <= avail + freeable * ranks:
        return
    parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in need.items())
    held = f" (+ {freeable * ranks / GiB:.1f} GiB the model holds now)" if freeable else ""
    raise ConfigError(
        f"this configuration needs {total / GiB:.1f} GiB of host memory on this host ({ranks_here} rank(s) x "
        f"{per_rank / GiB:.1f} GiB: {parts} GiB), but the system has {avail / GiB:.1f} GiB available{held}. "
        f"Nothing was allocated. To fit: " + "; or ".join(fixes) + "." + _SKIP)


def deepest_path_elems(module: torch.nn.Module, numel) -> int:
    """The largest sum, over a root-to-leaf path of the module tree, of the modules' own
    parameter elements (``numel(p)`` counts a partitioned parameter whole); a ZeRO-3 leaf module
    (set_z3_leaf_modules) holds its whole subtree at once."""
    if getattr(module, "_z3_leaf", False):
        return sum(numel(p) for p in dict.fromkeys(module.parameters()))
    own = sum(numel(p) for p in module.parameters(recurse=False))
    kids = [deepest_path_elems(c, numel) for c in module.children()]
    return max(kids, default=0) + own


def gpu_room(device: torch.device) -> int | None:
    """Bytes this process may still allocate on ``device``: free memory plus what torch's
    allocator holds, within the per-process fraction; None when unknown (not a CUDA device)."""
    try:  # a CPU device (or no CUDA at all) has no room to report
        free, total = torch.cuda.mem_get_info(device)
        held = torch.cuda.memory_reserved(device)
    except (RuntimeError, AssertionError, AttributeError, ValueError):
        return None
    room = free + held
    frac = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if frac is not None:
        try:
            room = min(room, int(frac(device) * total))
        except (RuntimeError, TypeError):
            pass
    return room


def check_gpu_memory(need: dict, room: int | None, device, fixes: list) -> None:
    """ConfigError when the engine's own GPU tensors (``need``: {what: bytes}) exceed ``room``
    bytes, with the numbers and what to change."""
    if room is None or not need or _skipped():
        return
    total = sum(need.values())
    if total <= room:
        return
    parts = ", ".join(f"{k} {v / GiB:.2f}" for k, v in need.items())
    raise ConfigError(
        f"this configuration keeps {total / GiB:.2f} GiB on {device} before any activation ({parts} GiB), but "
        f"this process may use {room / GiB:.2f} GiB there. Nothing was allocated. To fit: " + "; or ".join(fixes)
        + "." + _SKIP)
