"""Reading a DeepSpeed config file: UTF-8 JSON, or hjson as DeepSpeed reads it when the ``hjson``
package is installed, strictly: a key given twice, NaN or Infinity, and an integer longer than
Python converts are each refused with the key that holds it (JSON would keep the last duplicate
silently; an error message could not print the integer)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from .errors import ConfigError

__all__ = ["load_json_config", "check_huge_ints"]


class _HugeInt:
    """An integer literal of a config file with more digits than int() converts (Python's
    int_max_str_digits limit, 4300 by default): kept as its length, reported with its key."""

    def __init__(self, digits: int):
        self.digits = digits


def _parse_int(text: str):
    try:
        return int(text)
    except ValueError:
        return _HugeInt(len(text.lstrip("+-")))


def _int_size(v: int) -> str:
    return f"about {int(v.bit_length() * math.log10(2)) + 1} digits"


def _show(value) -> str:
    """repr() for an error message; an integer too long to print shows its size instead."""
    try:
        return repr(value)
    except ValueError:
        return f"<an integer of {_int_size(value)}>"


def check_huge_ints(value, where: str = "") -> None:
    """Refuses integers longer than Python prints or parses (sys.get_int_max_str_digits()),
    naming their key: every other error message would fail to print them, and no config value
    is that large."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    todo = [("", value)]
    while todo:
        key, v = todo.pop()
        if isinstance(v, dict):
            todo.extend((f"{key}.{k}" if key else str(k), x) for k, x in v.items())
            continue
        if isinstance(v, (list, tuple)):
            todo.extend((f"{key}[{i}]", x) for i, x in enumerate(v))
            continue
        if isinstance(v, _HugeInt):
            size = f"{v.digits} digits"
        elif limit and isinstance(v, int) and v.bit_length() > 3 * limit and _show(v).startswith("<"):
            size = _int_size(v)  # 3 bits per digit is below log2(10): every unprintable integer is tried
        else:
            continue
        what = f"config key '{key}'" if key else "the config"
        raise ConfigError(f"{where}{what} is an integer of {size}, more than Python converts ({limit} digits: "
                          f"sys.get_int_max_str_digits()); no config value is that large. Write the number you "
                          f"meant.")


def _no_duplicates(pairs: list) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ConfigError(f"the key '{k}' appears twice in one object ({out[k]!r}, then {v!r}); "
                              f"JSON would silently keep the last. Keep one.")
        out[k] = v
    return out


def _no_constant(name: str):
    raise ConfigError(f"'{name}' is not a number a config may hold (it is not standard JSON); "
                      f"write a finite number.")


def load_json_config(path: Path) -> dict:
    """Reads a JSON config file strictly: UTF-8, no duplicate keys, no NaN/Infinity."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the DeepSpeed config file '{path}': {e.strerror or e}. "
                          f"Check the path.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"the DeepSpeed config file '{path}' is not UTF-8 text (byte {e.start}: "
                          f"{raw[e.start:e.start + 1]!r}); is it the right file?") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                          parse_int=_parse_int)
    except ConfigError as e:
        raise ConfigError(f"the DeepSpeed config file '{path}': {e}") from None
    except json.JSONDecodeError as e:
        return _load_hjson(path, text, e)
    except RecursionError:
        raise ConfigError(f"the DeepSpeed config file '{path}' is nested too deeply to be a "
                          f"config.") from None
    check_huge_ints(data, f"the DeepSpeed config file '{path}': ")
    return data


def _load_hjson(path: Path, text: str, json_error: json.JSONDecodeError) -> dict:
    """DeepSpeed reads config files as hjson (JSON plus comments, unquoted keys and strings,
    optional commas). A file that is not JSON is read the same way when the ``hjson``
    package is installed (zspeed does not require it), with the same checks: no duplicate
    keys, only finite numbers."""
    where = (f"the DeepSpeed config file '{path}' is not valid JSON ({json_error.msg} at line "
             f"{json_error.lineno} column {json_error.colno})")
    try:
        import hjson
    except ImportError:
        raise ConfigError(f"{where}. DeepSpeed reads config files as hjson (comments, unquoted keys, optional "
                          f"commas); install the hjson package (pip install hjson) to let zspeed read this "
                          f"file the same way, or write it as JSON.") from None
    try:
        data = hjson.loads(text, object_pairs_hook=_no_duplicates, parse_int=_parse_int)
    except ConfigError as e:
        raise ConfigError(f"the DeepSpeed config file '{path}': {e}") from None
    except (hjson.HjsonDecodeError, ValueError) as e:
        raise ConfigError(f"{where}, nor valid hjson: {e}.") from None
    except RecursionError:
        raise ConfigError(f"the DeepSpeed config file '{path}' is nested too deeply to be a "
                          f"config.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the DeepSpeed config file '{path}' holds {type(data).__name__}, not an object.")
    _check_finite(data, str(path))
    check_huge_ints(data, f"the DeepSpeed config file '{path}': ")
    return dict(data)


def _check_finite(value, where: str) -> None:
    """hjson reads NaN and Infinity as numbers; a config may not hold them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"the DeepSpeed config file '{where}' holds {value!r}, which is not a number a "
                          f"config may hold; write a finite number.")
    if isinstance(value, dict):
        for v in value.values():
            _check_finite(v, where)
    elif isinstance(value, list):
        for v in value:
            _check_finite(v, where)
