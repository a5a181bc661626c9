"""DeepSpeed's ``deepspeed.runtime.fp16.fused_optimizer``: :class:`FP16_Optimizer`, the class of
``engine.optimizer`` at ZeRO stage 0 with fp16 or bf16 around DeepSpeed's fused Adam (an
``Adam``/``AdamW`` the config names), as in DeepSpeed 0.19. It is the engine's optimizer wrapper
(runtime/engine_optimizer.py), built by ``initialize``."""
from __future__ import annotations

from ..engine_optimizer import EngineOptimizer

__all__ = ["FP16_Optimizer"]


class FP16_Optimizer(EngineOptimizer):  # noqa: N801 - DeepSpeed's name
    """``engine.optimizer`` at stage 0 with fp16/bf16 and the config's Adam (see the module docstring)."""

    @property
    def fp32_groups_flat(self) -> list:
        """DeepSpeed's name for the fp32 masters, read by checkpoint checks: copies, taken when read, of the fp32 master weights this rank holds
        per parameter group, flat (zspeed's partitioning, so the layout is zspeed's, not DeepSpeed's;
        writing into them does not change the masters: use the tensor-fragment API for that)."""
        return self._fp32_flat()
