"""DeepSpeed's ``deepspeed.runtime.bf16_optimizer``: :class:`BF16_Optimizer`, for ``isinstance``
checks.

DeepSpeed 0.19 builds it for bf16 with ZeRO stage 1 when ``data_types.grad_accum_dtype`` is fp32
(and for pipeline parallelism); zspeed's engine at stage 1 has a DeepSpeedZeroOptimizer instead
(runtime/zero/stage_1_and_2.py), whose behaviour is the same wrapper's. The class exists so that
scripts importing it run.
"""
from __future__ import annotations

from .engine_optimizer import EngineOptimizer

__all__ = ["BF16_Optimizer"]


class BF16_Optimizer(EngineOptimizer):  # noqa: N801 - DeepSpeed's name
    """DeepSpeed's bf16 optimizer wrapper class (see the module docstring)."""
