"""`python -m zspeed report` tells the truth: it follows forced SIMD levels,
refused ones, disabled io_uring, and includes the Python side."""
import json
import subprocess
import sys
import textwrap

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
    res = zs("report", "--json", env={"ZSPEED_SIMD": missing}, check=False)
    assert res.returncode == 1  # a refused forced level fails the command
    doc = json.loads(res.stdout)
    assert doc["simd"]["level"] is None
    assert missing in doc["simd"]["error"] and "lacks" in doc["simd"]["error"]
    text = zs("report", env={"ZSPEED_SIMD": missing}, check=False).stdout
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
    res = zs("report", "--json", env={"ZSPEED_AIO_BACKEND": "floppy"}, check=False)
    assert res.returncode == 1  # an unknown forced backend fails the command
    doc = json.loads(res.stdout)
    assert doc["io_backend_auto"]["chosen"] is None
    assert "floppy" in doc["io_backend_auto"]["why"]


def test_unknown_command_and_option(zs):
    res = zs("frobnicate", check=False)
    assert res.returncode == 2 and "unknown command" in res.stderr
    res = zs("report", "--xml", check=False)
    assert res.returncode == 2


def test_console_script_matches_module():
    """`pip install` puts a `zspeed` console script in the interpreter's scripts folder."""
    import importlib.metadata
    import os
    import subprocess
    import sys
    try:
        importlib.metadata.distribution("zspeed")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("zspeed runs from the source tree (not pip-installed): no console script")
    import sysconfig
    # pip's folder for console scripts: the venv's bin/ (next to the interpreter) on Linux,
    # Scripts\ on Windows (not next to python.exe outside a venv).
    exe = os.path.join(sysconfig.get_path("scripts"), "zspeed.exe" if os.name == "nt" else "zspeed")
    assert os.path.exists(exe), exe
    out = subprocess.run([exe, "report", "--json"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert json.loads(out)["version"] == lib.zs_version_string().decode()


# --------------------------------------------------------------- exit status

def _whole_text(out):
    """The text report is complete: the native part and the Python part."""
    return out.startswith("zspeed report") and "cuda driver" in out and "torch " in out


def test_clean_environment_exits_0(zs):
    env = {"ZSPEED_SIMD": "auto", "ZSPEED_AIO_BACKEND": "auto"}
    res = zs("report", env=env, check=False)
    assert res.returncode == 0 and _whole_text(res.stdout) and res.stderr == ""
    res = zs("report", "--json", env=env, check=False)
    assert res.returncode == 0
    doc = json.loads(res.stdout)
    assert doc["problems"] == [] and doc["library_error"] is None


@pytest.mark.parametrize("var,value,says,as_json", [
    ("ZSPEED_SIMD", "bogus", "is not a SIMD level", False),
    ("ZSPEED_SIMD", "missing", "but this CPU lacks it", True),
    ("ZSPEED_AIO_BACKEND", "floppy", "is not a backend", False),
    ("ZSPEED_AIO_BACKEND", "unusable", "is not usable here", True),
])
def test_refused_forced_choice_exits_1_after_the_whole_report(zs, var, value, says,
                                                              as_json):
    if value == "missing":
        value = "neon" if lib.zs_simd_name(lib.zs_simd_best()).decode() != "neon" else "avx2"
    if value == "unusable":
        value = "io_uring" if sys.platform == "win32" else "iocp"
    res = zs("report", *(["--json"] if as_json else []), env={var: value}, check=False)
    assert res.returncode == 1
    assert "1 problem" in res.stderr and says in res.stderr and value in res.stderr
    if as_json:
        doc = json.loads(res.stdout)
        assert len(doc["problems"]) == 1 and says in doc["problems"][0]
        assert doc["python"]["zspeed_package"]  # the Python part is there too
    else:
        assert _whole_text(res.stdout)


def test_version_mismatch_exits_1_and_still_reports():
    """A library of another major.minor: the package refuses it, yet the
    report describes it (native part included) and exits with 1."""
    code = textwrap.dedent("""
        import sys
        import zspeed._native as n
        n.__version__ = "9.4.0"
        from zspeed.cli import main
        sys.exit(main(["report"]))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1, res.stderr
    assert _whole_text(res.stdout)
    assert "library ........... ERROR:" in res.stdout
    version = lib.zs_version_string().decode()
    assert f"is libzspeed {version}" in res.stderr and "zspeed 9.4.0" in res.stderr


def test_missing_library_exits_1_and_reports_python(zs, tmp_path):
    res = zs("report", "--json", env={"ZSPEED_LIBRARY": str(tmp_path / "nope.so")},
             check=False)
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert "cannot find libzspeed" in doc["library_error"]
    assert doc["problems"] == [doc["library_error"]]
    assert doc["python"]["zspeed_package"] and "numpy" in doc["python"]
    assert "cannot find libzspeed" in res.stderr
