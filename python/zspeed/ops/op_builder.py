"""DeepSpeed's ``deepspeed.ops.op_builder`` names for the ops zspeed has. DeepSpeed builds each
op (JIT or at install) against one torch, CUDA and compiler; zspeed's are in libzspeed (a C
library loaded by ctypes) or plain torch, so there is nothing to build: ``is_compatible()``
says whether the op works here and ``load()`` returns the module that has it (for
AsyncIOBuilder, one with ``aio_handle``). DeepSpeed's builders of ops zspeed does not have
(``FusedLambBuilder``, ``TransformerBuilder``, ...) exist as DeepSpeed defines each on machines
that cannot build it: ``is_compatible()`` is False, so scripts and test suites that check
``__compatible_ops__`` skip them, and ``load()`` raises an error that names the op."""
from __future__ import annotations

import importlib

__all__ = ["AsyncIOBuilder", "CPUAdamBuilder", "CPUAdagradBuilder", "CPULionBuilder", "FusedAdamBuilder",
           "FusedLionBuilder", "ALL_OPS", "compatible_ops"]  # + the absent ops' builders, below


def _native() -> bool:
    try:
        from .. import _native
        _native.load()
        return True
    except Exception:  # ZSpeedError: libzspeed missing or unloadable (its message says why)
        return False


class OpBuilder:
    """One op: ``NAME`` (DeepSpeed's), the module that holds it, whether it needs libzspeed."""
    NAME = ""
    BUILD_VAR = ""
    _module = ""
    _needs_native = True

    def absolute_name(self) -> str:
        return self._module

    def is_compatible(self, verbose: bool = False) -> bool:
        del verbose
        return _native() if self._needs_native else True

    def load(self, verbose: bool = True):
        """The module with the op (no build step)."""
        del verbose
        if not self.is_compatible():
            from .._native import load
            load()  # raises ZSpeedError with the reason libzspeed does not load
        return importlib.import_module(self._module)

    def builder(self):
        raise NotImplementedError(f"{type(self).__name__}: zspeed's ops are prebuilt in libzspeed; there is no "
                                  f"extension to build (use load()).")


class AsyncIOBuilder(OpBuilder):
    NAME, BUILD_VAR, _module = "async_io", "DS_BUILD_AIO", "zspeed.ops.aio"


class CPUAdamBuilder(OpBuilder):
    NAME, BUILD_VAR, _module = "cpu_adam", "DS_BUILD_CPU_ADAM", "zspeed.ops.adam"


class CPUAdagradBuilder(OpBuilder):
    NAME, BUILD_VAR, _module = "cpu_adagrad", "DS_BUILD_CPU_ADAGRAD", "zspeed.ops.adagrad"


class CPULionBuilder(OpBuilder):
    NAME, BUILD_VAR, _module = "cpu_lion", "DS_BUILD_CPU_LION", "zspeed.ops.lion"


class FusedAdamBuilder(OpBuilder):  # plain torch on any device
    NAME, BUILD_VAR, _module, _needs_native = "fused_adam", "DS_BUILD_FUSED_ADAM", "zspeed.ops.adam", False


class FusedLionBuilder(OpBuilder):
    NAME, BUILD_VAR, _module, _needs_native = "fused_lion", "DS_BUILD_FUSED_LION", "zspeed.ops.lion", False


class _AbsentOpBuilder(OpBuilder):
    """An op of DeepSpeed's that zspeed does not have: never compatible, load() says so."""

    def is_compatible(self, verbose: bool = False) -> bool:
        del verbose
        return False

    def load(self, verbose: bool = True):
        del verbose
        raise RuntimeError(f"DeepSpeed's op {self.NAME!r} ({type(self).__name__}) does not exist in zspeed, which "
                           f"has the optimizer and I/O ops only (see ops.__compatible_ops__); use the plain "
                           f"torch module or optimizer it accelerates instead.")


# DeepSpeed 0.19's op names and build variables, for the ops zspeed does not have
_ABSENT = (("DeepCompileBuilder", "dc", "DS_BUILD_DEEP_COMPILE"),
           ("EvoformerAttnBuilder", "evoformer_attn", "DS_BUILD_EVOFORMER_ATTN"),
           ("FPQuantizerBuilder", "fp_quantizer", "DS_BUILD_FP_QUANTIZER"),
           ("FusedLambBuilder", "fused_lamb", "DS_BUILD_FUSED_LAMB"),
           ("GDSBuilder", "gds", "DS_BUILD_GDS"),
           ("InferenceCoreBuilder", "inference_core_ops", "DS_BUILD_INFERENCE_CORE_OPS"),
           ("InferenceCutlassBuilder", "cutlass_ops", "DS_BUILD_CUTLASS_OPS"),
           ("PinMemoryBuilder", "pin_memory", "DS_BUILD_PIN_MEMORY"),
           ("QuantizerBuilder", "quantizer", "DS_BUILD_QUANTIZER"),
           ("RaggedOpsBuilder", "ragged_device_ops", "DS_BUILD_RAGGED_DEVICE_OPS"),
           ("RaggedUtilsBuilder", "ragged_ops", "DS_BUILD_RAGGED_OPS"),
           ("RandomLTDBuilder", "random_ltd", "DS_BUILD_RANDOM_LTD"),
           ("SparseAttnBuilder", "sparse_attn", "DS_BUILD_SPARSE_ATTN"),
           ("SpatialInferenceBuilder", "spatial_inference", "DS_BUILD_SPATIAL_INFERENCE"),
           ("StochasticTransformerBuilder", "stochastic_transformer", "DS_BUILD_STOCHASTIC_TRANSFORMER"),
           ("TransformerBuilder", "transformer", "DS_BUILD_TRANSFORMER"),
           ("InferenceBuilder", "transformer_inference", "DS_BUILD_TRANSFORMER_INFERENCE"),
           ("UtilsBuilder", "utils", "DS_BUILD_UTILS"))
for _cls, _name, _var in _ABSENT:
    globals()[_cls] = type(_cls, (_AbsentOpBuilder,), {"NAME": _name, "BUILD_VAR": _var, "__module__": __name__})
    __all__.append(_cls)
del _cls, _name, _var

ALL_OPS = {b.NAME: b() for b in (AsyncIOBuilder, CPUAdamBuilder, CPUAdagradBuilder, CPULionBuilder,
                                 FusedAdamBuilder, FusedLionBuilder)}
ALL_OPS.update((name, globals()[cls]()) for cls, name, _ in _ABSENT)


def compatible_ops() -> dict:
    """DeepSpeed's ``deepspeed.ops.__compatible_ops__``: op name -> whether it works here."""
    return {name: b.is_compatible() for name, b in ALL_OPS.items()}
