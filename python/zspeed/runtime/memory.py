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

On a GPU, what the engine itself keeps there (:func:`gpu_estimate`) is compared with the
memory this process may still use (free memory, within a per-process fraction set with
torch.cuda.set_per_process_memory_fraction):

  weights      stages 0-2: the whole model in the training dtype; stage 3: the shards
               (offload_param none), plus the working set: the parameters of the
               modules on the deepest path of the module tree (a module's parameters
               stay gathered while its children run), the prefetch window
               (stage3_prefetch_bucket_size) and the persistent small parameters
  gradients    the whole model's (stages 0-1; stage 2 and 3 without offload: the
               rank's reduced part in fp32), none kept with offload_optimizer
  optimizer    offload_optimizer none: fp32 masters and the state, per element of the
               rank's part (stages 1-3) or of the model (stage 0)

Activations depend on the batch and the model's code and are not estimated: a
configuration is refused only when the engine's own tensors cannot fit, and the message
says the activations come on top.
"""
from __future__ import annotations

import os
import sys

import torch

from .config import ConfigError

__all__ = ["available_host_bytes", "check_host_memory", "check_nvme_space", "gpu_estimate", "check_gpu_memory"]

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


def _deepest_path_elems(module: torch.nn.Module, numel) -> int:
    """The largest sum, over a root-to-leaf path of the module tree, of the modules' own
    parameter elements (``numel(p)`` counts a partitioned parameter whole)."""
    own = sum(numel(p) for p in module.parameters(recurse=False))
    kids = [_deepest_path_elems(c, numel) for c in module.children()]
    return own + (max(kids) if kids else 0)


def gpu_estimate(config, model: torch.nn.Module, total_elems: int, local_elems: int, dtype: torch.dtype,
                 world_size: int = 1, numel=None) -> dict:
    """Bytes the engine keeps on the GPU for this rank, per kind (see the module docstring).
    ``total_elems``: the trained parameters' elements; ``local_elems``: this rank's part of them."""
    numel = numel or (lambda p: p.numel())
    esize = torch.empty((), dtype=dtype).element_size()
    stage, off, pdev = config.zero_stage, config.offload_device, config.offload_param["device"]
    out = {}
    if stage == 3:
        if pdev == "none":
            out["parameter shards"] = esize * local_elems
        z = config.zero
        persist = int(z["stage3_param_persistence_threshold"])
        small = sum(numel(p) for p in model.parameters() if numel(p) <= persist)
        window = min(int(z["stage3_prefetch_bucket_size"]), int(z["stage3_max_live_parameters"]))
        out["gathered parameters (deepest module path + prefetch + persistent)"] = esize * (
            _deepest_path_elems(model, numel) + window + small)
    else:
        out["weights"] = esize * sum(numel(p) for p in dict.fromkeys(model.parameters()))
    if off == "none":
        sharded = stage == 3 or (world_size > 1 and stage >= 1)
        part = local_elems if sharded else total_elems
        if sharded and stage >= 2:
            out["gradients (this rank's part, fp32)"] = 4 * local_elems
        else:
            out["gradients"] = esize * total_elems
        sd, per = _state_bytes(config)
        masters = 4 if esize < 4 or sharded else 0  # an fp32 model on one rank is its own master
        out[f"{'fp32 masters and ' if masters else ''}optimizer state ({sd})"] = int((masters + per) * part)
    return out


def gpu_room(device: torch.device) -> int | None:
    """Bytes this process may still allocate on ``device``: free memory plus what torch's
    allocator holds, within the per-process fraction; None when unknown (not a CUDA device)."""
    if device.type != "cuda":
        return None
    try:
        free, total = torch.cuda.mem_get_info(device)
        held = torch.cuda.memory_reserved(device)
    except (RuntimeError, AssertionError, AttributeError):
        return None
    room = free + held
    frac = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if frac is not None:
        try:
            room = min(room, int(frac(device) * total))
        except (RuntimeError, TypeError):
            pass
    return room


def check_gpu_memory(need: dict, room: int | None, device, config) -> None:
    """ConfigError when the engine's own GPU tensors (``need``, from gpu_estimate) exceed
    ``room`` bytes, with the numbers and what to change."""
    if room is None or not need or os.environ.get("ZSPEED_SKIP_MEMORY_CHECK") == "1":
        return
    total = sum(need.values())
    if total <= room:
        return
    parts = ", ".join(f"{k} {v / GiB:.2f}" for k, v in need.items())
    fixes = []
    if config.offload_device == "none":
        fixes.append("zero_optimization.offload_optimizer.device \"cpu\" (masters and optimizer state in host memory)")
    if config.zero_stage < 3:
        fixes.append("zero_optimization.stage 3 with offload_param.device \"cpu\" (only the running modules' "
                     "parameters on the GPU)")
    elif config.offload_param["device"] == "none":
        fixes.append("offload_param.device \"cpu\" (the parameter shards in host memory)")
    else:
        fixes.append("smaller stage3_prefetch_bucket_size / stage3_param_persistence_threshold")
    fixes.append("more GPUs (each rank holds 1/world_size of the sharded parts)")
    raise ConfigError(
        f"this configuration keeps {total / GiB:.2f} GiB on {device} before any activation ({parts} GiB), but "
        f"this process may use {room / GiB:.2f} GiB there. Nothing was allocated. To fit: " + "; or ".join(fixes)
        + ". (ZSPEED_SKIP_MEMORY_CHECK=1 skips this check.)")
