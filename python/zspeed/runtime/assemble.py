"""Assembling the engine's parts from its run plan (plan.py): the one place where the plan's
decisions pick classes. Each part is then used through its own interface, whatever the
stage, the rank count or the tiering:

- the parameter store: the model's own parameters (replicated), one flat buffer per unit
  with this rank's shards (sharded, store.ShardedStore), or only the shards, on a medium
  (partitioned, store.PartitionedStore; NVMe for parameters nothing trains: zero3_nvme.py);
- the optimizer path over the store's local space (paths.py, cpu.py, nvme.py, split_store.py),
  with its host buffers and gradient reducer where it needs them.
"""
from __future__ import annotations

import dataclasses
import logging
import os

import torch

from .. import comm
from .collectives import Collectives
from .cpu import HostPath
from .errors import ConfigError
from .dp import NoSync, ReplicaSync, ShardedBuffers, ShardedDevicePath, ShardSync
from .layout import FlatLayout
from .memory import Need, Sizes, deepest_path_elems, state_bytes
from .nvme import NVMePath
from .split_store import StoreSplitPath
from .optimizers import client_as_config, native_client
from .partition import DEFAULT_ALIGN, PartitionPlan
from .paths import OptimizerPath, device_path, device_path_class
from .plan import RunPlan
from .store import PartitionedStore, ShardedStore, full_numel

log = logging.getLogger("zspeed.engine")

__all__ = ["client_kind", "host_threads", "optimizer_path", "param_store", "build_store", "placement", "grad_sync"]


def client_kind(client) -> str:
    """The plan's fact about an optimizer passed to initialize(): "none", "native" (one of
    zspeed's CPU optimizers, whose settings the NVMe swapper can take) or "other"."""
    if client is None:
        return "none"
    return "native" if native_client(client) else "other"


def client_algorithm(client) -> str | None:
    """The algorithm of a native client optimizer ("Adam", "AdamW", "Adagrad", "Lion"), which the
    plan checks in place of the config's; None for no client or another kind."""
    return client_as_config(client)[0] if client is not None and native_client(client) else None


def host_threads(share: float | None = None) -> int | None:
    """Threads of this rank's CPU optimizer: the cores of this host shared by the ranks on it
    (times ``share``, SuperOffload's cpuadam_cores_perc, when given), unless ZSPEED_NUM_THREADS
    decides (None: the library's default pool, all cores, for the only rank of a host)."""
    local = max(1, comm.get_local_world_size())
    if (local == 1 and share is None) or os.environ.get("ZSPEED_NUM_THREADS"):
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, int(cores // local * (1.0 if share is None else share)))


def param_store(plan: RunPlan, config, layout: FlatLayout, coll: Collectives):
    """The store of the trained parameters: None for the model's own (replicated) parameters."""
    return _STORES[plan.store](plan, config, layout, coll)


def _sharded_store(plan: RunPlan, config, layout: FlatLayout, coll: Collectives) -> ShardedStore:
    # One rank (an offloaded optimizer's store): no shard straddles ranks, so no unit is padded
    # and the local space is the model's own layout, parameter by parameter.
    part = PartitionPlan(layout.numels, plan.world_size, plan.rank, unit_elems=plan.unit_elems,
                         align=DEFAULT_ALIGN if plan.world_size > 1 else 1)
    return ShardedStore(layout, part, plan.device, plan.dtype, coll)


_STORES = {"replicated": lambda plan, config, layout, coll: None, "sharded": _sharded_store,
           "partitioned": lambda plan, config, layout, coll: build_store(
               layout, plan.world_size, plan.rank, plan.device, plan.dtype, config.offload_param, coll,
               medium=plan.param_medium)}


def build_store(layout: FlatLayout, world_size: int, rank: int, device: torch.device, dtype: torch.dtype,
                offload_param: dict, coll: Collectives, *, medium: str, aio: dict | None = None):
    """The ZeRO-3 store of ``layout`` (one unit per parameter: each is gathered and reduced on
    its own) with its shards on ``medium`` (plan.shard_medium of the offload_param section):
    "host" memory (page-locked on CUDA with pin_memory), the "device", or a file under nvme_path
    ("nvme", for parameters nothing trains: zero3_nvme.py)."""
    part = PartitionPlan(layout.numels, world_size, rank, unit_elems=1)
    pin = medium != "device" and device.type == "cuda" and bool(offload_param.get("pin_memory", False))
    note = _MEDIUM_NOTES.get((offload_param.get("device", "none"), medium))
    if note:
        log.info("zspeed zero3: %s", note)
    return _MEDIUM_STORES[medium](layout, part, device, dtype, coll, offload_param, pin, aio)


def _nvme_store(layout, part, device, dtype, coll, op: dict, pin: bool, aio):
    from .zero3_nvme import NVMeParamStore
    return NVMeParamStore(layout, part, device, dtype, coll, nvme_path=op["nvme_path"],
                          buffer_count=int(op.get("buffer_count", 5)),
                          buffer_size=int(op.get("buffer_size", 100_000_000)),
                          max_in_cpu=int(op.get("max_in_cpu", 1_000_000_000)), pin=pin, aio=aio)


# (offload_param.device, the shards' medium) -> what the log says about it
_MEDIUM_NOTES = {("nvme", "host"): "offload_param nvme keeps the trained parameters' shards in host memory (the "
                                   "optimizer writes their new weights there every step); parameters nothing trains "
                                   "go to NVMe"}
_MEDIUM_STORES = {
    "device": lambda layout, part, device, dtype, coll, op, pin, aio: PartitionedStore(
        layout, part, device, dtype, coll, param_device=device, pin=pin),
    "host": lambda layout, part, device, dtype, coll, op, pin, aio: PartitionedStore(
        layout, part, device, dtype, coll, param_device=torch.device("cpu"), pin=pin),
    "nvme": _nvme_store,
}


def optimizer_path(plan: RunPlan, config, layout: FlatLayout, client, coll: Collectives) -> OptimizerPath:
    """The optimizer path of the plan (``client``: the optimizer passed to initialize, or None),
    over the parameter store it needs."""
    name, params = config.optimizer_name, config.optimizer_params
    if client is not None and plan.optimizer in ("nvme", "split"):
        # These paths run zspeed's kernels themselves: a native client's settings (its groups' own
        # lr, betas, eps and weight decay are the groups stepped), not its object; the plan refused
        # other clients there.
        name, params = client_as_config(client)
        client = None
    elif client is not None:
        name, params = None, {}  # the client's optimizer replaces the config's (DeepSpeed's rule)
    return _PATHS[plan.optimizer](plan, config, layout, name, params, client, coll)


def _device_path(plan: RunPlan, config, layout: FlatLayout, name, params, client, coll) -> OptimizerPath:
    store = param_store(plan, config, layout, coll)
    if store is None:
        return device_path(layout, plan.device, plan.dtype, name, params, client)
    return ShardedDevicePath(store, name, params, client, stage=plan.stage, overlap=plan.reduce_overlap, comm=coll,
                             comm_dtype=plan.comm_dtype)


def _host_buffers(plan: RunPlan, config, layout: FlatLayout, coll) -> tuple:
    """(the host buffers of an offloaded path, the local layout it steps) over the plan's store
    (an offloaded optimizer always has one: plan.py's _STORE)."""
    store = param_store(plan, config, layout, coll)
    return ShardedBuffers(store, pin_memory=plan.pin_memory, stage=plan.stage, overlap=plan.reduce_overlap,
                          comm=coll, comm_dtype=plan.comm_dtype, grads_in_shards=plan.grads_in_shards), \
        store.local_layout


def _host_path(plan: RunPlan, config, layout: FlatLayout, name, params, client, coll) -> OptimizerPath:
    buffers, layout = _host_buffers(plan, config, layout, coll)
    threads = host_threads(plan.cores_share)
    if threads is not None and plan.rank == 0:
        log.info("zspeed: %d rank(s) on this host share its cores: %d CPU optimizer threads per rank "
                 "(set ZSPEED_NUM_THREADS to choose)", comm.get_local_world_size(), threads)
    return HostPath(layout, buffers, name, params, client=client,
                    force_native=config.force_ds_cpu_optimizer, chunk_elems=plan.chunk_elems,
                    num_threads=threads, timing=plan.timing)


def _nvme_path(plan: RunPlan, config, layout: FlatLayout, name, params, client, coll) -> OptimizerPath:
    buffers, layout = _host_buffers(plan, config, layout, coll)
    return NVMePath(layout, buffers, name, params, client=client, offload_cfg=config.offload,
                    aio=config.aio, sub_group_size=config.sub_group_size)


def _split_path(plan: RunPlan, config, layout: FlatLayout, name, params: dict, client, coll) -> OptimizerPath:
    """offload_optimizer.ratio < 1 (or "auto"): the optimizer split between the GPU and the CPU
    (split.py), or the ordinary CPU path when "auto" chooses to step everything there."""
    from . import split
    ratio, auto = plan.ratio, None
    force = config.force_ds_cpu_optimizer
    device = plan.device
    if ratio == "auto":
        if split.device_memory(device) is None:
            log.warning("zspeed: offload_optimizer.ratio \"auto\" -> 1.000: the CPU steps 100.0% of the parameters "
                        "(no GPU)")
            return _host_path(plan, config, layout, name, params, client, coll)
        cpu_s, gpu_s = split.measure_rates(device, name, params, force, host_threads(), model_dtype=plan.dtype)
        log.warning("zspeed: offload_optimizer.ratio \"auto\": step 1 runs with the whole optimizer on the CPU; "
                    "the GPU's share is then sized from that step's peak GPU memory")
        ratio, auto = 1.0, split.AutoSplit(device, cpu_s, gpu_s)
    return StoreSplitPath(param_store(plan, config, layout, coll), name, params, float(ratio), stage=plan.stage,
                          reduce_overlap=plan.reduce_overlap, comm=coll, comm_dtype=plan.comm_dtype,
                          pin_memory=plan.pin_memory, force_native=force, chunk_elems=plan.chunk_elems,
                          num_threads=host_threads(plan.cores_share), timing=plan.timing, auto=auto,
                          tier=plan.cpu_tier, host_elems=plan.host_elems, grads_in_shards=plan.grads_in_shards,
                          nvme=dict(offload_cfg=config.offload, aio=config.aio, sub_group_size=config.sub_group_size))


_PATHS = {"device": _device_path, "host": _host_path, "nvme": _nvme_path, "split": _split_path}


# -- where the model's tensors go ---------------------------------------------------------------
class WholeModel:
    """ZeRO stages 0-2: the module moves to the device in the training dtype, whole."""

    frozen_layout = None
    frozen_store = None

    def __init__(self, plan: RunPlan):
        self.plan = plan

    def place(self, model: torch.nn.Module, layout: FlatLayout) -> torch.nn.Module:
        """The module on the device (its parameter objects are kept: the layout stays valid)."""
        cut = [n for n, p in model.named_parameters() if hasattr(p, "ds_tensor")]
        if cut:
            raise ConfigError(
                f"the model was built inside zspeed.zero.Init on several ranks (or trained by an earlier ZeRO-3 "
                f"engine there), which cut its parameters into ZeRO-3 shards ({len(cut)} of them, e.g. "
                f"{cut[0]!r}), but the config's zero_optimization.stage is "
                f"{self.plan.stage}. Set \"stage\": 3 in the config, or build the model outside zero.Init (with "
                f"Hugging Face transformers: load it without a ZeRO-3 config active).")
        dt = self.plan.dtype
        return model.to(device=self.plan.device, dtype=dt) if dt != torch.float32 else model.to(self.plan.device)

    def host_bytes_freed(self, layout: FlatLayout) -> int:
        """Host memory the model's own tensors hold now that the engine frees (none: placed already)."""
        return 0

    def sizes(self, config, module: torch.nn.Module, layout: FlatLayout) -> Sizes:
        """The element counts of the run's footprint (memory.py), once the module is placed."""
        total = sum(layout.totals)
        return Sizes(esize=torch.empty((), dtype=self.plan.dtype).element_size(), total=total,
                     local=-(-total // self.plan.shard_degree),
                     model=sum(full_numel(p) for p in dict.fromkeys(module.parameters())),
                     cpu_share=_CPU_SHARE.get(self.plan.optimizer, lambda r: 1.0)(self.plan.ratio),
                     host_elems=self.plan.host_elems)

    def bytes_needed(self, config, s: Sizes) -> list:
        """What the model's own tensors hold (memory.py): the whole model on the device."""
        return [Need("gpu", "weights", s.esize * s.model)]

    def finish(self, config, path: OptimizerPath, module: torch.nn.Module, coll: Collectives):
        """After the optimizer path exists: the ZeRO-3 fetcher, or None."""
        return None


class PartitionedModel(WholeModel):
    """ZeRO-3: the trained parameters go straight from where they are into their shards (the
    whole model may not fit on the device), and so do the floating-point parameters nothing
    trains (partitioned the same way, into a store of their own); the rest moves now. The
    fetcher (zero3.py) gathers them around the modules that use them."""

    def place(self, model: torch.nn.Module, layout: FlatLayout) -> torch.nn.Module:
        trained = layout.index
        frozen = [p for p in dict.fromkeys(model.parameters()) if id(p) not in trained and p.is_floating_point()]
        keep = dict(trained)
        if frozen:
            self.frozen_layout = FlatLayout([{"params": frozen}])
            keep.update(self.frozen_layout.index)
        move_except(model, self.plan.device, self.plan.dtype, keep)
        return model

    def host_bytes_freed(self, layout: FlatLayout) -> int:
        rows = list(layout.params) + (list(self.frozen_layout.params) if self.frozen_layout is not None else [])
        return sum(p.numel() * p.element_size() for ps in rows for p in ps if p.device.type == "cpu")

    def sizes(self, config, module: torch.nn.Module, layout: FlatLayout) -> Sizes:
        z = config.zero
        persist = int(z["stage3_param_persistence_threshold"])
        small = sum(full_numel(p) for p in module.parameters() if full_numel(p) <= persist)
        window = min(int(z["stage3_prefetch_bucket_size"]), int(z["stage3_max_live_parameters"]))
        frozen = sum(self.frozen_layout.totals) if self.frozen_layout is not None else 0
        return dataclasses.replace(super().sizes(config, module, layout),
                                   frozen=-(-frozen // self.plan.world_size),
                                   working=deepest_path_elems(module, full_numel) + window + small)

    def bytes_needed(self, config, s: Sizes) -> list:
        """The shards on their medium, the working set gathered on the GPU, and the shards of the
        parameters nothing trains (NVMe beyond max_in_cpu with offload_param nvme)."""
        medium = self.plan.param_medium
        return [Need(_TIER[medium], _SHARDS[medium], s.esize * s.local),
                Need("gpu", "gathered parameters (deepest module path + prefetch + persistent)", s.esize * s.working),
                *_FROZEN[self.plan.frozen_medium](config.offload_param, s)]

    def finish(self, config, path: OptimizerPath, module: torch.nn.Module, coll: Collectives):
        from .zero3 import ParamFetcher
        plan = self.plan
        if self.frozen_layout is not None:
            self.frozen_store = build_store(self.frozen_layout, plan.world_size, plan.rank, plan.device, plan.dtype,
                                            config.offload_param, coll, medium=plan.frozen_medium, aio=config.aio)
        return ParamFetcher.from_zero(path.sharded, module, config.zero, comm=coll, frozen=self.frozen_store)


_TIER = {"device": "gpu", "host": "host"}
_SHARDS = {"device": "parameter shards", "host": "parameters"}


def _frozen_on_nvme(op: dict, s: Sizes) -> list:
    """offload_param nvme: max_in_cpu of the frozen shards and the read buffers in host memory, the
    rest in the swap file."""
    kept = min(s.frozen, int(op["max_in_cpu"]))
    pool = int(op["buffer_count"]) * min(int(op["buffer_size"]), s.frozen)
    n = s.frozen - kept
    return [Need("host", "frozen parameters (max_in_cpu, NVMe read buffers)", s.esize * (kept + pool)),
            Need("nvme", f"offload_param ({n:,} elements x {s.esize} bytes of frozen parameter shards)",
                 s.esize * n, where=op["nvme_path"])]


_FROZEN = {"device": lambda op, s: [Need("gpu", "frozen parameter shards", s.esize * s.frozen)],
           "host": lambda op, s: [Need("host", "frozen parameters", s.esize * s.frozen)],
           "nvme": _frozen_on_nvme}
_CPU_SHARE = {"split": lambda ratio: {"auto": 1.0}.get(ratio, ratio)}  # "auto": the most the host holds


def path_class(plan: RunPlan) -> type:
    """The optimizer path class of the plan (the split's "auto" may still fall back to HostPath)."""
    return {"device": {"replicated": device_path_class(plan.dtype)}.get(plan.store, ShardedDevicePath),
            "host": HostPath, "nvme": NVMePath,
            "split": StoreSplitPath}[plan.optimizer]


def footprint(plan: RunPlan, place: "WholeModel", config, s: Sizes) -> list:
    """Every memory.Need of the run: the placement's and the optimizer path's."""
    return [n for n in place.bytes_needed(config, s) + path_class(plan).bytes_needed(plan, config, s) if n.bytes]


_INT8 = {"int8": []}
_TIER_FIXES = {
    "host": {"host": lambda sd: _INT8.get(sd, ["optimizer.params.state_dtype \"int8\" (Adam's moments in 2 bytes "
                                              "instead of 8)"]) + [
        "offload_optimizer.device \"nvme\" (masters and optimizer state on disk)"]},
    "nvme": {"nvme": lambda sd: _INT8.get(sd, ["optimizer.params.state_dtype \"int8\" (about 6 bytes per element "
                                              "instead of 12)"])},
    "gpu": {"device": lambda sd: ["zero_optimization.offload_optimizer.device \"cpu\" (masters and optimizer "
                                  "state in host memory)"]},
}
_TIER_FIXES["host"]["split"] = _TIER_FIXES["host"]["host"]
_STAGE3 = "zero_optimization.stage 3 with offload_param.device \"cpu\" (only the running modules' parameters on the GPU)"
_STORE_FIXES = {
    "host": {"partitioned": "more hosts (each rank holds 1/world_size of the model at ZeRO-3)"},
    "gpu": {"replicated": _STAGE3, "sharded": _STAGE3},
}
_MEDIUM_FIXES = {"device": "offload_param.device \"cpu\" (the parameter shards in host memory)",
                 "host": "smaller stage3_prefetch_bucket_size / stage3_param_persistence_threshold"}


def memory_fixes(plan: RunPlan, config, tier: str) -> list:
    """What to change when ``tier`` cannot hold the run (the refusal's advice)."""
    sd, _ = state_bytes(config)
    out = _TIER_FIXES[tier].get(plan.optimizer, lambda sd: [])(sd)
    out.append({"host": _STORE_FIXES["host"].get(plan.store, "ZeRO stage 3, or more hosts"),
                "gpu": _STORE_FIXES["gpu"].get(plan.store, _MEDIUM_FIXES[plan.param_medium]),
                "nvme": None}[tier])
    out += {"gpu": ["more GPUs (each rank holds 1/world_size of the sharded parts)"]}.get(tier, [])
    return [f for f in out if f]


def placement(plan: RunPlan) -> WholeModel:
    """Where the plan puts the model's tensors (see WholeModel, PartitionedModel)."""
    return PartitionedModel(plan) if plan.store == "partitioned" else WholeModel(plan)


def move_except(model: torch.nn.Module, device: torch.device, dtype: torch.dtype, keep: dict) -> None:
    """model.to(device, dtype) for everything but the parameters in ``keep`` (ids): floating
    parameters and buffers take ``dtype``, as Module.to does."""
    from .param_status import init_gather
    with torch.no_grad():
        for m in model.modules():
            for name, p in m.named_parameters(recurse=False, remove_duplicate=False):
                if p is not None and id(p) not in keep:
                    if hasattr(p, "ds_tensor"):  # cut by zero.Init, not trained: whole again
                        init_gather(p)
                        del p.ds_tensor, p.ds_shape, p.ds_numel
                    p.data = p.data.to(device, dtype if p.is_floating_point() else p.dtype)
            for name, b in m.named_buffers(recurse=False, remove_duplicate=False):
                if b is not None:
                    setattr(m, name, b.to(device, dtype if b.is_floating_point() else b.dtype))


def grad_sync(plan: RunPlan, layout: FlatLayout, coll: Collectives):
    """What the ranks agree on before a step (dp.py): nothing with one rank, every gradient with
    whole replicas (stage 0), the statistics of each rank's part otherwise."""
    if coll.solo:
        return NoSync()
    if plan.store == "replicated":
        return ReplicaSync(layout.params, coll, plan.bucket_elems)
    return ShardSync(coll)
