"""DeepSpeed's ``deepspeed.runtime.fp16.loss_scaler`` names: ``LossScaler`` (a static scale) and
``DynamicLossScaler``, zspeed's own classes (runtime/loss_scaler.py). Scripts import them to
register DeepSpeed's types with ``torch.serialization.add_safe_globals`` before resuming a
checkpoint; zspeed's own checkpoints hold no pickles (docs/CHECKPOINTS.md)."""
from __future__ import annotations

from ..loss_scaler import DynamicLossScaler, LossScaler

__all__ = ["LossScaler", "DynamicLossScaler"]
