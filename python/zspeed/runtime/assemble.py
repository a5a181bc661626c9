"""Assembling the engine's parts from its run plan (plan.py): the one place where the plan's
decisions pick classes. Each part is then used through its own interface, whatever the
stage, the rank count or the tiering:

- the parameter store: the model's own parameters (replicated), one flat buffer per unit
  with this rank's shards (sharded, store.ShardedStore), or only the shards, on a medium
  (partitioned, store.PartitionedStore; NVMe for parameters nothing trains: zero3_nvme.py);
- the optimizer path over the store's local space (paths.py, cpu.py, nvme.py, split.py),
  with its host buffers and gradient reducer where it needs them.
"""
from __future__ import annotations

import logging
import os

import torch

from .. import comm
from .collectives import Collectives
from .cpu import HostPath
from .errors import ConfigError
from .dp import NoSync, ReplicaSync, ShardedBuffers, ShardedDevicePath, ShardSync
from .layout import FlatLayout
from .nvme import NVMePath
from .offload import HostBuffers
from .optimizers import client_as_config, native_client
from .partition import PartitionPlan
from .paths import OptimizerPath, device_path
from .plan import RunPlan
from .store import PartitionedStore, ShardedStore

log = logging.getLogger("zspeed.engine")

__all__ = ["client_kind", "host_threads", "optimizer_path", "param_store", "build_store", "placement", "grad_sync"]


def client_kind(client) -> str:
    """The plan's fact about an optimizer passed to initialize(): "none", "native" (one of
    zspeed's CPU optimizers, whose settings the NVMe swapper can take) or "other"."""
    if client is None:
        return "none"
    return "native" if native_client(client) else "other"


def host_threads(world_size: int, share: float | None = None) -> int | None:
    """Threads of this rank's CPU optimizer: the cores shared by the ranks on this host
    (times ``share``, SuperOffload's cpuadam_cores_perc, when given), unless
    ZSPEED_NUM_THREADS decides (None: the library's default pool, all cores)."""
    if (world_size == 1 and share is None) or os.environ.get("ZSPEED_NUM_THREADS"):
        return None
    local = max(1, comm.get_local_world_size())
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, int(cores // local * (1.0 if share is None else share)))


def param_store(plan: RunPlan, config, layout: FlatLayout, coll: Collectives):
    """The store of the trained parameters: None for the model's own (replicated) parameters."""
    if plan.store == "partitioned":
        return build_store(layout, plan.world_size, plan.rank, plan.device, plan.dtype, config.offload_param, coll)
    if plan.store == "sharded":
        part = PartitionPlan(layout.numels, plan.world_size, plan.rank, unit_elems=plan.unit_elems)
        return ShardedStore(layout, part, plan.device, plan.dtype, coll)
    return None


def build_store(layout: FlatLayout, world_size: int, rank: int, device: torch.device, dtype: torch.dtype,
                offload_param: dict, coll: Collectives, *, trained: bool = True, aio: dict | None = None):
    """The ZeRO-3 store of ``layout`` (one unit per parameter: each is gathered and reduced on
    its own) with its shards where the offload_param section says: host memory (page-locked on
    CUDA with pin_memory), the device, or, for parameters nothing trains (``trained`` False), a
    file under nvme_path (zero3_nvme.py; trained parameters stay in host memory with nvme, as
    that module says)."""
    part = PartitionPlan(layout.numels, world_size, rank, unit_elems=1)
    where = offload_param.get("device", "none")
    pin = where in ("cpu", "nvme") and device.type == "cuda" and bool(offload_param.get("pin_memory", False))
    if where == "nvme" and not trained:
        from .zero3_nvme import NVMeParamStore
        return NVMeParamStore(layout, part, device, dtype, coll, nvme_path=offload_param["nvme_path"],
                              buffer_count=int(offload_param.get("buffer_count", 5)),
                              buffer_size=int(offload_param.get("buffer_size", 100_000_000)),
                              max_in_cpu=int(offload_param.get("max_in_cpu", 1_000_000_000)), pin=pin, aio=aio)
    if where == "nvme":
        log.info("zspeed zero3: offload_param nvme keeps the trained parameters' shards in host memory (the "
                 "optimizer writes their new weights there every step); parameters nothing trains go to NVMe")
    param_device = torch.device("cpu") if where in ("cpu", "nvme") else device
    return PartitionedStore(layout, part, device, dtype, coll, param_device=param_device, pin=pin)


def optimizer_path(plan: RunPlan, config, layout: FlatLayout, client, coll: Collectives) -> OptimizerPath:
    """The optimizer path of the plan (``client``: the optimizer passed to initialize, or None),
    over the parameter store it needs."""
    name, params = config.optimizer_name, config.optimizer_params
    if client is not None:
        name, params = None, {}  # the client's optimizer replaces the config's (DeepSpeed's rule)
        if plan.optimizer == "nvme":
            # The NVMe swapper runs zspeed's kernels itself: the client's settings, not its object
            # (another client was refused by the plan).
            name, params = client_as_config(client)
            client = None
    force = bool(config.top["zero_force_ds_cpu_optimizer"])
    if plan.optimizer == "split":
        split = _split_path(plan, config, layout, name, params, force)
        if split is not None:  # "auto" may choose 1: the ordinary cpu path
            return split
    store = param_store(plan, config, layout, coll)
    if store is not None:
        kw = dict(stage=plan.stage, overlap=plan.reduce_overlap, comm=coll, comm_dtype=plan.comm_dtype)
        if plan.optimizer == "device":
            return ShardedDevicePath(store, name, params, client, **kw)
        buffers = ShardedBuffers(store, pin_memory=plan.pin_memory, **kw)
        layout = store.local_layout
    elif plan.optimizer == "device":
        return device_path(layout, plan.device, plan.dtype, name, params, client)
    else:
        buffers = HostBuffers(layout, plan.device, plan.dtype, plan.pin_memory, plan.bucket_elems,
                              flat_grads=plan.optimizer == "nvme" or plan.timing == "delayed")
    threads = host_threads(plan.world_size, float(config.offload["cpuadam_cores_perc"])
                           if config.offload["super_offload"] else None)
    if threads is not None and plan.rank == 0:
        log.info("zspeed: %d rank(s) on this host share its cores: %d CPU optimizer threads per rank "
                 "(set ZSPEED_NUM_THREADS to choose)", comm.get_local_world_size(), threads)
    if plan.optimizer == "nvme":
        return NVMePath(layout, buffers, name, params, client=client, offload_cfg=config.offload,
                        aio=config.aio, sub_group_size=int(config.zero["sub_group_size"]))
    return HostPath(layout, buffers, name, params, client=client, force_native=force,
                    chunk_elems=plan.chunk_elems, num_threads=threads, timing=plan.timing)


def _split_path(plan: RunPlan, config, layout: FlatLayout, name, params: dict, force: bool):
    """offload_optimizer.ratio < 1 (or "auto"): the optimizer split between the GPU and the CPU
    (split.py); None when "auto" chooses to step everything on the CPU."""
    from . import memory
    from .split import SplitPath, choose_ratio, measure_rates
    ratio = plan.ratio
    threads = host_threads(plan.world_size, None)
    device = plan.device
    if ratio == "auto":
        room = memory.gpu_room(device)
        if room is not None:
            room -= torch.cuda.memory_allocated(device)
        cpu_s, gpu_s = measure_rates(device, name, params, force, threads) if room is not None else (None, None)
        ratio = choose_ratio(sum(layout.totals), room, cpu_s, gpu_s)
        msg = (f"zspeed: offload_optimizer.ratio \"auto\" -> {ratio:.3f}: the CPU steps {100 * ratio:.1f}% of the "
               f"parameters, the GPU {100 * (1 - ratio):.1f}%" +
               (f" (GPU room {room / 2**30:.1f} GiB, CPU {cpu_s * 1e9:.2f} ns/element, GPU "
                f"{gpu_s * 1e9:.3f} ns/element)" if room is not None and cpu_s and gpu_s else " (no GPU)"))
        log.warning(msg)
        if ratio >= 1.0:
            return None
    return SplitPath(layout, device, plan.dtype, name, params, float(ratio), pin_memory=plan.pin_memory,
                     bucket=plan.bucket_elems, force_native=force, chunk_elems=plan.chunk_elems,
                     num_threads=threads, timing=plan.timing)


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
                f"the model was built inside zspeed.zero.Init on several ranks, which cut its parameters into "
                f"ZeRO-3 shards ({len(cut)} of them, e.g. {cut[0]!r}), but the config's zero_optimization.stage is "
                f"{self.plan.stage}. Set \"stage\": 3 in the config, or build the model outside zero.Init (with "
                f"Hugging Face transformers: load it without a ZeRO-3 config active).")
        dt = self.plan.dtype
        return model.to(device=self.plan.device, dtype=dt) if dt != torch.float32 else model.to(self.plan.device)

    def host_bytes_freed(self, layout: FlatLayout) -> int:
        """Host memory the model's own tensors hold now that the engine frees (none: placed already)."""
        return 0

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

    def finish(self, config, path: OptimizerPath, module: torch.nn.Module, coll: Collectives):
        from .zero3 import ParamFetcher
        plan = self.plan
        if self.frozen_layout is not None:
            self.frozen_store = build_store(self.frozen_layout, plan.world_size, plan.rank, plan.device, plan.dtype,
                                            config.offload_param, coll, trained=False, aio=config.aio)
        return ParamFetcher.from_zero(path.sharded, module, config.zero, comm=coll, frozen=self.frozen_store)


def placement(plan: RunPlan) -> WholeModel:
    """Where the plan puts the model's tensors (see WholeModel, PartitionedModel)."""
    return PartitionedModel(plan) if plan.store == "partitioned" else WholeModel(plan)


def move_except(model: torch.nn.Module, device: torch.device, dtype: torch.dtype, keep: dict) -> None:
    """model.to(device, dtype) for everything but the parameters in ``keep`` (ids): floating
    parameters and buffers take ``dtype``, as Module.to does."""
    from .zero import init_gather
    with torch.no_grad():
        for m in model.modules():
            for name, p in m._parameters.items():
                if p is not None and id(p) not in keep:
                    if hasattr(p, "ds_tensor"):  # cut by zero.Init, not trained: whole again
                        init_gather(p)
                        del p.ds_tensor, p.ds_shape, p.ds_numel
                    p.data = p.data.to(device, dtype if p.is_floating_point() else p.dtype)
            for name, b in m._buffers.items():
                if b is not None:
                    m._buffers[name] = b.to(device, dtype if b.is_floating_point() else b.dtype)


def grad_sync(plan: RunPlan, layout: FlatLayout, coll: Collectives):
    """What the ranks agree on before a step (dp.py): nothing with one rank, every gradient with
    whole replicas (stage 0), the statistics of each rank's part otherwise."""
    if coll.solo:
        return NoSync()
    if plan.store == "replicated":
        return ReplicaSync(layout.params, coll, plan.bucket_elems)
    return ShardSync(coll)
