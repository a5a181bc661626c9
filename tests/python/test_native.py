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
