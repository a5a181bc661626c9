"""DeepSpeed's ``deepspeed.ops.op_builder`` names for the ops zspeed has. DeepSpeed builds each
op (JIT or at install) against one torch, CUDA and compiler; zspeed's are in libzspeed (a C
library loaded by ctypes) or plain torch, so there is nothing to build: ``is_compatible()``
says whether the op works here and ``load()`` returns the module that has it (for
AsyncIOBuilder, one with ``aio_handle``). Builders of ops zspeed does not have are not defined
(an ImportError names them)."""
from __future__ import annotations

import importlib

__all__ = ["AsyncIOBuilder", "CPUAdamBuilder", "CPUAdagradBuilder", "CPULionBuilder", "FusedAdamBuilder",
           "FusedLionBuilder", "ALL_OPS", "compatible_ops"]


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


ALL_OPS = {b.NAME: b() for b in (AsyncIOBuilder, CPUAdamBuilder, CPUAdagradBuilder, CPULionBuilder,
                                 FusedAdamBuilder, FusedLionBuilder)}


def compatible_ops() -> dict:
    """DeepSpeed's ``deepspeed.ops.__compatible_ops__``: op name -> whether it works here."""
    return {name: b.is_compatible() for name, b in ALL_OPS.items()}
