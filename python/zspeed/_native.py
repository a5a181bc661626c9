"""Finds, loads and declares libzspeed through ctypes.

zspeed ships no CPython extension: the C library is loaded here with ctypes,
so one wheel serves every Python 3 version. Every exported function gets its
argtypes/restype from the tables in ``zspeed._signatures`` (one module per
area), the library's version is checked against the package's, and negative
return codes become :class:`NativeError` exceptions that carry the C error
name, its description and the library's detailed message.

Search order for the library:
  1. the ``ZSPEED_LIBRARY`` environment variable (a path to the file);
  2. inside the installed package (where ``pip install .`` puts it);
  3. a development build tree: ``<repo>/build`` next to ``python/``.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import pkgutil
import sys
import threading
from pathlib import Path

from ._version import __version__

__all__ = ["lib", "load", "load_for_report", "check", "ZSpeedError", "NativeError",
           "library_path", "errcode"]


class ZSpeedError(Exception):
    """Base class of every error zspeed raises on purpose."""


class NativeError(ZSpeedError):
    """A libzspeed call failed.

    Attributes: ``code`` (negative int), ``name`` (e.g. ``"ZS_ENOSPC"``),
    ``strerror`` (short description) and ``detail`` (what went wrong and how
    to fix it, from ``zs_last_error``)."""

    def __init__(self, code: int, name: str, strerror: str, detail: str,
                 func: str = ""):
        self.code, self.name, self.strerror, self.detail = code, name, strerror, detail
        self.func = func
        where = f"{func}: " if func else ""
        text = detail if detail else strerror
        super().__init__(f"{where}{text} [{name}]")


def _library_names() -> list[str]:
    if sys.platform == "win32":
        return ["zspeed.dll", "libzspeed.dll"]
    if sys.platform == "darwin":
        return ["libzspeed.dylib"]
    return ["libzspeed.so"]


def _candidates() -> list[Path]:
    env = os.environ.get("ZSPEED_LIBRARY")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    out = [here / n for n in _library_names()]
    repo_build = here.parent.parent / "build"
    out += [repo_build / n for n in _library_names()]
    return out


def _origin(cand: Path) -> str:
    """'ZSPEED_LIBRARY=<path> ' when the candidate came from the environment."""
    env = os.environ.get("ZSPEED_LIBRARY")
    return f"ZSPEED_LIBRARY={env!r} " if env and Path(env) == cand else f"{cand} "


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: Path | None = None


def _declare(lib: ctypes.CDLL) -> None:
    from . import _signatures
    for mod in pkgutil.iter_modules(_signatures.__path__):
        table = importlib.import_module(f"{_signatures.__name__}.{mod.name}").SIGNATURES
        for name, (restype, argtypes) in table.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise ZSpeedError(
                    f"{_path}: the library lacks {name}(); it is older than this "
                    f"Python package ({__version__}). Rebuild it (pip install .) or "
                    f"point ZSPEED_LIBRARY at a matching build.") from None
            fn.restype = restype
            fn.argtypes = argtypes


def _open() -> tuple[Path, ctypes.CDLL]:
    """The first candidate library that opens, with zs_version declared."""
    tried = []
    for cand in _candidates():
        if not cand.is_file():
            tried.append(f"{cand} ({'a folder' if cand.is_dir() else 'missing'})")
            continue
        try:
            if sys.platform == "win32":
                os.add_dll_directory(str(cand.parent))
            lib = ctypes.CDLL(str(cand))
        except OSError as e:
            tried.append(f"{cand} ({e})")
            continue
        try:
            version_fn = lib.zs_version
        except AttributeError:
            raise ZSpeedError(
                f"{_origin(cand)}is not libzspeed: it has no zs_version() "
                f"function. Point ZSPEED_LIBRARY at libzspeed.so / "
                f"libzspeed.dylib / zspeed.dll (a zspeed build), or unset "
                f"it to use the library inside the package.") from None
        version_fn.restype = ctypes.c_uint
        version_fn.argtypes = []
        return cand, lib
    if os.environ.get("ZSPEED_LIBRARY"):
        raise ZSpeedError(
            f"cannot find libzspeed at ZSPEED_LIBRARY={os.environ['ZSPEED_LIBRARY']!r}: "
            + "; ".join(tried) + ". Point it at the library file (libzspeed.so / "
            "libzspeed.dylib / zspeed.dll), or unset it to use the library inside "
            "the package.")
    raise ZSpeedError(
        "cannot find libzspeed; tried: " + "; ".join(tried) +
        ". Install the package with 'pip install .' (it builds the library), "
        "or set ZSPEED_LIBRARY to the path of libzspeed.so / zspeed.dll.")


def _version_error(path: Path, lib: ctypes.CDLL) -> str | None:
    """Why this package refuses the library (None if it does not): the two
    must share major.minor."""
    have = lib.zs_version()
    want = tuple(int(x) for x in __version__.split(".")[:3])
    have_t = (have >> 16, (have >> 8) & 0xFF, have & 0xFF)
    if have_t[:2] == want[:2]:
        return None
    return (f"{_origin(path)}is libzspeed {'.'.join(map(str, have_t))}, but this "
            f"Python package is zspeed {__version__}; they must share "
            f"major.minor. Reinstall with 'pip install .' or set "
            f"ZSPEED_LIBRARY to a matching build.")


def load() -> ctypes.CDLL:
    """Loads (once) and returns the declared library."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        _path, lib = _open()
        err = _version_error(_path, lib)
        if err:
            raise ZSpeedError(err)
        _declare(lib)
        _lib = lib
        return lib


def load_for_report() -> tuple[ctypes.CDLL, str | None]:
    """The library load() uses and None, or, when load() refuses it for its
    version, that library anyway and the reason. The report describes a
    refused library too; on such a one only the report's functions are
    declared (zs_version_string, zs_report and, if it has it,
    zs_report_problems), whose signatures every version shares. Raises
    ZSpeedError when no library can be opened at all."""
    try:
        return load(), None
    except ZSpeedError:
        path, lib = _open()
        err = _version_error(path, lib)
        if err is None:  # refused for a missing function: not describable
            raise
    from ._signatures.common import SIGNATURES
    for name in ("zs_version_string", "zs_report", "zs_report_problems"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = SIGNATURES[name]
    return lib, err


def library_path() -> Path:
    load()
    assert _path is not None
    return _path


def errcode(name: str) -> int:
    """The numeric value of a ZS_E* code by name (``errcode("ZS_ENOSPC")``)."""
    lib = load()
    code = -1
    while True:
        n = lib.zs_err_name(code).decode()
        if n == name:
            return code
        if n == "ZS_EUNKNOWN":
            if name == n:
                return code
            raise KeyError(name)
        code -= 1


def check(rc: int, func: str = "") -> int:
    """Returns rc if >= 0; raises NativeError for a negative ZS_E* code."""
    if rc >= 0:
        return rc
    lib = load()
    raise NativeError(rc, lib.zs_err_name(rc).decode(),
                      lib.zs_strerror(rc).decode(),
                      lib.zs_last_error().decode(errors="replace"), func)


class _LazyLib:
    """``zspeed._native.lib.zs_x(...)`` loads the library on first use."""

    def __getattr__(self, name: str):
        return getattr(load(), name)


lib = _LazyLib()
