"""DeepSpeed's offload enums (``deepspeed.runtime.zero.offload_config``): the devices of
``offload_optimizer`` / ``offload_param`` and the states of ``engine.offload_states``."""
from __future__ import annotations

from enum import Enum

__all__ = ["OffloadDeviceEnum", "OffloadStateTypeEnum"]


class OffloadDeviceEnum(str, Enum):
    """Where offloaded state lives: none (on the device), cpu or nvme."""
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, Enum):
    """The kinds of state DeepSpeed's engine.offload_states() can move (a ZeRO-3 feature)."""
    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"
