"""``zspeed.init_inference``: run a model whose weights do not fit on the GPU (ZeRO-Inference).

With ``"zero": {"stage": 3, "offload_param": {"device": "cpu"}}`` every parameter's
weights live in page-locked host memory in the inference dtype, and each module's
weights are copied to the GPU just before it runs (prefetched in the order the first
forward used them) and dropped after: the machinery of ZeRO-3 training
(runtime/zero3.py) without an optimizer. With ``"device": "nvme"`` (and ``nvme_path``)
they live in a file there instead and are read ahead through the aio engine into
``buffer_count`` page-locked buffers (runtime/zero3_nvme.py); host memory then holds only
those buffers and the first ``max_in_cpu`` elements. Without it the model is moved to the device in
the inference dtype, as DeepSpeed's init_inference does.

DeepSpeed's inference config keys are read where they mean something here: ``dtype``
(default fp16, DeepSpeed's), ``zero`` (``zero_optimization`` is taken as a synonym, as
guides write it), and the stage-3 knobs of docs/ZERO3.md. Kernel injection, tensor
parallelism, CUDA graphs, quantization and checkpoint loading are refused by name with
what to use instead.
"""
from __future__ import annotations

import logging

import torch

from . import comm
from .runtime.config import ConfigError

log = logging.getLogger("zspeed.inference")

__all__ = ["init_inference", "InferenceEngine"]

_DTYPES = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}
_ZERO_KEYS = {"stage", "offload_param", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
              "stage3_max_live_parameters", "stage3_max_reuse_distance"}
_IGNORED = {"max_out_tokens", "max_tokens", "min_out_tokens", "min_tokens", "return_tuple", "triangular_masking",
            "tm", "replace_method", "training_mp_size", "keep_module_on_host", "set_empty_params",
            "transposed_mode", "use_triton", "triton_autotune", "moe", "base_dir"}


def _dtype(v) -> torch.dtype:
    if isinstance(v, torch.dtype):
        return v
    if isinstance(v, str) and v.lower().replace("torch.", "") in _DTYPES:
        return _DTYPES[v.lower().replace("torch.", "")]
    raise ConfigError(f"init_inference: dtype {v!r} is not one of torch.float16, torch.bfloat16, torch.float32 "
                      f"(or 'fp16', 'bf16', 'fp32').")


def _refuse(cfg: dict) -> None:
    if cfg.get("replace_with_kernel_inject") or cfg.get("kernel_inject"):
        raise ConfigError("init_inference: kernel injection (replace_with_kernel_inject / kernel_inject) is not "
                          "supported by zspeed, which runs the model's own modules; remove the key (torch's "
                          "scaled_dot_product_attention already gives fused attention kernels).")
    tp = cfg.get("tensor_parallel", cfg.get("tp")) or {}
    tp_size = tp.get("tp_size", 1) if isinstance(tp, dict) else 1
    if (tp.get("enabled", True) if isinstance(tp, dict) else True) and (tp_size or 1) > 1 or cfg.get("mp_size", 1) > 1:
        raise ConfigError("init_inference: tensor parallelism (tensor_parallel.tp_size / mp_size > 1) is not "
                          "supported by zspeed; to run a model larger than one GPU use "
                          "\"zero\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\"}}.")
    if cfg.get("enable_cuda_graph"):
        raise ConfigError("init_inference: enable_cuda_graph is not supported by zspeed; remove it.")
    q = cfg.get("quant") or {}
    if isinstance(q, dict) and q.get("enabled", False) and q:
        raise ConfigError("init_inference: quantization (quant) is not supported by zspeed; load the model in "
                          "fp16 or bf16.")
    if cfg.get("checkpoint") is not None:
        raise ConfigError("init_inference: checkpoint= (DeepSpeed's sharded inference checkpoints) is not "
                          "supported; load the weights into the model (model.load_state_dict, or "
                          "from_pretrained) before init_inference.")


_NVME_KEYS = {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu"}


def _check_nvme_section(off: dict) -> None:
    """offload_param with device nvme: DeepSpeed's keys, and an existing writable nvme_path."""
    import os
    bad = sorted(set(off) - _NVME_KEYS)
    if bad:
        raise ConfigError(f"init_inference: offload_param keys {bad} are not known; zspeed reads {sorted(_NVME_KEYS)}.")
    path = off.get("nvme_path")
    if not path:
        raise ConfigError("init_inference: offload_param.nvme_path is required with device 'nvme': a directory on "
                          "a fast local disk where zspeed may write the weights' file.")
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"init_inference: offload_param.nvme_path = {path!r} is not an existing writable "
                          f"directory; create it or choose another.")


class InferenceEngine(torch.nn.Module):
    """The model, ready for inference: ``engine(...)`` is the module's forward, ``engine.module``
    the model, ``engine.generate`` the model's own (Hugging Face models)."""

    def __init__(self, model: torch.nn.Module, cfg: dict):
        super().__init__()
        _refuse(cfg)
        unknown = sorted(k for k in cfg if k not in _IGNORED | {
            "dtype", "zero", "zero_optimization", "replace_with_kernel_inject", "kernel_inject",
            "tensor_parallel", "tp", "mp_size", "enable_cuda_graph", "quant", "checkpoint"})
        if unknown:
            raise ConfigError(f"init_inference: unknown config key(s) {unknown}; zspeed reads dtype and zero "
                              f"(stage 3 with offload_param).")
        from .runtime.device import pick_device
        self.device = pick_device()
        self.dtype = _dtype(cfg.get("dtype", torch.float16))
        zero = cfg.get("zero", cfg.get("zero_optimization")) or {}
        bad = sorted(set(zero) - _ZERO_KEYS)
        if bad:
            raise ConfigError(f"init_inference: zero keys {bad} do not apply to inference; zspeed reads "
                              f"{sorted(_ZERO_KEYS)}.")
        stage = int(zero.get("stage", 0))
        off = zero.get("offload_param") or {}
        dev = off.get("device", "none")
        if dev not in ("none", "cpu", "nvme"):
            raise ConfigError(f"init_inference: offload_param.device {dev!r} is not one of 'none', 'cpu', 'nvme'.")
        if dev == "nvme":
            _check_nvme_section(off)
        if dev != "none" and stage != 3:
            raise ConfigError("init_inference: offload_param needs \"stage\": 3 (the weights are partitioned and "
                              "streamed only at stage 3).")
        self._fetcher = None
        model.eval()
        if stage == 3:
            self._partition(model, zero, {**off, "device": dev, "pin_memory": bool(off.get("pin_memory", True))})
        else:
            model.to(self.device, self.dtype)
        self.module = model

    def _partition(self, model, zero: dict, off: dict) -> None:
        from .runtime.assemble import move_except
        from .runtime.layout import FlatLayout
        from .runtime.assemble import build_store
        from .runtime.plan import shard_medium
        from .runtime.zero3 import ParamFetcher
        layout = FlatLayout([{"params": [p for p in model.parameters() if p.is_floating_point()]}])
        move_except(model, self.device, self.dtype, layout.index)
        if comm.get_world_size() > 1:  # every rank's shard is cut from rank 0's weights
            _broadcast_from_rank0(model, self.device)
        coll = _collectives(self.device)
        self._sm = build_store(layout, comm.get_world_size(), comm.get_rank(), self.device, self.dtype, off, coll,
                               medium=shard_medium(off.get("device", "none"), trained=False))
        self._fetcher = ParamFetcher.from_zero(self._sm, model, zero, comm=coll)

    def forward(self, *args, **kwargs):
        with torch.no_grad():
            return self.module(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with torch.no_grad():
            return self.module.generate(*args, **kwargs)

    def close(self) -> None:
        """With offload_param nvme: deletes the weights' file (also done when the engine is
        garbage-collected); the model cannot run afterwards. Idempotent."""
        sm = getattr(self, "_sm", None)
        if sm is not None and hasattr(sm, "close"):
            sm.close()

    destroy = close


def _collectives(device: torch.device):
    """The comm strategy of this process group for a model on ``device`` (runtime/collectives.py)."""
    from .runtime.collectives import Collectives
    if comm.get_world_size() == 1:
        return Collectives("none", device)
    if comm.get_backend() == "nccl":
        return Collectives("device", device)
    return Collectives("staged" if device.type == "cuda" else "host", torch.device("cpu"))


def _broadcast_from_rank0(model: torch.nn.Module, device: torch.device) -> None:
    """Rank 0's weights on every rank (runtime/replicate.py), after checking that the ranks hold
    the same parameter and buffer names and shapes (a broadcast of different sizes would hang)."""
    import torch.distributed as td
    from .runtime.replicate import broadcast_module
    from .runtime.zero3 import full_shape
    mine = [(n, tuple(full_shape(t)), str(t.dtype)) for n, t in
            list(model.named_parameters()) + list(model.named_buffers())]
    every: list = [None] * td.get_world_size()
    td.all_gather_object(every, mine)
    for r, other in enumerate(every):
        if other != every[0]:
            raise ConfigError(f"init_inference: rank {r} holds a model with other parameter or buffer names, "
                              f"shapes or dtypes than rank 0's; every rank must build the same model.")
    broadcast_module(model, _collectives(device))


def init_inference(model: torch.nn.Module, config: dict | None = None, **kwargs) -> InferenceEngine:
    """DeepSpeed's ``deepspeed.init_inference``: returns an engine around ``model`` (see the
    module docstring). ``config`` and keyword arguments are merged (keywords win)."""
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"init_inference needs a torch.nn.Module, got {type(model).__name__}.")
    cfg = dict(config or {})
    cfg.update(kwargs)
    comm.init_distributed(verbose=False)
    return InferenceEngine(model, cfg)
