"""DeepSpeed's ``deepspeed.moe`` names that scripts import. zspeed has no
mixture-of-experts (expert parallelism): the helpers work for models without expert
parameters, and ``moe.layer.MoE`` raises :class:`~zspeed.moe.layer.MoENotSupported`."""
from . import layer, utils  # noqa: F401

__all__ = ["layer", "utils"]
