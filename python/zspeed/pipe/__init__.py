"""DeepSpeed's ``deepspeed.pipe`` names, importable so that scripts whose pipeline path is
optional (``from deepspeed.pipe import PipelineModule`` at the top, used only with a
flag) run their ordinary data-parallel path under zspeed.

zspeed has no pipeline parallelism: constructing a :class:`PipelineModule` raises
:class:`PipelineNotSupported`. :class:`LayerSpec` and :class:`TiedLayerSpec` are plain
descriptions of a layer and can be built (``LayerSpec.build()`` creates the module)."""
from __future__ import annotations

from .._native import ZSpeedError

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "PipelineNotSupported"]


class PipelineNotSupported(ZSpeedError, NotImplementedError):
    """DeepSpeed's pipeline parallelism (PipelineModule, engine.train_batch) is not part of zspeed."""


class LayerSpec:
    """A layer described by its class and constructor arguments, built later with build()."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not callable(typename):
            raise TypeError(f"LayerSpec needs a module class or another callable, got {typename!r}")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self, log: bool = False):
        del log
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self) -> str:
        name = getattr(self.typename, "__name__", repr(self.typename))
        return f"LayerSpec({name}, args={self.module_args!r}, kwargs={self.module_kwargs!r})"


class TiedLayerSpec(LayerSpec):
    """A LayerSpec whose parameters are shared with the other layers of the same ``key``."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr=("weight",),
                 **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else \
            list(tied_weight_attr)


class PipelineModule:
    """DeepSpeed's pipeline-parallel model container; constructing one raises
    :class:`PipelineNotSupported`."""

    def __init__(self, *args, **kwargs):
        raise PipelineNotSupported(
            "deepspeed.pipe.PipelineModule (pipeline parallelism) is a DeepSpeed feature zspeed does not "
            "have. Train the model as one torch.nn.Module (the script's data-parallel path: "
            "engine(batch), engine.backward(loss), engine.step()), with ZeRO stage 1-2 and optimizer "
            "offload to fit it in memory.")
