"""create_checkpoint_engine (DeepSpeed's factory): the torch engine."""
from __future__ import annotations

from .torch_checkpoint_engine import TorchCheckpointEngine

__all__ = ["create_checkpoint_engine"]


def create_checkpoint_engine(config_params=None, groups=None, zero_stage: int = 0, has_moe_layers: bool = False,
                             optimize_dp_state: bool = False):
    """The engine for ``config_params``: zspeed has DeepSpeed's torch engine only (the other
    arguments choose among DeepSpeed's alternative writers, which zspeed does not have)."""
    return TorchCheckpointEngine(config_params)
