"""DeepSpeed's ``deepspeed.zero`` (also ``deepspeed.runtime.zero``) names that scripts use
with ZeRO stages 0-2, and clear refusals for ZeRO-3's parameter partitioning, which
zspeed does not have yet.

- :class:`GatheredParameters`: with stages 0-2 every rank holds every parameter whole,
  so the context has nothing to gather and only runs its body (DeepSpeed does the
  same for parameters that are not ZeRO-3 partitioned); ``modifier_rank`` edits then
  need no broadcast when there is one rank, and with several ranks zspeed broadcasts
  the modified parameters from ``modifier_rank`` at exit, as DeepSpeed does.
- :class:`Init` (construct a model partitioned across ranks) raises
  :class:`ZeRO3NotSupported`.
- :mod:`offload_config`: DeepSpeed's enums of offload devices and states.
"""
from __future__ import annotations

from ..._native import ZSpeedError
from . import offload_config  # noqa: F401

__all__ = ["Init", "GatheredParameters", "ZeRO3NotSupported", "offload_config", "register_external_parameter"]


class ZeRO3NotSupported(ZSpeedError, NotImplementedError):
    """ZeRO stage 3 (parameters partitioned across ranks) is not part of zspeed yet."""


_ZERO3 = ("ZeRO stage 3 (parameters partitioned across ranks, deepspeed.zero.Init) is not supported by zspeed "
          "yet. Build the model normally and use zero_optimization.stage 2 with offload_optimizer "
          "(device cpu or nvme): the optimizer state, the largest part of training memory, then lives "
          "off the GPU.")


class Init:
    """DeepSpeed's ``deepspeed.zero.Init``: raises :class:`ZeRO3NotSupported`."""

    def __init__(self, *args, enabled: bool = True, **kwargs):
        # DeepSpeed's Init(enabled=False) constructs models normally; that works here too.
        self.enabled = enabled
        if enabled:
            raise ZeRO3NotSupported(_ZERO3)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class GatheredParameters:
    """DeepSpeed's context for reading or editing ZeRO-3 partitioned parameters. Under zspeed
    (stages 0-2) parameters are never partitioned: the body runs on the parameters as they are.
    With several ranks and ``modifier_rank`` set, the parameters are broadcast from that rank
    when the context exits, so an edit made on one rank reaches all of them."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled: bool = True):
        import torch
        if torch.is_tensor(params):
            params = [params]
        self.params = [p for p in (params or []) if p is not None]
        self.modifier_rank = modifier_rank
        self.enabled = enabled

    def __enter__(self):
        return None

    def __exit__(self, typ, exc, tb):
        if exc is not None or not self.enabled or self.modifier_rank is None:
            return False
        import torch
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            with torch.no_grad():
                for p in self.params:
                    if dist.get_backend() == "nccl" or p.device.type == "cpu":
                        dist.broadcast(p.data, src=self.modifier_rank)
                    else:
                        buf = p.data.cpu()
                        dist.broadcast(buf, src=self.modifier_rank)
                        p.data.copy_(buf)
        return False


def register_external_parameter(module, parameter) -> None:
    """DeepSpeed's ZeRO-3 hint that ``module`` uses a parameter it does not own; nothing to do
    without parameter partitioning."""
    del module, parameter
