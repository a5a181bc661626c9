"""ZSPEED_LIBRARY pointing at something that is not libzspeed: a clear ZSpeedError naming the
variable, never a raw AttributeError or OSError."""
import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    from zspeed import _native
    try:
        _native.load()
        print("LOADED")
    except _native.ZSpeedError as e:
        print("ZSpeedError", e)
""")


def _load_with(library: str) -> str:
    env = dict(os.environ, ZSPEED_LIBRARY=library)
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr  # an uncaught exception (AttributeError, OSError) fails here
    return res.stdout


def _other_shared_library() -> str:
    """A shared library that is surely not libzspeed: the C library of this process."""
    import ctypes.util
    name = ctypes.util.find_library("c") or ctypes.util.find_library("z")
    if not name:
        pytest.skip("no system C library found to stand in for a foreign library")
    if os.path.isabs(name):
        return name
    # find_library returns a soname on Linux; resolve it through the loaded process's maps.
    if sys.platform.startswith("linux"):
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path) == name:
                    return path
    pytest.skip(f"cannot resolve {name} to a path")


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in library is found through /proc")
def test_foreign_library_is_a_clear_error():
    other = _other_shared_library()
    out = _load_with(other)
    assert out.startswith("ZSpeedError"), out
    assert "ZSPEED_LIBRARY" in out and "is not libzspeed" in out and "zs_version" in out


def test_folder_or_text_file_is_a_clear_error(tmp_path):
    out = _load_with(str(tmp_path))
    assert out.startswith("ZSpeedError") and "ZSPEED_LIBRARY" in out and "(a folder)" in out, out
    text = tmp_path / "libzspeed.so"
    text.write_text("not a library\n")
    out = _load_with(str(text))
    assert out.startswith("ZSpeedError") and "ZSPEED_LIBRARY" in out and str(text) in out, out


THREADS_PROBE = textwrap.dedent("""
    import numpy as np
    from zspeed import NativeError
    from zspeed.ops.adam import adam_step
    p = np.ones(1000, np.float32)
    try:
        adam_step(p, np.ones(1000, np.float32), np.zeros(1000, np.float32), np.zeros(1000, np.float32), step=1)
        print("STEPPED", bool((p != 1).all()))
    except NativeError as e:
        print("NativeError", e.name, e.detail, bool((p == 1).all()))
""")


@pytest.mark.parametrize("value", ["0", "-1", "abc", "100000", "4.5", " 4"])
def test_unusable_thread_count_is_refused_not_replaced(value, zs):
    env = dict(os.environ, ZSPEED_NUM_THREADS=value)
    res = subprocess.run([sys.executable, "-c", THREADS_PROBE], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("NativeError") and f"ZSPEED_NUM_THREADS={value}" in res.stdout, res.stdout
    assert res.stdout.rstrip().endswith("True")  # nothing was modified
    rep = zs("report", env={"ZSPEED_NUM_THREADS": value}, check=False)
    assert rep.returncode == 1 and f"ZSPEED_NUM_THREADS={value}" in rep.stderr
    assert "threads ............. ERROR" in rep.stdout


def test_usable_thread_count_is_applied(zs):
    env = dict(os.environ, ZSPEED_NUM_THREADS="3")
    res = subprocess.run([sys.executable, "-c", THREADS_PROBE], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.stdout.startswith("STEPPED True"), (res.stdout, res.stderr)
    rep = zs("report", env={"ZSPEED_NUM_THREADS": "3"})
    assert "threads ............. 3 (ZSPEED_NUM_THREADS=3)" in rep.stdout
