"""DeepSpeed's ``deepspeed.runtime.fp16.unfused_optimizer``: :class:`FP16_UnfusedOptimizer`, the class
of ``engine.optimizer`` at ZeRO stage 0 with fp16 or bf16 around any optimizer but DeepSpeed's
fused Adam (a client optimizer, ``torch_adam``, other optimizer types), as in DeepSpeed 0.19. It
is the engine's optimizer wrapper (runtime/engine_optimizer.py), built by ``initialize``."""
from __future__ import annotations

from ..engine_optimizer import EngineOptimizer

__all__ = ["FP16_UnfusedOptimizer"]


class FP16_UnfusedOptimizer(EngineOptimizer):  # noqa: N801 - DeepSpeed's name
    """``engine.optimizer`` at stage 0 with fp16/bf16 around another optimizer (see the module docstring)."""

    @property
    def fp32_groups(self) -> list:
        """DeepSpeed's name for the fp32 masters: per parameter group, a copy (taken when read) of
        each parameter's fp32 master weight; writing into them does not change the masters (use the
        tensor-fragment API for that)."""
        return self._fp32_rows()
