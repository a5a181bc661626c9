"""The ctypes loader: finding the library, declaring it, the version check
and the translation of error codes into exceptions."""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

import zspeed
from zspeed import _native
from zspeed._native import NativeError, ZSpeedError, check, lib


def test_loads_and_version_matches_package():
    path = _native.library_path()
    assert path.is_file()
    v = lib.zs_version()
    assert f"{v >> 16}.{(v >> 8) & 0xFF}.{v & 0xFF}" == zspeed.__version__
    assert lib.zs_version_string().decode() == zspeed.__version__


def test_every_declared_function_has_types():
    from zspeed._signatures import common
    for name, (restype, argtypes) in common.SIGNATURES.items():
        fn = getattr(_native.load(), name)
        assert fn.restype == restype, name
        assert list(fn.argtypes) == list(argtypes), name


def test_negative_code_becomes_native_error_with_detail():
    out = ctypes.c_void_p()
    rc = lib.zs_alloc_aligned(ctypes.byref(out), 64, 3)
    with pytest.raises(NativeError) as ei:
        check(rc, "zs_alloc_aligned")
    e = ei.value
    assert e.code == rc < 0
    assert e.name == "ZS_EINVAL"
    assert e.strerror == "invalid argument"
    assert "power of two" in e.detail
    assert "zs_alloc_aligned" in str(e) and "ZS_EINVAL" in str(e)
    assert isinstance(e, ZSpeedError)
    assert check(5) == 5


def test_errcode_lookup():
    assert _native.errcode("ZS_EINVAL") == -1
    assert lib.zs_err_name(_native.errcode("ZS_ENOSPC")).decode() == "ZS_ENOSPC"
    with pytest.raises(KeyError):
        _native.errcode("ZS_NOT_A_CODE")


def test_simd_force_through_python():
    best = lib.zs_simd_best()
    check(lib.zs_simd_force(b"scalar"))
    try:
        assert lib.zs_simd_level() == 0
        with pytest.raises(NativeError) as ei:
            check(lib.zs_simd_force(b"bogus"))
        assert "not a SIMD level" in ei.value.detail
    finally:
        check(lib.zs_simd_force(b"auto"))
    assert lib.zs_simd_level() == best


def test_pinned_refused_then_fallback():
    enomlock = _native.errcode("ZS_EMLOCK")
    check(lib.zs_fault_set(b"mlock", 1, 1, enomlock))
    p = ctypes.c_void_p()
    locked = ctypes.c_int(-1)
    with pytest.raises(NativeError) as ei:
        check(lib.zs_alloc_pinned(ctypes.byref(p), 1 << 16, 0, ctypes.byref(locked)))
    assert ei.value.name == "ZS_EMLOCK" and "ZS_PIN_FALLBACK" in ei.value.detail
    check(lib.zs_fault_set(b"mlock", 1, 1, enomlock))
    check(lib.zs_alloc_pinned(ctypes.byref(p), 1 << 16, 1, ctypes.byref(locked)))
    assert locked.value == 0 and p.value
    ctypes.memset(p, 1, 1 << 16)
    lib.zs_free_pinned(p, 1 << 16)


def _run_py(code, env=None):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                          capture_output=True, text=True, timeout=60)


def test_missing_library_is_a_clear_error(tmp_path):
    res = _run_py("""
        from zspeed import _native
        try:
            _native.load()
        except _native.ZSpeedError as e:
            print("ERR", e)
    """, env={"ZSPEED_LIBRARY": str(tmp_path / "nope.so")})
    assert res.returncode == 0, res.stderr
    assert "ERR cannot find libzspeed" in res.stdout
    assert "nope.so (missing)" in res.stdout and "ZSPEED_LIBRARY" in res.stdout


def test_version_mismatch_is_refused():
    res = _run_py("""
        import zspeed._native as n
        n.__version__ = "9.4.0"
        try:
            n.load()
        except n.ZSpeedError as e:
            print("ERR", e)
    """)
    assert res.returncode == 0, res.stderr
    assert "ERR" in res.stdout
    assert "9.4.0" in res.stdout and zspeed.__version__ in res.stdout


def test_wheel_is_py3_none_and_has_no_extension():
    """One wheel for every Python 3: tagged py3-none-<platform>, holding the
    C library and .py files only. make test passes the wheel it built."""
    wheel = os.environ.get("ZSPEED_WHEEL")
    if not wheel:
        pytest.skip("ZSPEED_WHEEL not set (make test-python sets it)")
    import zipfile
    name = os.path.basename(wheel)
    parts = name[:-4].split("-")
    assert parts[-3:-1] == ["py3", "none"], name
    libs = []
    with zipfile.ZipFile(wheel) as z:
        for f in z.namelist():
            assert not f.endswith(".pyd") and ".cpython-" not in f and ".abi3." not in f, f
            if f.endswith((".so", ".dll", ".dylib")):
                libs.append(f)
    assert libs == [next(iter(libs))] and libs[0].startswith("zspeed/"), libs


# ------------------------------------------------- ctypes mirrors vs the C ABI

def _abi_rows():
    """Every row of the library's ABI table (zs_abi_entry)."""
    from zspeed._signatures.common import AbiKind
    rows, i = [], 0
    kind, scope, name = ctypes.c_int(), ctypes.c_char_p(), ctypes.c_char_p()
    value, size = ctypes.c_int64(), ctypes.c_int64()
    while lib.zs_abi_entry(i, ctypes.byref(kind), ctypes.byref(scope), ctypes.byref(name),
                           ctypes.byref(value), ctypes.byref(size)):
        rows.append((AbiKind(kind.value), scope.value.decode(), name.value.decode(),
                     value.value, size.value))
        i += 1
    assert rows, "the ABI table is empty"
    return rows


def _mirrors(table):
    """One of the STRUCTS / ENUMS / CONSTANTS tables, merged over every
    module of zspeed._signatures (each C name declared once)."""
    import importlib
    import pkgutil
    from zspeed import _signatures
    merged = {}
    for mod in pkgutil.iter_modules(_signatures.__path__):
        part = getattr(importlib.import_module(f"zspeed._signatures.{mod.name}"), table)
        assert not set(part) & set(merged), f"{table}: declared twice: {set(part) & set(merged)}"
        merged.update(part)
    return merged


def test_struct_mirrors_match_the_library():
    """Every ctypes Structure mirrors a C struct with the same size,
    alignment, field names, order, offsets and sizes; every public C struct
    has a mirror."""
    from zspeed._signatures.common import AbiKind
    rows = _abi_rows()
    structs = {r[2]: r for r in rows if r[0] == AbiKind.STRUCT}
    fields: dict = {}
    for kind, scope, name, value, size in rows:
        if kind == AbiKind.FIELD:
            fields.setdefault(scope, []).append((name, value, size))
    mirrors = _mirrors("STRUCTS")
    assert set(mirrors) == set(structs)
    for cname, cls in mirrors.items():
        assert ctypes.sizeof(cls) == structs[cname][3], cname
        assert ctypes.alignment(cls) == structs[cname][4], cname
        mine = [(n, getattr(cls, n).offset, getattr(cls, n).size) for n, _ in cls._fields_]
        assert mine == fields[cname], cname


def test_enum_and_constant_mirrors_match_the_library():
    """Every Python enum has exactly the C enum's names and values, every
    public C enum has one, and the constants agree."""
    from zspeed._signatures.common import AbiKind
    rows = _abi_rows()
    enums: dict = {}
    for kind, scope, name, value, size in rows:
        if kind == AbiKind.ENUM:
            enums.setdefault(scope, {})[name] = value
            assert size == ctypes.sizeof(ctypes.c_int), (scope, name)
    mirrors = _mirrors("ENUMS")
    assert set(mirrors) == set(enums)
    for cname, (cls, prefix) in mirrors.items():
        # __members__ also lists zero-valued flags (READ), which iterating
        # an IntFlag leaves out.
        mine = {prefix + n: int(m) for n, m in cls.__members__.items()}
        assert mine == enums[cname], cname
    consts = {r[2]: r[3] for r in rows if r[0] == AbiKind.CONSTANT}
    assert _mirrors("CONSTANTS") == consts


def _headers():
    """The text of include/zspeed/*.h without comments, or a skip when the
    tests do not run from a source tree."""
    import pathlib
    import re
    inc = pathlib.Path(__file__).resolve().parents[2] / "include" / "zspeed"
    if not inc.is_dir():
        pytest.skip(f"no source tree here ({inc} is missing)")
    text = "\n".join(p.read_text() for p in sorted(inc.glob("*.h")))
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def test_abi_table_and_signatures_cover_the_headers():
    """The C table lists every field of every public struct and every
    constant of every public enum, as the headers spell them (so a field
    added to a header and forgotten in src/report/abi.c fails here even when
    it fits in padding), and SIGNATURES declares every exported function."""
    import re
    from zspeed._signatures.common import AbiKind
    text = _headers()
    rows = _abi_rows()
    table_fields: dict = {}
    table_enums: dict = {}
    for kind, scope, name, _value, _size in rows:
        if kind == AbiKind.FIELD:
            table_fields.setdefault(scope, []).append(name)
        elif kind == AbiKind.ENUM:
            table_enums.setdefault(scope, []).append(name)
    header_fields = {}
    for tag, body in re.findall(r"typedef struct (zs_\w+) \{(.*?)\} \1;", text, re.S):
        names = []
        for decl in body.split(";"):
            parts = [p.strip() for p in decl.split(",") if p.strip()]
            names += [re.findall(r"\w+", p)[-1] for p in parts]
        header_fields[tag] = names
    assert header_fields == table_fields
    header_enums = {tag: re.findall(r"\b(ZS_\w+)\s*=", body)
                    for tag, body in re.findall(r"\benum (zs_[a-z]\w*) \{(.*?)\}", text, re.S)}
    header_enums.pop("zs_errno", None)  # error codes: zs_err_name describes them
    assert header_enums == table_enums
    exported = set(re.findall(r"ZS_EXTERN\s[^;(]*?\b(zs_\w+)\s*\(", text))
    declared = set()
    for table in _all_signature_tables():
        declared |= set(table)
    assert exported == declared


def _all_signature_tables():
    import importlib
    import pkgutil
    from zspeed import _signatures
    return [importlib.import_module(f"zspeed._signatures.{m.name}").SIGNATURES
            for m in pkgutil.iter_modules(_signatures.__path__)]
