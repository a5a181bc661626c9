"""`python -m zspeed report` tells the truth: it follows forced SIMD levels,
refused ones, disabled io_uring, and includes the Python side."""
import json

import pytest

from zspeed._native import lib


def test_text_report_has_every_section(zs):
    out = zs("report").stdout
    for key in ("version", "build flags", "os ", "cpu ", "cores", "cpu features",
                "simd level", "ram", "page-lock limit", "io backends:",
                "threads", "io_uring", "iocp", "cuda driver", "python:", "numpy",
                "torch"):
        assert key in out, key


def test_json_report_matches_library(zs):
    doc = json.loads(zs("report", "--json").stdout)
    assert doc["version"] == lib.zs_version_string().decode()
    assert doc["cpu"]["cores"] == lib.zs_cpu_count()
    assert doc["simd"]["best"] == lib.zs_simd_name(lib.zs_simd_best()).decode()
    assert doc["io_backends"]["threads"]["available"] is True
    assert set(doc["io_backends"]) >= {"threads", "io_uring", "iocp"}
    assert "python" in doc and doc["python"]["zspeed_package"]
    assert isinstance(doc["cuda_driver"]["available"], bool)
    assert doc["io_backend_auto"]["chosen"] in ("io_uring", "threads", "iocp")


def test_forced_scalar_is_reported(zs):
    doc = json.loads(zs("report", "--json", env={"ZSPEED_SIMD": "scalar"}).stdout)
    assert doc["simd"]["level"] == "scalar"
    assert doc["simd"]["forced_by_env"] == "scalar"
    assert "forced by ZSPEED_SIMD=scalar" in zs("report", env={"ZSPEED_SIMD": "scalar"}).stdout


def test_unsupported_forced_level_is_an_error_in_the_report(zs):
    best = lib.zs_simd_name(lib.zs_simd_best()).decode()
    missing = "neon" if best != "neon" else "avx2"
    doc = json.loads(zs("report", "--json", env={"ZSPEED_SIMD": missing}).stdout)
    assert doc["simd"]["level"] is None
    assert missing in doc["simd"]["error"] and "lacks" in doc["simd"]["error"]
    text = zs("report", env={"ZSPEED_SIMD": missing}).stdout
    assert "simd level .......... ERROR" in text


def test_disabled_uring_is_reported_with_reason(zs):
    doc = json.loads(zs("report", "--json", env={"ZSPEED_DISABLE_URING": "1"}).stdout)
    u = doc["io_backends"]["io_uring"]
    assert u["available"] is False
    assert u["why"]  # a reason, whichever applies on this platform
    assert doc["io_backend_auto"]["chosen"] in ("threads", "iocp")


def test_forced_aio_backend_is_reported(zs):
    doc = json.loads(zs("report", "--json", env={"ZSPEED_AIO_BACKEND": "threads"}).stdout)
    assert doc["io_backend_auto"]["chosen"] == "threads"
    doc = json.loads(zs("report", "--json", env={"ZSPEED_AIO_BACKEND": "floppy"}).stdout)
    assert doc["io_backend_auto"]["chosen"] is None
    assert "floppy" in doc["io_backend_auto"]["why"]


def test_unknown_command_and_option(zs):
    res = zs("frobnicate", check=False)
    assert res.returncode == 2 and "unknown command" in res.stderr
    res = zs("report", "--xml", check=False)
    assert res.returncode == 2


def test_console_script_matches_module():
    """`pip install` puts a `zspeed` console script next to the interpreter."""
    import importlib.metadata
    import os
    import subprocess
    import sys
    try:
        importlib.metadata.distribution("zspeed")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("zspeed runs from the source tree (not pip-installed): no console script")
    exe = os.path.join(os.path.dirname(sys.executable),
                       "zspeed.exe" if os.name == "nt" else "zspeed")
    assert os.path.exists(exe), exe
    out = subprocess.run([exe, "report", "--json"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert json.loads(out)["version"] == lib.zs_version_string().decode()
