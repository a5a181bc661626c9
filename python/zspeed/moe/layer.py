"""``deepspeed.moe.layer.MoE``: not available in zspeed (see :class:`MoENotSupported`)."""
from __future__ import annotations

from .._native import ZSpeedError

__all__ = ["MoE", "MoENotSupported"]


class MoENotSupported(ZSpeedError, NotImplementedError):
    """DeepSpeed's mixture-of-experts layers (expert parallelism) are not part of zspeed."""


class MoE:
    """DeepSpeed's MoE layer; constructing one raises :class:`MoENotSupported`, because zspeed
    does not implement expert parallelism or its all-to-all routing."""

    def __init__(self, *args, **kwargs):
        raise MoENotSupported(
            "deepspeed.moe.layer.MoE (mixture of experts with expert parallelism) is a DeepSpeed feature "
            "zspeed does not have. Train the model without MoE layers (e.g. the script's --moe off), or "
            "implement the experts as ordinary torch modules: zspeed then trains them like any parameter.")
