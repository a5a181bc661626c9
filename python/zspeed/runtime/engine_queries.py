"""DeepSpeed's read-only queries of an engine (DeepSpeedEngine's names): the config as the run
uses it, the step's results, and the names of a checkpoint's files. :class:`EngineQueries` is
the base of engine.ZSpeedEngine, with DeepSpeed's pass-through of other public names to the
model; its methods read only the engine's config, run plan and parts
(``_config``, ``plan``, ``_gas``, ``_stage3``, ``_step``, ``_timing``, ``loss_scaler``,
``optimizer``, ``optimizer_path``, ``module``), never change them."""
from __future__ import annotations

import functools
import os

import torch

from .config import check_param_dtype
from .dtypes import cast_module, dtype_of

__all__ = ["EngineQueries"]


class EngineQueries:
    """DeepSpeedEngine's query methods (see the module docstring)."""

    # -- DeepSpeed's query API ------------------------------------------------------------------
    def train_batch_size(self) -> int:
        return self._config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._gas

    def get_wall_clock_timers(self) -> dict:
        """With wall_clock_breakdown true: {timer name: milliseconds} of the last step() call's
        forward, backward and step timers (timing.py); {} otherwise, or before the first step()."""
        return dict(self._timing.snapshot)

    def wall_clock_breakdown(self) -> bool:
        return self._config.wall_clock_breakdown

    def gradient_clipping(self) -> float:
        """The global gradient norm the step clips to (0: no clipping; DeepSpeed's default 1.0)."""
        return self._config.gradient_clipping

    def log_level(self) -> str | None:
        """The config's log_level (None: zspeed's logger kept the level it had)."""
        return self._config.log_level

    def fp16_enabled(self) -> bool:
        return self._config.fp16_enabled

    def bfloat16_enabled(self) -> bool:
        return self._config.bf16_enabled

    # DeepSpeed's mixed-precision helpers (DeepSpeedEngine's names), written against the DeepSpeed
    # attributes only (self._config.param_dtype / buffer_dtype, fp16_enabled(), bfloat16_enabled(),
    # self.module), as scripts and DeepSpeed's tests call them on stand-ins too.
    def _assert_valid_mixed_precision_config(self) -> None:
        """data_types.param_dtype, when set, must name the dtype fp16/bf16 train in (AssertionError)."""
        check_param_dtype(self._config.param_dtype,
                          "fp16" if self.fp16_enabled() else "bf16" if self.bfloat16_enabled() else "fp32")

    def _mixed_precision_dtypes(self) -> tuple:
        """(param dtype, buffer dtype) of the module cast: the parameters in fp16/bf16's dtype (None
        in fp32), the floating-point buffers in data_types.buffer_dtype (None: each keeps its own)."""
        param = torch.float16 if self.fp16_enabled() else torch.bfloat16 if self.bfloat16_enabled() else None
        name = self._config.buffer_dtype
        return param, (None if name is None else dtype_of(name))

    def _cast_module_mixed_precision(self, param_dtype, buffer_dtype, is_zero_init_model, keep_pattern=None):
        """Cast self.module's floating-point parameters to param_dtype (not ZeRO-Init ones, made in
        it already) and its buffers to buffer_dtype (None leaves them), those whose full names match
        ``keep_pattern`` (keep_in_fp32_pattern's) to fp32. zspeed's own initialize casts through
        its placement (the same rules); this serves scripts that call DeepSpeed's helper."""
        cast_module(self.module, param_dtype, buffer_dtype, is_zero_init_model, keep_pattern)

    def zero_optimization_stage(self) -> int:
        return self._config.zero_stage

    def zero_cpu_offload(self) -> bool:
        """True with offload_optimizer.device cpu (DeepSpeed's meaning; nvme is not 'cpu offload')."""
        return self._config.offload_device == "cpu"

    def zero_overlap_comm(self) -> bool:
        """zero_optimization.overlap_comm as the run uses it (unset: on at stage 3, as DeepSpeed)."""
        return self.plan.reduce_overlap

    # DeepSpeed's names of a checkpoint's files, for scripts that compute paths: zspeed's files
    # (docs/CHECKPOINTS.md), as the tag folder holds them.
    def _get_ckpt_name(self, checkpoints_path, tag, mp_placeholder=None, pp_placeholder=None) -> str:
        """The file of the module's state in a checkpoint: ``<path>/<tag>/model.safetensors``."""
        return os.path.join(checkpoints_path, str(tag), "model.safetensors")

    def _get_optimizer_ckpt_name(self, checkpoints_path, tag, expp_rank=None) -> str:
        """The file of this rank's optimizer state: ``optim.safetensors`` where rank 0 writes
        the whole state, ``optim.rank<r>.safetensors`` where each rank writes its part (zspeed has
        no expert-parallel files: ``expp_rank`` is accepted and does not change the name)."""
        from .checkpoint import optimizer_file
        return os.path.join(checkpoints_path, str(tag), optimizer_file(self._checkpoint_parts()))

    def _get_zero_ckpt_name(self, checkpoints_path, tag) -> str:
        """DeepSpeed's name of this rank's ZeRO optimizer file: the same file as above."""
        return self._get_optimizer_ckpt_name(checkpoints_path, tag)

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        """DeepSpeed's query of zero_optimization.stage3_gather_16bit_weights_on_model_save (or its
        older fp16 name); accelerate asks it before saving a ZeRO-3 model."""
        return self._config.gather_16bit_weights_on_model_save

    def zero_optimization_partition_weights(self) -> bool:
        """DeepSpeed's: whether the weights are partitioned (ZeRO stage 3)."""
        return self._stage3

    def _change_recovery_script_permissions(self, dst) -> None:
        """DeepSpeed's name: makes a recovery script executable, or says why not and goes on."""
        from .checkpoint_fp32 import make_executable
        make_executable(dst)

    @functools.cached_property
    def checkpoint_engine(self):
        """DeepSpeed's ``engine.checkpoint_engine``: torch.save / torch.load of the script's own
        files (runtime.checkpoint_engine.TorchCheckpointEngine, the config's
        checkpoint.checkpoint_serialization); the engine's checkpoints do not use it."""
        from .checkpoint_engine import TorchCheckpointEngine
        return TorchCheckpointEngine(self._config)

    def get_lr(self) -> list:
        """The learning rate of each parameter group ([] without an optimizer, as DeepSpeed)."""
        return [g["lr"] for g in self.optimizer.param_groups] if self.optimizer is not None else []

    def get_global_grad_norm(self) -> float | None:
        return self._step.grad_norm

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale

    def was_step_applied(self) -> bool:
        """False when the last optimizer step was skipped (fp16 overflow), as in DeepSpeed."""
        return not self._step.overflow

    def nvme_stats(self, reset: bool = False) -> list:
        """nvme offload: per parameter group, the swapper's cumulative statistics (bytes read and
        written, compute_ns vs read_wait_ns + write_wait_ns), reset to zero afterwards with
        reset=True; [] otherwise."""
        return self.optimizer_path.stats(reset=reset)

    def __getattr__(self, name: str):
        """DeepSpeed's pass-through: a public attribute the engine does not have is looked up on
        the wrapped model (``engine.generate``, ``engine.gradient_checkpointing_enable``, a
        model's own ``id``). Names starting with "_" are not passed through (zspeed's own state
        never comes from the model by accident)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        module = self.__dict__.get("_modules", {}).get("module")
        if module is not None and not name.startswith("_"):
            try:
                return getattr(module, name)
            except AttributeError:
                pass
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _describe(self) -> str:
        n = sum(self._layout.totals)
        return (f"device={self.device} dtype={self.dtype} params={n} stage={self._config.zero_stage} "
                f"offload={self._config.offload_device} pinned={self.optimizer_path.pinned} "
                f"optimizer={type(self.optimizer).__name__} batch={self.train_batch_size()} "
                f"micro={self.train_micro_batch_size_per_gpu()} gas={self._gas}")
