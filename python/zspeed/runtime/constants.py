"""DeepSpeed's ``deepspeed.runtime.constants`` for the config keys zspeed reads: for each
top-level key its name (``GRADIENT_CLIPPING = "gradient_clipping"``) and default
(``GRADIENT_CLIPPING_DEFAULT = 1.0``), and each section's name (``ZERO_OPTIMIZATION``). The values
come from zspeed's config schema (runtime/config.py), so they are zspeed's defaults, which are
DeepSpeed's for every key DeepSpeed has (docs/CONFIG.md lists them)."""
from __future__ import annotations

from .config import SCHEMA as _SCHEMA


def _build() -> dict:
    out = {}
    for key, spec in _SCHEMA[""].keys.items():
        out[key.upper()] = key
        out[key.upper() + "_DEFAULT"] = spec.default
    for section in _SCHEMA:
        if section and "." not in section:
            out[section.upper()] = section
    return out


globals().update(_build())
__all__ = sorted(_build())
