"""The class of ``engine.optimizer`` where DeepSpeed wraps the basic optimizer: the one DeepSpeed
0.19 builds for the config (its engine's _do_optimizer_sanity_check), so that ``isinstance``
checks against DeepSpeed's classes hold. Each is an EngineOptimizer (engine_optimizer.py) with
the same behaviour:

- ZeRO stages 1-2: DeepSpeedZeroOptimizer (runtime/zero/stage_1_and_2.py);
- stage 3: DeepSpeedZeroOptimizer_Stage3 (runtime/zero/stage3.py);
- stage 0 with fp16 or bf16: FP16_Optimizer around DeepSpeed's fused Adam (an Adam/AdamW the
  config names, without torch_adam), FP16_UnfusedOptimizer around anything else (a client
  optimizer, torch_adam, other types) (runtime/fp16/).
"""
from __future__ import annotations

from .fp16.fused_optimizer import FP16_Optimizer
from .fp16.unfused_optimizer import FP16_UnfusedOptimizer
from .zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from .zero.stage_1_and_2 import DeepSpeedZeroOptimizer

__all__ = ["wrapper_class"]


def _stage0(config, client) -> type:
    fused = client is None and config.optimizer_name in ("Adam", "AdamW") and \
        not config.torch_adam
    return FP16_Optimizer if fused else FP16_UnfusedOptimizer


# ZeRO stage -> (config, client optimizer) -> the class
_BY_STAGE = {0: _stage0, 1: lambda config, client: DeepSpeedZeroOptimizer,
             2: lambda config, client: DeepSpeedZeroOptimizer,
             3: lambda config, client: DeepSpeedZeroOptimizer_Stage3}


def wrapper_class(config, client) -> type:
    """The class of ``engine.optimizer`` for ``config`` (where engine_optimizer.needs_wrapper says
    DeepSpeed wraps) and the client optimizer (None: the config's)."""
    return _BY_STAGE[config.zero_stage](config, client)
