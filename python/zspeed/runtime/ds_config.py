"""DeepSpeed's ``deepspeed.runtime.config.DeepSpeedConfig`` (reached there: config.py hands it out)."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from .config import ZSpeedConfig, _derive_batch, load_json_config
from .errors import ConfigError
from .zero.config import get_zero_config

__all__ = ["DeepSpeedConfig"]


class DeepSpeedConfig(ZSpeedConfig):
    """DeepSpeed's ``deepspeed.runtime.config.DeepSpeedConfig``: a whole config (a dict, a path to a
    JSON file, or that JSON base64-encoded, as DeepSpeed takes it) validated by zspeed's schema,
    with DeepSpeed's attribute names: train_batch_size, train_micro_batch_size_per_gpu,
    gradient_accumulation_steps (derived for the data-parallel world size: ``mpu``'s, else the
    process group's, else WORLD_SIZE's), gradient_allreduce_op, zero_config (a
    DeepSpeedZeroConfig), zero_optimization_stage, zero_enabled, fp16_enabled,
    bfloat16_enabled, gradient_clipping, steps_per_print, wall_clock_breakdown, log_level,
    monitor_config (a zspeed.monitor DeepSpeedMonitorConfig) and
    ``_param_dict`` (the dict as given). Invalid configs raise ConfigError (a ValueError) naming
    the key, as zspeed.initialize does; batch sizes that do not add up raise an AssertionError
    (DeepSpeed asserts there)."""

    def __init__(self, config, mpu=None, mesh_device=None):
        if isinstance(config, (str, os.PathLike)):
            path = Path(config)
            if path.exists() or not isinstance(config, str):
                config = load_json_config(path)
            else:
                config = _base64_config(config)
        if not isinstance(config, dict):
            raise ConfigError(f"DeepSpeedConfig needs a dict, a JSON file's path or base64-encoded JSON, "
                              f"got {type(config).__name__}.")
        ws = None
        if mpu is not None:
            ws = int(mpu.get_data_parallel_world_size())
        else:
            try:
                import torch.distributed as dist
                if dist.is_available() and dist.is_initialized():
                    ws = dist.get_world_size()
            except ImportError:
                pass
        super().__init__(config, world_size=ws)
        self._param_dict = copy.deepcopy(config)
        self.gradient_allreduce_op = str(self.top["gradient_allreduce_op"]).lower()
        self.zero_config = get_zero_config(config)
        self.zero_optimization_stage = self.zero_stage
        self.zero_enabled = self.zero_stage > 0
        self.bfloat16_enabled = self.bf16_enabled
        # (steps_per_print, wall_clock_breakdown, dump_state, dataloader_drop_last: ZSpeedConfig's properties)
        from ..monitor.config import DeepSpeedMonitorConfig
        self.monitor_config = DeepSpeedMonitorConfig(**self.monitor)

    def _configure_train_batch_size(self) -> None:
        """DeepSpeed's: the three batch attributes re-derived from those set (None: derive it) for
        the world size, then checked (AssertionError when they do not add up)."""
        self.train_batch_size, self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps = \
            _derive_batch(self.train_batch_size, self.train_micro_batch_size_per_gpu,
                          self.gradient_accumulation_steps, self.world_size, set())


def _base64_config(text: str) -> dict:
    import base64
    import binascii
    try:
        return json.loads(base64.urlsafe_b64decode(text.encode("ascii")).decode("utf-8"))
    except (binascii.Error, UnicodeError, ValueError):
        raise ConfigError(f"DeepSpeedConfig({text[:60]!r}): no such file, and not a base64-encoded JSON "
                          f"config either; pass a dict or the path of a JSON file.") from None
