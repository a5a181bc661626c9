"""Host memory a configuration needs, checked before anything is allocated.

An offloaded run that does not fit in host memory would otherwise end minutes into its
start-up, killed by the kernel's OOM killer with no message. The engine estimates what
this rank will allocate in host memory (bytes per element of its local space):

  parameters   ZeRO-3 with offload_param cpu: the shards, in the training dtype
  gradients    offload_optimizer cpu or nvme: the reduced gradients, training dtype
  masters      offload_optimizer cpu: fp32 master weights (nvme: on disk)
  state        offload_optimizer cpu: the optimizer's state (Adam's two moments in
               optimizer.params.state_dtype: fp32 8 bytes, bf16 4, int8 about 2)

times the ranks on this host, and compares it with the memory the system can give
(MemAvailable on Linux, ullAvailPhys on Windows) plus the host memory the model's
own parameters hold now (freed as they move into shards or onto the GPU). Only a
configuration that cannot fit is refused, with the numbers and what to change;
ZSPEED_SKIP_MEMORY_CHECK=1 turns the check off.

With offload_optimizer nvme the swap files hold the fp32 masters and the optimizer state
(4 + 8, 4 + 4 or about 4 + 2 bytes per element): the free space of nvme_path is checked
the same way before the files are created.
"""
from __future__ import annotations

import os
import sys

import torch

from .config import ConfigError

__all__ = ["available_host_bytes", "check_host_memory", "check_nvme_space"]

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
_MOMENTS = {"adam": 2, "adamw": 2, "lamb": 2, "lion": 1, "adagrad": 1, "sgd": 1}


def estimate(config, local_elems: int, dtype: torch.dtype, frozen_elems: int = 0) -> dict:
    """Host bytes this rank allocates, per kind (see the module docstring); ``frozen_elems``:
    this rank's share of the parameters nothing trains (partitioned too at stage 3)."""
    esize = torch.empty((), dtype=dtype).element_size()
    out = {}
    pdev = config.offload_param["device"]
    if config.zero_stage == 3 and pdev in ("cpu", "nvme"):
        out["parameters"] = esize * local_elems  # with nvme too (zero3_nvme.py: only frozen ones go to disk)
        if frozen_elems and pdev == "cpu":
            out["frozen parameters"] = esize * frozen_elems
        elif frozen_elems:  # nvme: the part max_in_cpu keeps, and the read buffers
            kept = min(frozen_elems, int(config.offload_param["max_in_cpu"]))
            pool = int(config.offload_param["buffer_count"]) * min(int(config.offload_param["buffer_size"]),
                                                                  frozen_elems)
            out["frozen parameters (max_in_cpu, NVMe read buffers)"] = esize * (kept + pool)
    dev = config.offload_device
    if dev in ("cpu", "nvme"):
        out["gradients"] = esize * local_elems
    if dev == "cpu":
        out["fp32 masters"] = 4 * local_elems
        sd, per = _state_bytes(config)
        out[f"optimizer state ({sd})"] = int(per * local_elems)
    return out


def _state_bytes(config) -> tuple[str, float]:
    name = (config.optimizer_name or "adamw").lower()
    moments = _MOMENTS.get(name.replace("deepspeedcpu", "").replace("cpu", ""), 2)
    sd = str((config.optimizer_params or {}).get("state_dtype", "fp32")).lower()
    return sd, moments * _STATE_BYTES.get(sd, 4.0)


def check_nvme_space(config, local_elems: int, ranks_here: int, frozen_elems: int = 0,
                     dtype: torch.dtype = torch.float16) -> None:
    """ConfigError when an nvme_path has too little free space for the swap files of the ranks on
    this host: offload_optimizer nvme (fp32 masters and optimizer state) and offload_param nvme
    (the shards of the parameters nothing trains, beyond max_in_cpu)."""
    if os.environ.get("ZSPEED_SKIP_MEMORY_CHECK") == "1":
        return
    import shutil
    needs: dict = {}  # folder -> [(bytes, what)]
    sd, per = _state_bytes(config)
    ranks = max(1, ranks_here)
    if config.offload_device == "nvme":
        needs.setdefault(config.offload["nvme_path"], []).append(
            (int((4 + per) * local_elems) * ranks, f"offload_optimizer: {ranks} rank(s) x {local_elems:,} elements x "
             f"{4 + per:.1f} bytes of fp32 masters and {sd} optimizer state"))
    op = config.offload_param
    if config.zero_stage == 3 and op["device"] == "nvme" and frozen_elems > int(op["max_in_cpu"]):
        esize = torch.empty((), dtype=dtype).element_size()
        n = frozen_elems - int(op["max_in_cpu"])
        needs.setdefault(op["nvme_path"], []).append(
            (esize * n * ranks, f"offload_param: {ranks} rank(s) x {n:,} elements x {esize} bytes of frozen "
             f"parameter shards"))
    for path, items in needs.items():
        try:
            free = shutil.disk_usage(path).free
        except OSError:
            continue  # the path's own validation reports a missing folder
        need = sum(b for b, _ in items)
        if need <= free:
            continue
        fix = " optimizer.params.state_dtype \"int8\" (about 6 bytes per element instead of 12);" \
            if sd != "int8" and config.offload_device == "nvme" else ""
        raise ConfigError(
            f"nvme offload needs {need / GiB:.1f} GiB of free space in nvme_path '{path}' for the swap files ("
            + "; ".join(w for _, w in items) + f"), but it has {free / GiB:.1f} GiB free. Nothing was written. "
            f"To fit:{fix} a larger disk, or more hosts. (ZSPEED_SKIP_MEMORY_CHECK=1 skips this check.)")


def check_host_memory(config, local_elems: int, dtype: torch.dtype, freeable: int, ranks_here: int,
                      frozen_elems: int = 0) -> None:
    """ConfigError when this host cannot hold what ``ranks_here`` ranks of this configuration
    allocate; ``freeable``: host bytes the model holds now that the engine frees."""
    if os.environ.get("ZSPEED_SKIP_MEMORY_CHECK") == "1":
        return
    need = estimate(config, local_elems, dtype, frozen_elems)
    if not need:
        return
    avail = available_host_bytes()
    if avail is None:
        return
    per_rank = sum(need.values())
    total = per_rank * max(1, ranks_here)
    room = avail + freeable * max(1, ranks_here)
    if total <= room:
        return
    parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in need.items())
    fixes = []
    sd = str((config.optimizer_params or {}).get("state_dtype", "fp32")).lower()
    if config.offload_device == "cpu" and sd != "int8":
        fixes.append("optimizer.params.state_dtype \"int8\" (Adam's moments in 2 bytes instead of 8)")
    if config.offload_device == "cpu":
        fixes.append("offload_optimizer.device \"nvme\" (masters and optimizer state on disk)")
    fixes.append("more hosts (each rank holds 1/world_size of the model at ZeRO-3)" if config.zero_stage == 3
                 else "ZeRO stage 3, or more hosts")
    raise ConfigError(
        f"this configuration needs {total / GiB:.1f} GiB of host memory on this host ({ranks_here} rank(s) x "
        f"{per_rank / GiB:.1f} GiB: {parts} GiB), but the system has {avail / GiB:.1f} GiB available"
        f"{f' (+ {freeable * ranks_here / GiB:.1f} GiB the model holds now)' if freeable else ''}. Nothing was "
        f"allocated. To fit: " + "; or ".join(fixes) + ". (ZSPEED_SKIP_MEMORY_CHECK=1 skips this check.)")
