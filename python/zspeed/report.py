"""The environment report: libzspeed's native report plus what Python sees
(interpreter, numpy, torch and its CUDA devices)."""
from __future__ import annotations

import ctypes
import json
import platform
import sys

from ._native import check, lib, library_path
from ._version import __version__

_JSON = 1


def native_report(as_json: bool = False) -> str:
    """The report libzspeed itself produces (``zspeed report`` in C)."""
    flags = _JSON if as_json else 0
    need = check(lib.zs_report(None, 0, flags), "zs_report")
    buf = ctypes.create_string_buffer(need + 1)
    check(lib.zs_report(buf, need + 1, flags), "zs_report")
    return buf.value.decode("utf-8", errors="replace")


def python_info() -> dict:
    info: dict = {
        "zspeed_package": __version__,
        "library": str(library_path()),
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


def report(as_json: bool = False) -> str:
    """The full report as text or JSON."""
    py = python_info()
    if as_json:
        doc = json.loads(native_report(True))
        doc["python"] = py
        return json.dumps(doc, indent=2) + "\n"
    lines = [native_report(False).rstrip("\n"), "python:"]
    lines.append(f"  interpreter ....... {py['python']} ({py['executable']})")
    lines.append(f"  zspeed package .... {py['zspeed_package']} ({py['library']})")
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
    return "\n".join(lines) + "\n"
