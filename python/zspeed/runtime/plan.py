"""The run plan: the config and the launch turned, once, into the decisions every part of the
engine is built from, and the one table of the combinations zspeed runs.

Two things live here and nowhere else:

- :data:`FEATURES`, the table of legal combinations. Each row is a setting (a config key, or
  an argument of ``initialize``) with what it requires of the run: ZeRO stages, rank counts,
  where the optimizer state lives, the optimizer, and the settings it excludes. Every refusal
  of a combination is a row's message (:func:`check`), and the combinations table of
  docs/CONFIG.md is the same rows rendered (:func:`combinations_table`), so the two cannot
  disagree. The config parser checks the rows it can decide from the config alone (config.py);
  the engine checks all of them once it knows the launch (world size, a client optimizer).
- :class:`RunPlan`, a frozen record of what the engine assembles (assemble.py): which
  parameter store (replicated, sharded over the ranks, or partitioned over a medium at ZeRO-3),
  which communication strategy (none, on the device, on the host, or staged through the host
  from the device), where the optimizer state lives (device, host, NVMe, or split between
  the GPU, the host and NVMe), and how the step is timed (synchronous, overlapped with the next
  forward, or delayed by one step). Nothing downstream reads the raw config section again
  for these decisions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .errors import ConfigError

__all__ = ["Facts", "Requirement", "Feature", "FEATURES", "check", "RunPlan", "combinations_table"]

_UNKNOWN = None  # a fact the config alone does not decide (known once the engine is built)


@dataclass(frozen=True)
class Facts:
    """What the table's rows look at. ``client`` and ``world_size`` may be unknown (None) at
    config time."""
    stage: int
    offload: str             # offload_optimizer.device: none | cpu | nvme
    delayed: bool
    overlap: bool
    ratio: object            # 1.0 (no split), a float in (0, 1), or "auto"
    optimizer: str | None    # the config's optimizer type (canonical), or the client's class
    torch_adam: bool
    amsgrad: bool = False
    grad_sum: bool = False   # gradient_allreduce_op "sum"
    host_tier: bool = False  # offload_optimizer.max_in_cpu > 0: part of the optimizer's share in host memory
    world_size: int | None = _UNKNOWN
    client: str | None = _UNKNOWN   # "none", "native" (zspeed's own CPU optimizers) or "other"

    @property
    def auto_ratio(self) -> bool:
        return self.ratio == "auto"

    @classmethod
    def from_config(cls, cfg, *, world_size: int | None = None, client: str | None = None,
                    client_optimizer: str | None = None) -> "Facts":
        """``client_optimizer``: the algorithm of a client optimizer zspeed runs itself (a native one:
        "Adam", "AdamW", "Adagrad", "Lion"), which replaces the config's."""
        return cls(stage=cfg.zero_stage, offload=cfg.offload_device,
                   delayed=bool(cfg.offload["delayed_update"]), overlap=bool(cfg.offload["overlap_forward"]),
                   ratio=cfg.offload["ratio"], optimizer=client_optimizer or cfg.optimizer_name,
                   torch_adam=bool((cfg.optimizer_params or {}).get("torch_adam")),
                   amsgrad=bool((cfg.optimizer_params or {}).get("amsgrad")),
                   grad_sum=cfg.top["gradient_allreduce_op"] == "sum",
                   host_tier=float(cfg.offload["max_in_cpu"]) > 0,
                   world_size=world_size, client=client)


@dataclass(frozen=True)
class Requirement:
    """One condition of a row: ``fact`` must be one of ``allowed``. ``says`` follows the setting's
    name in the refusal ("needs ...", "runs at ..."), ``why`` explains it, ``fix`` says what to do;
    ``doc`` is the cell of the docs' table."""
    fact: str
    allowed: frozenset
    says: str
    why: str
    fix: str
    doc: str
    column: str


def _has(f: Facts, name: str) -> str:
    """How a fact reads in a refusal ("this run has ...")."""
    v = getattr(f, name)
    return {"stage": f"stage {v}", "world_size": f"{v} rank(s)", "offload": f"offload_optimizer.device {v!r}",
            "client": {"native": "a zspeed CPU optimizer passed to initialize()", "other":
                       "an optimizer passed to initialize()", "none": "no optimizer passed"}.get(v, str(v)),
            "optimizer": f"optimizer {v!r}", "delayed": "delayed_update on", "overlap": "overlap_forward on",
            "split": "ratio < 1", "torch_adam": "torch_adam on", "amsgrad": "amsgrad on",
            "auto_ratio": 'ratio "auto"', "host_tier": "max_in_cpu > 0"}.get(name, f"{name} {v!r}")


@dataclass(frozen=True)
class Feature:
    """A row of the table: a setting, when it is on, and what it requires."""
    name: str                                   # the docs' first column
    key: str                                    # the config path (or initialize's argument)
    on: Callable[[Facts], bool]
    requires: tuple
    shown: Callable[[Facts], str] = field(default=lambda f: "")  # the value after the key

    def refusal(self, f: Facts, req: Requirement) -> str:
        return (f"{self.key}{self.shown(f)} {req.says} ({req.why}); this config has {_has(f, req.fact)}. "
                f"{req.fix}")


def _req(fact, allowed, says, why, fix, doc, column) -> Requirement:
    return Requirement(fact, frozenset(allowed), says, why, fix, doc, column)


def _cpu_offload(why: str) -> Requirement:
    return _req("offload", {"cpu"}, "needs offload_optimizer.device \"cpu\"", why,
                "Remove the key or offload to cpu.", "cpu", "optimizer offload")


def _not_with_delayed() -> Requirement:
    return _req("delayed", {False}, "and delayed_update cannot be combined",
                "delayed_update runs the CPU step one step stale in the background",
                "Turn one of them off: choose one.", "delayed_update", "not with")


def _split(f: Facts) -> bool:
    return f.ratio != 1.0


FEATURES: tuple = (
    Feature("gradient sum over ranks", "gradient_allreduce_op", lambda f: f.grad_sum,
            (_req("stage", {0, 1, 2}, "is not supported with ZeRO stage 3: it runs at stage 0, 1 or 2",
                  "as in DeepSpeed, whose ZeRO-3 rejects it", "Use \"mean\" (the default) at stage 3.", "0-2",
                  "ZeRO stages"),),
            shown=lambda f: ' "sum"'),
    Feature("optimizer offload", "zero_optimization.offload_optimizer.device",
            lambda f: f.offload != "none",
            (_req("stage", {1, 2, 3}, "needs zero_optimization.stage 1, 2 or 3", "DeepSpeed offloads only under ZeRO",
                  "Set \"stage\": 2.", "1-3", "ZeRO stages"),),
            shown=lambda f: f" {f.offload!r}"),
    Feature("optimizer on NVMe", "zero_optimization.offload_optimizer.device 'nvme'",
            lambda f: f.offload == "nvme",
            (_req("client", {"none", "native"}, "with a client optimizer passed to zspeed.initialize",
                  "nvme offload runs zspeed's own Adam/AdamW/Adagrad/Lion kernels",
                  "Configure the optimizer in the config's 'optimizer' section instead.",
                  "config's or zspeed's", "optimizer"),)),
    Feature("AMSGrad", "optimizer.params.amsgrad", lambda f: f.amsgrad,
            (_req("offload", {"none"}, "is not supported with offload_optimizer",
                  "the CPU Adam kernel implements Adam/AdamW", "Set amsgrad false.", "none", "optimizer offload"),)),
    Feature("delayed update", "zero_optimization.offload_optimizer.delayed_update",
            lambda f: f.delayed,
            (_cpu_offload("the step it delays is the CPU optimizer's"),)),
    Feature("overlap with the next forward", "zero_optimization.offload_optimizer.overlap_forward",
            lambda f: f.overlap,
            (_cpu_offload("the step it overlaps is the CPU optimizer's"),
             _not_with_delayed())),
    Feature("GPU/CPU optimizer split", "zero_optimization.offload_optimizer.ratio",
            _split,
            (_req("offload", {"cpu", "nvme"}, "needs offload_optimizer.device \"cpu\" or \"nvme\"",
                  "it splits the offloaded optimizer's work with the GPU", "Remove the key or offload to cpu.",
                  "cpu, nvme", "optimizer offload"),
             _not_with_delayed(),
             _req("client", {"none", "native"}, "builds its own Adam/AdamW on both sides from the config's "
                  "optimizer section or the settings of a zspeed CPU Adam passed to initialize() (DeepSpeedCPUAdam, "
                  "as DeepSpeed's SuperOffload examples pass), not from another optimizer object",
                  "the GPU's half is torch's fused AdamW, the CPU's zspeed's",
                  "Remove optimizer= (configure it in the 'optimizer' section), pass a DeepSpeedCPUAdam, or use "
                  "ratio 1.", "config's or zspeed's", "optimizer"),
             _req("optimizer", {"Adam", "AdamW"}, "splits Adam/AdamW between the GPU and the CPU",
                  "both halves must run the same algorithm", "Use Adam or AdamW, or ratio 1.", "Adam, AdamW",
                  "optimizer")),
            shown=lambda f: f" = {f.ratio!r}"),
    Feature("GPU/NVMe optimizer split", "zero_optimization.offload_optimizer.ratio with device 'nvme'",
            lambda f: _split(f) and f.offload == "nvme",
            (_req("auto_ratio", {False}, "takes a number here, not \"auto\"",
                  "sizing the GPU's share after step 1 would read every NVMe state back into host memory",
                  "Set the GPU's share yourself (zspeed plan suggests one).", "a number", "not with"),),
            shown=lambda f: f" = {f.ratio!r}"),
    Feature("optimizer state in host memory and on NVMe", "zero_optimization.offload_optimizer.max_in_cpu",
            lambda f: f.host_tier,
            (_req("offload", {"nvme"}, "needs offload_optimizer.device \"nvme\"",
                  "it keeps part of the NVMe share's masters and state in host memory",
                  "Remove the key (with device \"cpu\" everything is in host memory already).", "nvme",
                  "optimizer offload"),),
            shown=lambda f: ""),
)


def check(f: Facts) -> None:
    """Raises the ConfigError of the first row ``f`` breaks (rows whose facts are unknown yet are
    skipped: the engine checks them again once it knows them)."""
    for feat in FEATURES:
        if not feat.on(f):
            continue
        for req in feat.requires:
            v = getattr(f, req.fact)
            if v is _UNKNOWN:
                continue
            if v not in req.allowed:
                raise ConfigError(feat.refusal(f, req))


def combinations_table() -> str:
    """The table's rows as markdown (docs/CONFIG.md, "Combinations")."""
    cols = ["ZeRO stages", "ranks", "optimizer offload", "optimizer", "not with"]
    lines = ["| setting | key | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 2)]
    for feat in FEATURES:
        cells = {c: [] for c in cols}
        for req in feat.requires:
            cells[req.column].append(req.doc)
        lines.append(f"| {feat.name} | `{feat.key}` | " +
                     " | ".join(", ".join(cells[c]) or "any" for c in cols) + " |")
    return "\n".join(lines) + "\n"


# -- the plan ------------------------------------------------------------------------------------
_COMM_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
                "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
_BUCKET_CAP = 1 << 24  # elements per bucket at most: large enough to amortize, small enough to overlap
CHUNK_CAP = 1 << 26    # elements per CPU optimizer chunk at most


@dataclass(frozen=True)
class RunPlan:
    """What the engine is assembled from (see the module docstring)."""
    stage: int
    world_size: int
    rank: int
    device: torch.device
    dtype: torch.dtype            # the model's training dtype
    store: str                    # "replicated" | "sharded" | "partitioned"
    param_medium: str             # where a partitioned store keeps its shards: "device" | "host"
    frozen_medium: str            # ... and the shards of parameters nothing trains: also "nvme"
    comm: str                     # "none" | "device" (NCCL) | "host" (Gloo, host model) | "staged" (Gloo, CUDA)
    optimizer: str                # "device" | "host" | "nvme" | "split"
    timing: str                   # "sync" | "overlap" | "delayed"
    ratio: object                 # the CPU's share with optimizer "split" (a float, or "auto")
    unit_elems: int               # elements per unit of the partition (stage 3: one parameter per unit)
    bucket_elems: int             # elements per gradient bucket (copies to the host)
    chunk_elems: int              # elements per chunk of the CPU optimizer's step
    reduce_overlap: bool          # zero_optimization.overlap_comm
    comm_dtype: torch.dtype
    pin_memory: bool
    grad_divisor: int = 1         # the ranks' summed gradients are divided by this: world_size ("mean") or 1 ("sum")
    shard_degree: int = 1         # the ranks the trained parameters are split over: world_size when sharded, else 1
    cores_share: float | None = None  # the CPU optimizer's share of this rank's cores (None: all of them)
    cpu_tier: str = "host"        # where a split's non-GPU share keeps its masters and state: "host" | "nvme"
    host_elems: int = 0           # with cpu_tier "nvme": elements of that share kept in host memory (max_in_cpu)
    grads_in_shards: bool = False  # the reduced gradients land in the host parameter shards (no gradient buffer)
    check_unused: bool = False    # a step whose trained parameters did not all get a gradient raises

    @property
    def sharded(self) -> bool:
        """Whether this rank steps only its part of the parameters (stages 1-2 on several ranks,
        and stage 3)."""
        return self.store != "replicated"

    @classmethod
    def build(cls, config, *, world_size: int, rank: int, device: torch.device, dtype: torch.dtype,
              backend: str | None, client: str, client_optimizer: str | None = None) -> "RunPlan":
        """The plan of ``config`` for this launch (after :func:`check` of every row)."""
        check(Facts.from_config(config, world_size=world_size, client=client, client_optimizer=client_optimizer))
        stage, several = config.zero_stage, world_size > 1
        pdev, off = config.offload_param["device"], config.offload
        store = _STORE[stage, several or config.offload_device != "none"]
        name = config.top["communication_data_type"]
        if (name or "fp32").lower() not in _COMM_DTYPES:
            raise ConfigError(f"communication_data_type = {name!r} is not one of fp32, fp16, bf16.")
        bucket = min(int(config.zero["reduce_bucket_size"]), _BUCKET_CAP)
        return cls(stage=stage, world_size=world_size, rank=rank, device=device, dtype=dtype, store=store,
                   param_medium=shard_medium(pdev, True), frozen_medium=shard_medium(pdev, False),
                   comm=_COMM[several, backend == "nccl", device.type],
                   optimizer=_OPTIMIZER[config.offload_device, off["ratio"] != 1.0 or float(off["max_in_cpu"]) > 0],
                   timing=_TIMING[bool(off["delayed_update"]), bool(off["overlap_forward"])], ratio=off["ratio"],
                   unit_elems=_UNIT.get(store, bucket) if several else 1, bucket_elems=bucket,
                   chunk_elems=min(int(config.zero["sub_group_size"]), CHUNK_CAP),
                   reduce_overlap=overlap_comm(config.zero),
                   comm_dtype=_COMM_DTYPES.get((name or "").lower(), dtype), cpu_tier=_CPU_TIER[config.offload_device],
                   host_elems=int(off["max_in_cpu"]),  # > 0 only with device nvme (the rows say so)
                   pin_memory=bool(off["pin_memory"]), cores_share=getattr(config, "cpu_cores_share", None),
                   shard_degree=_SHARD_DEGREE[store](world_size),
                   grad_divisor={"mean": world_size, "sum": 1}[config.top["gradient_allreduce_op"]],
                   grads_in_shards=_grads_in_shards(config, store, shard_medium(pdev, True), dtype, off),
                   check_unused=not config.zero["ignore_unused_parameters"]
                   and _CHECKS_UNUSED.get((stage, config.offload_device), False))


def _grads_in_shards(config, store: str, medium: str, dtype: torch.dtype, off: dict) -> bool:
    """Whether the reduced gradients can land in the host parameter shards: a partitioned store in
    host memory, stepped in place by the CPU optimizer (offload_optimizer cpu, or nvme, whose
    swappers step resumably; also a GPU/CPU split's other tiers; not delayed, whose step runs
    while the model trains on the shards), low-precision weights (an fp32 model's shards are its
    masters), and one micro-batch per step (with several, each forward would read the weights
    back from the masters). Correct in any case it allows (docs/ZERO3.md)."""
    return (bool(config.offload_param["grads_in_shards"]) and store == "partitioned" and medium == "host"
            and dtype != torch.float32 and config.offload_device in ("cpu", "nvme") and not off["delayed_update"]
            and int(config.gradient_accumulation_steps or 1) == 1)


# The plan's decisions, one table each (read by RunPlan.build alone).
# (stage, several ranks or an offloaded optimizer) -> the store: an offloaded optimizer steps a
# store's local space on one rank too (shard degree 1), so one path serves any rank count.
_STORE = {(0, False): "replicated", (1, False): "replicated", (2, False): "replicated", (3, False): "partitioned",
          (0, True): "replicated", (1, True): "sharded", (2, True): "sharded", (3, True): "partitioned"}
_SHARD_DEGREE = {"replicated": lambda ws: 1, "sharded": lambda ws: ws, "partitioned": lambda ws: ws}
_MEDIUM = {"none": "device", "cpu": "host", "nvme": "host"}       # offload_param.device -> the shards' medium
_FROZEN_MEDIUM = {"nvme": "nvme"}                                  # ... of parameters nothing trains


def shard_medium(offload_param_device: str, trained: bool) -> str:
    """Where a partitioned store keeps its shards for offload_param.device: "device", "host", or
    for parameters nothing trains with nvme, "nvme" (trained ones stay in host memory: the
    optimizer writes their new weights there every step)."""
    medium = _MEDIUM[offload_param_device]
    return medium if trained else _FROZEN_MEDIUM.get(offload_param_device, medium)
_COMM = {**{(False, nccl, dev): "none" for nccl in (False, True) for dev in ("cpu", "cuda")},
         (True, True, "cpu"): "device", (True, True, "cuda"): "device",
         (True, False, "cpu"): "host", (True, False, "cuda"): "staged"}
_OPTIMIZER = {("none", False): "device", ("none", True): "device", ("cpu", False): "host", ("cpu", True): "split",
              ("nvme", False): "nvme", ("nvme", True): "split"}
_CPU_TIER = {"none": "host", "cpu": "host", "nvme": "nvme"}   # offload_optimizer.device -> a split's other tier
_TIMING = {(True, False): "delayed", (True, True): "delayed", (False, True): "overlap", (False, False): "sync"}
def overlap_comm(zero: dict) -> bool:
    """A parsed zero_optimization section's overlap_comm; unset, DeepSpeed's default (its
    validator overlap_comm_valid): on at stage 3, off below."""
    v = zero["overlap_comm"]
    return int(zero["stage"]) == 3 if v is None else bool(v)


_UNIT = {"partitioned": 1}   # ZeRO-3 and one rank: one parameter per unit; otherwise units of a bucket
# ignore_unused_parameters false is checked where DeepSpeed checks it: its stage 1-2 CPU offload.
_CHECKS_UNUSED = {(1, "cpu"): True, (2, "cpu"): True}
