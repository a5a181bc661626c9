"""Builds the optimizer that updates the fp32 master weights.

Two families, chosen by the engine:
- on the device (offload_optimizer.device = none): torch's own AdamW/Adam/Adagrad
  (fused on GPU), or TorchLion below;
- on the CPU (offload): zspeed's native CPUAdam/CPUAdagrad/CPULion (libzspeed), or
  torch's optimizers when the config says ``"torch_adam": true`` (DeepSpeed's key for
  "use torch's Adam instead of the DeepSpeed kernel"), or the client's optimizer class
  when ``zero_force_ds_cpu_optimizer`` is false.

Whatever runs on the CPU is wrapped in :class:`HostOptimizer`, whose single
``step(grads, grad_scale, lowp_out)`` is the one call the offloaded step makes.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .._optimizers import ZERO_TESTED_CLASSES
from ..ops._ds_optim import TorchLion  # noqa: F401 - a name of this module too
from .checkpoint_files import real
from .config import ConfigError

__all__ = ["TorchLion", "adam_state_dtype", "convert_adam_state", "build_device_optimizer", "build_host_optimizer", "HostOptimizer",
           "rebuild_like", "native_client", "client_as_config", "share_client_groups"]


def _torch_family(name: str, params: dict, groups, fused):
    if name in ("Adam", "AdamW"):
        if params.get("bias_correction", True) is False:
            if params.get("amsgrad"):
                raise ConfigError("optimizer.params.amsgrad with bias_correction false is not implemented; "
                                  "set one of them back to its default.")
            from ..ops._ds_optim import FusedAdam  # torch's Adam has no bias_correction switch
            return FusedAdam(groups, lr=params["lr"], bias_correction=False, betas=tuple(params["betas"]),
                             eps=params["eps"], adam_w_mode=params.get("adam_w_mode", True),
                             weight_decay=params["weight_decay"])
        cls = torch.optim.AdamW if params.get("adam_w_mode", True) else torch.optim.Adam
        opt = cls(groups, lr=params["lr"], betas=tuple(params["betas"]), eps=params["eps"],
                  weight_decay=params["weight_decay"], amsgrad=params.get("amsgrad", False), fused=fused)
        if params.get("torch_adam"):  # DeepSpeed's torch_adam: torch's class, as asked
            return opt
        # Where DeepSpeed runs its FusedAdam: torch's class (fused on the GPU) stands in for it.
        from ..ops._ds_optim import runs_as_fused_adam
        return runs_as_fused_adam(opt, params.get("adam_w_mode", True))
    if name == "Adagrad":
        return torch.optim.Adagrad(groups, lr=params["lr"], lr_decay=params["lr_decay"],
                                   weight_decay=params["weight_decay"], eps=params["eps"],
                                   initial_accumulator_value=params["initial_accumulator_value"])
    if name == "Lion":
        if params.get("torch_adam"):
            return TorchLion(groups, lr=params["lr"], betas=params["betas"], weight_decay=params["weight_decay"])
        from ..ops._ds_optim import FusedLion  # DeepSpeed's class for Lion on the device (same update)
        return FusedLion(groups, lr=params["lr"], betas=params["betas"], weight_decay=params["weight_decay"])
    raise ConfigError(f"internal: unexpected optimizer {name!r}")  # config validation prevents this


def build_device_optimizer(name: str, params: dict, groups, device: torch.device):
    """torch optimizer over master weights that live on ``device``."""
    fused = params.get("fused")
    if fused is None:
        fused = True if device.type == "cuda" and name in ("Adam", "AdamW") else None
    return _torch_family(name, params, groups, fused)


def _live_groups(client: torch.optim.Optimizer, built: int) -> list:
    """The client's groups with trainable parameters, one for each of the ``built`` groups the
    engine made from them (ConfigError if they do not match)."""
    live = [g for g in client.param_groups if any(p.requires_grad for p in g["params"])]
    if len(live) != built:
        raise ConfigError(f"the client optimizer {type(client).__name__} has {len(live)} parameter groups "
                          f"with trainable parameters, but zspeed built {built}; pass the "
                          f"optimizer's own parameters as model_parameters (or leave it out).")
    return live


def rebuild_like(client: torch.optim.Optimizer, master_groups: list) -> torch.optim.Optimizer:
    """The client's optimizer, now over the master weights: as DeepSpeed does with the
    optimizer a script passes, the same object is kept (so the script's own references and
    any lr scheduler built on it stay valid) and the parameters of its groups are replaced
    by the masters, group by group. State already held for a parameter moves to its master
    when the groups match one to one; groups without trainable parameters are dropped."""
    live = _live_groups(client, len(master_groups))
    old_state = client.state
    new_state: dict = {}
    for g, masters in zip(live, master_groups):
        trainable = [p for p in g["params"] if p.requires_grad]
        if len(trainable) == len(masters):
            for p, m in zip(trainable, masters):
                if p in old_state:
                    new_state[m] = old_state[p]
        g["params"] = list(masters)
    client.param_groups[:] = live
    from collections import defaultdict
    client.state = defaultdict(dict, new_state)
    return client


def native_client(client) -> bool:
    """Whether ``client`` is one of zspeed's native CPU optimizers (CPUAdam, CPUAdagrad,
    CPULion, or DeepSpeed's names for them), which the offloaded paths run directly."""
    try:
        from ..ops._torch_optim import CPUAdagrad, CPUAdam, CPULion
    except ImportError:  # zspeed.ops without libzspeed: no client can be native
        return False
    return isinstance(client, (CPUAdam, CPUAdagrad, CPULion))


def client_as_config(client) -> tuple[str, dict]:
    """(optimizer name, params) equivalent to a native client optimizer's defaults, for the
    paths that build their own optimizer from a config (nvme offload); each group's own
    lr, betas, eps and weight decay still come from the client's groups."""
    from ..ops._torch_optim import CPUAdagrad, CPUAdam, CPULion
    d = client.defaults
    if isinstance(client, CPUAdam):
        return ("AdamW" if d.get("adamw_mode", True) else "Adam"), dict(
            lr=d["lr"], betas=list(d["betas"]), eps=d["eps"], weight_decay=d["weight_decay"],
            bias_correction=d["bias_correction"], adam_w_mode=d.get("adamw_mode", True), amsgrad=False,
            torch_adam=False, fused=None, state_dtype=d.get("state_dtype", "fp32"))
    if isinstance(client, CPUAdagrad):
        return "Adagrad", dict(lr=d["lr"], lr_decay=0.0, eps=d["eps"], weight_decay=d["weight_decay"],
                               initial_accumulator_value=d["initial_accumulator_value"], torch_adam=False)
    if isinstance(client, CPULion):
        return "Lion", dict(lr=d["lr"], betas=list(d["betas"]), weight_decay=d["weight_decay"], torch_adam=False)
    raise TypeError(f"client_as_config: {type(client).__name__} is not one of zspeed's CPU optimizer classes "
                    f"(CPUAdam, CPUAdagrad, CPULion); a new native class needs its branch here")


def share_client_groups(client: torch.optim.Optimizer, basic: torch.optim.Optimizer) -> None:
    """A client optimizer whose settings the engine took instead of its object (the NVMe path, the
    GPU/CPU split): its ``param_groups`` become the engine's, so that an lr scheduler built on it
    (passed to initialize, or stepped by the script) changes the lr the engine steps with, as in
    DeepSpeed, which steps the client itself. Keys only the client's groups have (a scheduler's
    ``initial_lr``, ...) are kept."""
    live = _live_groups(client, len(basic.param_groups))
    for mine, theirs in zip(basic.param_groups, live):
        for k, v in theirs.items():
            if k != "params":
                mine.setdefault(k, v)
    client.param_groups = basic.param_groups


def _cpu_fused_supported() -> bool | None:
    try:
        torch.optim.AdamW([torch.zeros(1)], fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return None


def _native_ops():
    try:
        from ..ops import adagrad, adam, lion  # noqa: F401  (zspeed.ops needs libzspeed)
        from ..ops import grad_stats
    except ImportError as e:
        raise ConfigError(
            f"offload_optimizer.device 'cpu' uses zspeed's native CPU optimizers, which are not "
            f"available ({e}). Build libzspeed (cmake -S . -B build && cmake --build build) or set "
            f"ZSPEED_LIBRARY, or add \"torch_adam\": true to optimizer.params to run torch's "
            f"optimizer on the CPU instead.") from None
    return adam, adagrad, lion, grad_stats


class HostOptimizer:
    """The CPU optimizer of the offloaded step: one object, one call.

    ``step(grads, grad_scale, lowp_out)``: grads is a list (per group) of lists of
    contiguous CPU tensors (any float dtype, the numel of the matching master);
    every gradient is multiplied by grad_scale first; lowp_out (or None) is a list
    of lists of bf16/fp16 tensors that receive the updated weights."""

    def __init__(self, optimizer: torch.optim.Optimizer, native: bool, grad_stats=None):
        self.optimizer = optimizer
        self.native = native
        if native:
            # The state of each group in one buffer per key (from the first step or load on), in
            # the order of the host buffers that hold the masters, gradients and weights: a run of
            # consecutive parameters is one kernel call (the per-call cost once per run).
            optimizer.lay_out_states = True
        self._grad_stats = grad_stats
        self._gbufs: list | None = None  # fp32 gradient buffers of the torch fallback

    def grad_stats(self, tensors: list, scale: float) -> tuple[float, bool]:
        """(sum of squares of scale*g over all tensors, any non-finite value)."""
        if self._grad_stats is not None:
            s, bad = self._grad_stats(tensors, scale=scale)
            return float(s), bool(bad)
        return torch_grad_stats(tensors, scale)

    def step(self, grads: list, grad_scale: float, lowp_out: list | None) -> None:
        if self.native:
            self.optimizer.step(grads=grads, grad_scale=float(grad_scale), fp16_param_groups=lowp_out)
            return
        if self._gbufs is None:
            self._gbufs = [[torch.empty_like(m) for m in g["params"]] for g in self.optimizer.param_groups]
        for group, gl, bufs in zip(self.optimizer.param_groups, grads, self._gbufs):
            for m, g, b in zip(group["params"], gl, bufs):
                if g is None:  # not in this chunk: torch's optimizers skip params without .grad
                    m.grad = None
                    continue
                b.copy_(g.view(b.shape))
                if grad_scale != 1.0:
                    b.mul_(grad_scale)
                m.grad = b
        self.optimizer.step()
        for group in self.optimizer.param_groups:
            for m in group["params"]:
                m.grad = None
        if lowp_out is not None:
            for group, outs, gl in zip(self.optimizer.param_groups, lowp_out, grads):
                for m, o, g in zip(group["params"], outs, gl):
                    if g is not None:
                        o.copy_(m.view(o.shape))


def torch_grad_stats(tensors: list, scale: float) -> tuple[float, bool]:
    """Sum of squares of scale*g (per-tensor fp32 norms, summed in float64) and non-finiteness.

    vector_norm with dtype=float32 accumulates low-precision tensors in fp32 without
    materializing an fp32 copy of each gradient."""
    return norms_stats([torch.linalg.vector_norm(t, 2, dtype=torch.float32) for t in tensors], scale)


def norms_stats(norms: list, scale: float) -> tuple[float, bool]:
    """(sum of squares of scale*g, any inf/NaN) from per-tensor fp32 norms (on any device),
    summed in float64: the one reduction behind every path's grad_stats."""
    if not norms:
        return 0.0, False
    total = torch.stack(norms).to(torch.float64).square().sum().item() * float(scale) ** 2
    return total, not math.isfinite(total)


def zero_supported_classes() -> list:
    """The classes of zspeed._optimizers.ZERO_TESTED_CLASSES (only torch's where libzspeed is
    missing): the client optimizers ZeRO takes without zero_allow_untested_optimizer."""
    import importlib
    out = []
    for module, name in ZERO_TESTED_CLASSES:
        try:
            out.append(getattr(importlib.import_module(module), name))
        except ImportError:  # zspeed.ops without libzspeed: its classes cannot be passed either
            pass
    return out


def is_zero_supported_optimizer(optimizer) -> bool:
    """Whether ZeRO takes ``optimizer`` (an instance) without zero_allow_untested_optimizer: its
    exact class is one of zero_supported_classes() (a subclass is not, as in DeepSpeed)."""
    return type(optimizer) in zero_supported_classes()


def refuse_lr_decay(params: dict) -> None:
    """Offloaded Adagrad (host and NVMe tiers) has no lr decay: zspeed's kernel, like DeepSpeed's
    CPU Adagrad, takes none; a config asking for it is refused, not silently ignored."""
    if params["lr_decay"] != 0:
        raise ConfigError(f"optimizer.params.lr_decay = {params['lr_decay']}: zspeed's offloaded Adagrad (CPU and "
                          f"NVMe) has no lr decay; set it to 0 and decay the lr with a scheduler instead.")


def build_host_optimizer(name: str | None, params: dict, master_groups: list, *,
                         client: torch.optim.Optimizer | None, force_native: bool,
                         num_threads: int | None = None) -> HostOptimizer:
    """The optimizer over CPU master weights (see the module docstring)."""
    if client is not None:
        if native_client(client):
            # zspeed's own CPU optimizer (DeepSpeed's recommended pattern: a DeepSpeedCPUAdam
            # built by the script): it runs over the host masters as it is.
            _, _, _, grad_stats = _native_ops()
            opt = rebuild_like(client, [g["params"] for g in master_groups])
            if num_threads is not None and getattr(opt, "num_threads", None) is None:
                opt.num_threads = num_threads
            return HostOptimizer(opt, native=True, grad_stats=lambda ts, scale: grad_stats(
                ts, scale=scale, num_threads=getattr(opt, "num_threads", None)))
        if force_native:
            from .errors import ZeRORuntimeConfigError
            raise ZeRORuntimeConfigError(
                f"ZeRO-Offload with a client optimizer ({type(client).__name__}) that is not zspeed's CPU "
                f"optimizer: as in DeepSpeed, pass zspeed.ops.adam.DeepSpeedCPUAdam (or CPUAdam, CPULion, "
                f"CPUAdagrad), or configure the optimizer in the config's 'optimizer' section, or set "
                f"\"zero_force_ds_cpu_optimizer\": false to run your optimizer's class on the CPU (slower).")
        return HostOptimizer(rebuild_like(client, [g["params"] for g in master_groups]), native=False)
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": g["params"]} for g in master_groups]
    if params.get("torch_adam"):
        # torch's fused CPU Adam/AdamW kernel (torch >= 2.4) is its fastest on the CPU.
        fused = params.get("fused")
        if fused is None and name in ("Adam", "AdamW"):
            fused = _cpu_fused_supported()
        return HostOptimizer(_torch_family(name, params, groups, fused), native=False)
    adam, adagrad, lion, grad_stats = _native_ops()
    if name in ("Adam", "AdamW"):
        # DeepSpeed's classes (CPUAdam/CPULion with DeepSpeed's names and calls): a script that
        # checks isinstance(engine.optimizer.optimizer, DeepSpeedCPUAdam) finds what DeepSpeed's does.
        opt: Any = adam.DeepSpeedCPUAdam(groups, lr=params["lr"], bias_correction=params["bias_correction"],
                                         betas=tuple(params["betas"]), eps=params["eps"],
                                         weight_decay=params["weight_decay"], amsgrad=False,
                                         adamw_mode=params["adam_w_mode"], state_dtype=params["state_dtype"],
                                         num_threads=num_threads)
    elif name == "Adagrad":
        refuse_lr_decay(params)
        opt = adagrad.DeepSpeedCPUAdagrad(groups, lr=params["lr"], weight_decay=params["weight_decay"],
                                          initial_accumulator_value=params["initial_accumulator_value"],
                                          eps=params["eps"], num_threads=num_threads)
    else:
        opt = lion.DeepSpeedCPULion(groups, lr=params["lr"], betas=tuple(params["betas"]),
                                    weight_decay=params["weight_decay"], num_threads=num_threads)
    return HostOptimizer(opt, native=True,
                         grad_stats=lambda ts, scale: grad_stats(ts, scale=scale, num_threads=num_threads))


def adam_state_dtype(st: dict) -> str:
    """The dtype an Adam state dict keeps its moments in: "fp32", "bf16" or "int8"."""
    m = st.get("exp_avg")
    if m is not None and m.dtype == torch.int8:
        return "int8"
    return "bf16" if m is not None and m.dtype == torch.bfloat16 else "fp32"


def converted_like(st: dict, target: str, numel: int) -> dict:
    """What :func:`convert_adam_state` would give, as dtype and shape only (nothing is read or
    converted: for checks before a load)."""
    if adam_state_dtype(st) == target:
        return st
    out = {k: v for k, v in st.items() if k not in ("exp_avg_scale", "exp_avg_sq_scale")}
    if target == "int8":
        from ..ops import qblocks
        out.update(exp_avg=torch.empty(numel, dtype=torch.int8, device="meta"),
                   exp_avg_sq=torch.empty(numel, dtype=torch.uint8, device="meta"),
                   exp_avg_scale=torch.empty(qblocks(numel), device="meta"),
                   exp_avg_sq_scale=torch.empty(qblocks(numel), device="meta"))
    else:
        dt = torch.bfloat16 if target == "bf16" else torch.float32
        out.update(exp_avg=torch.empty(numel, dtype=dt, device="meta"),
                   exp_avg_sq=torch.empty(numel, dtype=dt, device="meta"))
    return out


def convert_adam_state(st: dict, target: str, numel: int, shape) -> dict:
    """An Adam state (fp32, bf16 or zspeed's 8-bit moments with their block scales) in the state
    dtype ``target`` (the moments shaped ``shape``); ``st`` itself when it is in it already.
    ValueError (naming the key) for a second moment with negative values, which 8-bit cannot hold."""
    have = adam_state_dtype(st)
    if have == target:
        return st
    from ..ops.adam import q8_dequantize, q8_quantize
    from ..ops import qblocks
    st = {k: real(v) for k, v in st.items()}  # (a checkpoint load's Deferred tensors are read here)
    out = dict(st)
    if have == "int8":
        m = torch.empty(numel, dtype=torch.float32)
        v = torch.empty(numel, dtype=torch.float32)
        q8_dequantize(st["exp_avg"].reshape(-1).contiguous(), st["exp_avg_scale"].contiguous(),
                      st["exp_avg_sq"].reshape(-1).contiguous(), st["exp_avg_sq_scale"].contiguous(), m, v)
        del out["exp_avg_scale"], out["exp_avg_sq_scale"]
    else:
        m = st["exp_avg"].reshape(-1).to(torch.float32).contiguous()
        v = st["exp_avg_sq"].reshape(-1).to(torch.float32).contiguous()
    if target == "int8":
        if bool((v < 0).any()):
            raise ValueError("exp_avg_sq has negative values, which Adam's second moment cannot have")
        nb = qblocks(numel)
        cm, cv = torch.empty(numel, dtype=torch.int8), torch.empty(numel, dtype=torch.uint8)
        sm, sv = torch.empty(nb, dtype=torch.float32), torch.empty(nb, dtype=torch.float32)
        q8_quantize(m, v, cm, sm, cv, sv)
        out.update(exp_avg=cm.view(shape), exp_avg_sq=cv.view(shape), exp_avg_scale=sm, exp_avg_sq_scale=sv)
    else:
        dt = torch.bfloat16 if target == "bf16" else torch.float32
        out.update(exp_avg=m.view(shape).to(dt), exp_avg_sq=v.view(shape).to(dt))
    return out
