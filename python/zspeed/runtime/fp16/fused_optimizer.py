"""DeepSpeed's ``deepspeed.runtime.fp16.fused_optimizer``: :class:`FP16_Optimizer`, the class of
``engine.optimizer`` at ZeRO stage 0 with fp16 or bf16 around DeepSpeed's fused Adam (an
``Adam``/``AdamW`` the config names), as in DeepSpeed 0.19. It is the engine's optimizer wrapper
(runtime/engine_optimizer.py), built by ``initialize``."""
from __future__ import annotations

from ..engine_optimizer import EngineOptimizer

__all__ = ["FP16_Optimizer"]


class FP16_Optimizer(EngineOptimizer):  # noqa: N801 - DeepSpeed's name
    """``engine.optimizer`` at stage 0 with fp16/bf16 and the config's Adam (see the module docstring)."""
