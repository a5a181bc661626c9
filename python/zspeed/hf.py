"""Hugging Face ``Trainer`` / ``accelerate`` on zspeed: ``zspeed.hf.install()``.

transformers and accelerate find DeepSpeed through the installed distribution's metadata
(``importlib.metadata``) and then ``import deepspeed``. :func:`install` makes both resolve
to zspeed inside the current process, so a script changes one line, before it imports
transformers or accelerate::

    import zspeed.hf
    zspeed.hf.install()            # from here on, "deepspeed" is zspeed in this process
    from transformers import Trainer, TrainingArguments
    args = TrainingArguments(..., deepspeed="ds_config.json")  # ZeRO-2 + offload_optimizer

What it does, and only in this process:
- an import hook maps ``deepspeed`` and every ``deepspeed.X`` to ``zspeed`` and
  ``zspeed.X`` (``deepspeed.ops.adam``, ``deepspeed.utils``, ``deepspeed.comm``, ...);
  ``deepspeed.zero`` is ``zspeed.runtime.zero``, as in DeepSpeed;
- a metadata finder answers ``importlib.metadata`` for the distribution "deepspeed" with
  zspeed's metadata and the DeepSpeed API version zspeed follows
  (:data:`DEEPSPEED_API_VERSION`), which the version checks of transformers and
  accelerate compare against.

Nothing is installed or written; without install() nothing changes, so an environment
that also has the real DeepSpeed keeps using it everywhere else. install() refuses to
run after the real DeepSpeed was imported in the process (the two cannot be mixed), and
:func:`uninstall` removes both hooks.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys

from ._native import ZSpeedError
from ._version import __version__

__all__ = ["install", "uninstall", "installed", "DEEPSPEED_API_VERSION"]

# The DeepSpeed release whose API and documented behaviour zspeed follows (docs/COMPAT.md).
DEEPSPEED_API_VERSION = "0.19.8"

_ALIASES = {"deepspeed.zero": "zspeed.runtime.zero"}


def _target(fullname: str) -> str | None:
    if fullname == "deepspeed":
        return "zspeed"
    if not fullname.startswith("deepspeed."):
        return None
    for src, dst in _ALIASES.items():
        if fullname == src or fullname.startswith(src + "."):
            return dst + fullname[len(src):]
    return "zspeed" + fullname[len("deepspeed"):]


class _AliasLoader(importlib.abc.Loader):
    """Loads ``deepspeed.X`` as the already importable ``zspeed.X`` (the same module object)."""

    def __init__(self, target: str):
        self.target = target
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._spec = module.__spec__  # importlib sets __spec__ to the alias's; put it back below
        return module

    def exec_module(self, module):
        # The zspeed module was executed by its own import; keep its identity.
        if self._spec is not None:
            module.__spec__ = self._spec


class _Finder(importlib.abc.MetaPathFinder):
    """``import deepspeed...`` -> zspeed's module; ``importlib.metadata`` "deepspeed" -> zspeed."""

    def find_spec(self, fullname, path=None, target=None):
        dst = _target(fullname)
        if dst is None:
            return None
        top = sys.modules.get("deepspeed")
        if top is not None and not getattr(top, "__name__", "").startswith("zspeed"):
            return None  # the script's own deepspeed module is imported: its submodules are its own
        if fullname == "deepspeed" and _scripts_own_deepspeed() is not None:
            return None  # as Python's import rule: the script's folder comes first
        if importlib.util.find_spec(dst) is None:
            return None  # an unknown deepspeed.X: the usual ModuleNotFoundError
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(dst), is_package=True)
        return spec

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        if _package_manager_running():
            return  # pip must not believe DeepSpeed is installed (pip install / pip freeze)
        name = getattr(context, "name", None)
        if name is None or _normalize(name) == "deepspeed":
            yield _Distribution()
        return


def _package_manager_running() -> bool:
    """Whether this process is pip (``pip install``, ``pip freeze``, ``pip list``...): the
    stand-in "deepspeed" distribution is for the libraries that look for DeepSpeed, never for
    a package manager, which would skip installing DeepSpeed or write it into a requirements
    file."""
    return "pip._internal" in sys.modules


def _scripts_own_deepspeed():
    """The spec of a ``deepspeed`` module or package in the first folder of sys.path (the
    script's own folder, or the working directory for ``-c``/``-m``), or None."""
    import os
    if not sys.path:
        return None
    first = sys.path[0] or os.getcwd()
    spec = importlib.machinery.PathFinder.find_spec("deepspeed", [first])
    if spec is None or not spec.origin:
        return None
    return spec


def _normalize(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


class _Distribution(importlib.metadata.Distribution):
    """The metadata transformers and accelerate read for "deepspeed"."""

    _METADATA = (f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {DEEPSPEED_API_VERSION}\n"
                 f"Summary: zspeed {__version__} standing in for DeepSpeed (zspeed.hf.install())\n"
                 f"Author: zspeed\n")

    def read_text(self, filename):
        if filename in ("METADATA", "PKG-INFO"):
            return self._METADATA
        if filename == "top_level.txt":
            return "deepspeed\n"
        return None

    def locate_file(self, path):
        import pathlib
        return pathlib.Path(__file__).parent / str(path)


_FINDER: _Finder | None = None


def installed() -> bool:
    """Whether install() is in effect in this process."""
    return _FINDER is not None


def install() -> None:
    """Makes ``import deepspeed`` and the "deepspeed" distribution metadata resolve to zspeed
    in this process (see the module docstring). Idempotent. Raises ZSpeedError if the real
    DeepSpeed was already imported here."""
    global _FINDER
    if _FINDER is not None:
        return
    real = sys.modules.get("deepspeed")
    if real is not None and not getattr(real, "__name__", "").startswith("zspeed"):
        raise ZSpeedError("zspeed.hf.install(): the real DeepSpeed is already imported in this process; call "
                          "install() before anything imports deepspeed (before transformers or accelerate).")
    # transformers and accelerate cache "is deepspeed available" at import: they must come after.
    late = [m for m in ("transformers.integrations.deepspeed", "accelerate.utils.imports") if m in sys.modules]
    _FINDER = _Finder()
    sys.meta_path.insert(0, _FINDER)
    if late:
        import warnings
        warnings.warn(f"zspeed.hf.install() was called after {late[0]} was imported; call it before importing "
                      f"transformers or accelerate so that they see zspeed as deepspeed.", RuntimeWarning,
                      stacklevel=2)


def uninstall() -> None:
    """Removes the hooks of install() and forgets the ``deepspeed`` module aliases."""
    global _FINDER
    if _FINDER is None:
        return
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:
        pass
    _FINDER = None
    for name in [n for n in sys.modules if n == "deepspeed" or n.startswith("deepspeed.")]:
        if getattr(sys.modules[name], "__name__", "").startswith("zspeed"):
            del sys.modules[name]
