"""Hooks the engine puts on the user's modules, and what becomes of them when the module is
copied (``copy.deepcopy``, an EMA copy) or pickled (``torch.save(engine.module)``).

The hooks refer back to the engine weakly, and a copy of the module is not trained by the
engine, so a copied hook turns into :class:`DetachedHook`, which does nothing: the copy is
an ordinary module. Before the copy is made, the engine completes the optimizer step under
way (a step running in the background would otherwise be copied half done): see
``guard_copies``.
"""
from __future__ import annotations

import copyreg
import weakref

from .._native import ZSpeedError

__all__ = ["DetachedHook", "EngineHook", "guard_copies", "ZeRO3CopyError", "ZERO3_COPY_MESSAGE"]

_GUARD_KEYS = ("__deepcopy__", "__reduce_ex__")


class ZeRO3CopyError(ZSpeedError, TypeError):
    """copy.deepcopy / pickling of a module whose parameters ZeRO-3 partitioned."""


ZERO3_COPY_MESSAGE = (
    "the module's parameters are partitioned by ZeRO stage 3 (each rank holds only its shards), so it cannot "
    "be copied or pickled whole (copy.deepcopy, torch.save of the module). For a whole copy of the weights call "
    "engine._zero3_consolidated_16bit_state_dict() on every rank (rank 0 gets the state_dict) and load it into a "
    "model built without zspeed, or use engine.save_16bit_model() (with "
    "zero_optimization.stage3_gather_16bit_weights_on_model_save) or zspeed.zero.GatheredParameters; for the "
    "training state use engine.save_checkpoint().")


class DetachedHook:
    """What an engine hook becomes in a copied or unpickled module: a no-op."""

    def __call__(self, *args, **kwargs):
        return None


class EngineHook:
    """Base of the engine's hook objects: copied and pickled as DetachedHook."""

    def __deepcopy__(self, memo):
        return DetachedHook()

    def __reduce__(self):
        return (DetachedHook, ())


def guard_copies(module, before) -> None:
    """``copy.deepcopy(module)`` and pickling it (torch.save) call ``before()`` first (which may
    refuse by raising), then copy the module as usual. The two methods live in the instance's
    __dict__, where deepcopy and pickle look first; the copy does not carry them."""
    ref = weakref.ref(module)

    def state():
        m = ref()
        return m, {k: v for k, v in m.__dict__.items() if k not in _GUARD_KEYS}

    def deepcopy_(memo):
        import copy
        before()
        m, st = state()
        new = type(m).__new__(type(m))
        memo[id(m)] = new
        new.__setstate__(copy.deepcopy(st, memo))
        return new

    def reduce_ex(protocol):
        before()
        m, st = state()
        return (copyreg.__newobj__, (type(m),), st)

    module.__dict__["__deepcopy__"] = deepcopy_
    module.__dict__["__reduce_ex__"] = reduce_ex
