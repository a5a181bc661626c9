"""The environment report: libzspeed's native report plus what Python sees
(interpreter, numpy, torch and its CUDA devices), and the problems that make
``zspeed report`` exit with status 1: choices the environment forces that
the library refuses (see zs_report_problems), and a library this package
cannot use (missing, or of another version; the rest is still reported)."""
from __future__ import annotations

import ctypes
import json
import platform
import sys

from . import _native
from ._native import ZSpeedError
from ._signatures.common import ReportFlags


def _native_text(lib: ctypes.CDLL, as_json: bool) -> str:
    flags = ReportFlags.JSON if as_json else 0
    need = _native.check(lib.zs_report(None, 0, flags), "zs_report")
    buf = ctypes.create_string_buffer(need + 1)
    _native.check(lib.zs_report(buf, need + 1, flags), "zs_report")
    return buf.value.decode("utf-8", errors="replace")


def native_report(as_json: bool = False) -> str:
    """The report libzspeed itself produces (``zspeed report`` in C)."""
    return _native_text(_native.load(), as_json)


def _native_problems(lib: ctypes.CDLL) -> list[str]:
    """zs_report_problems, one string per problem ([] for a library older
    than the function)."""
    if getattr(lib, "zs_report_problems", None) is None:
        return []
    buf = ctypes.create_string_buffer(4096)
    n = lib.zs_report_problems(buf, len(buf))
    return buf.value.decode("utf-8", errors="replace").split("\n") if n > 0 else []


def python_info(library: str | None = None) -> dict:
    info: dict = {
        "zspeed_package": _native.__version__,
        "library": library if library is not None else str(_native.library_path()),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "executable": sys.executable,
    }
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except ImportError:
        info["numpy"] = None
    try:
        import torch
    except ImportError as e:
        info["torch"] = None
        info["torch_error"] = str(e)
    else:
        t: dict = {"version": torch.__version__,
                   "cuda_build": torch.version.cuda,
                   "cuda_available": bool(torch.cuda.is_available()),
                   "devices": []}
        if t["cuda_available"]:
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                t["devices"].append({"index": i, "name": p.name,
                                     "memory_bytes": int(p.total_memory)})
        info["torch"] = t
    return info


def build(as_json: bool = False) -> tuple[str, list[str]]:
    """The full report as text or JSON, and its problems (empty when the
    environment is usable as configured)."""
    try:
        lib, refused = _native.load_for_report()
    except ZSpeedError as e:
        lib, refused = None, str(e)
    native = _native_text(lib, as_json) if lib is not None else None
    problems = ([refused] if refused else []) + (_native_problems(lib) if lib else [])
    py = python_info(str(_native._path) if _native._path else "not found")
    if as_json:
        doc = json.loads(native) if native else {"version": None}
        doc["python"] = py
        doc["library_error"] = refused
        doc["problems"] = problems
        return json.dumps(doc, indent=2) + "\n", problems
    lines = [native.rstrip("\n")] if native else [
        "zspeed report", "-" * 50, "library ............. not loaded (see python: below)"]
    lines.append("python:")
    lines.append(f"  interpreter ....... {py['python']} ({py['executable']})")
    lines.append(f"  zspeed package .... {py['zspeed_package']} ({py['library']})")
    if refused:
        lines.append(f"  library ........... ERROR: {refused}")
    lines.append(f"  numpy ............. {py['numpy'] or 'not installed'}")
    t = py["torch"]
    if t is None:
        lines.append(f"  torch ............. not installed ({py.get('torch_error', '')})")
    else:
        cuda = (f"CUDA {t['cuda_build']}" if t["cuda_build"] else "CPU-only build")
        lines.append(f"  torch ............. {t['version']} ({cuda}; "
                     f"cuda available: {'yes' if t['cuda_available'] else 'no'})")
        for d in t["devices"]:
            lines.append(f"    cuda:{d['index']} ........ {d['name']}, "
                         f"{d['memory_bytes'] / 2**30:.1f} GiB")
    return "\n".join(lines) + "\n", problems


def report(as_json: bool = False) -> str:
    """The full report as text or JSON."""
    return build(as_json)[0]
