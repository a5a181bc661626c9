"""ZSPEED_AS_DEEPSPEED (python/zspeed/_as_deepspeed.py and the wheel's zspeed_as_deepspeed.pth):
zspeed stands in for deepspeed in every process of an environment when asked, never silently
over an installed DeepSpeed, and the variable unset changes nothing."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import zspeed

ROOT = Path(__file__).resolve().parents[2]
PTH = ROOT / "python" / "zspeed_as_deepspeed.pth"
PKG_PARENT = str(Path(zspeed.__file__).resolve().parent.parent)

PROBE = r'''
import site, sys
site.addsitedir(sys.argv[1])
try:
    import deepspeed
    import importlib.metadata as md
    try:
        v = md.version("deepspeed")
    except md.PackageNotFoundError:
        v = None
    print("DS", deepspeed.__name__, v)
except ImportError as e:
    print("NO", type(e).__name__)
'''


def _run(tmp_path, value=None, extra_path=()):
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(PTH, site_dir / PTH.name)
    env = {k: v for k, v in os.environ.items() if k != "ZSPEED_AS_DEEPSPEED"}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_path), PKG_PARENT])
    if value is not None:
        env["ZSPEED_AS_DEEPSPEED"] = value
    r = subprocess.run([sys.executable, "-c", PROBE, str(site_dir)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1], r.stderr


@pytest.fixture(autouse=True)
def _no_real_deepspeed():
    import importlib.util
    if importlib.util.find_spec("deepspeed") is not None and not zspeed.hf.installed():
        pytest.skip("a real DeepSpeed is installed in this environment")


def test_the_variable_makes_deepspeed_zspeed_and_unset_changes_nothing(tmp_path):
    from zspeed.hf import DEEPSPEED_API_VERSION
    out, err = _run(tmp_path, "1")
    assert out == f"DS zspeed {DEEPSPEED_API_VERSION}", (out, err)
    for value in (None, "", "0"):
        out, err = _run(tmp_path, value)
        assert out == "NO ModuleNotFoundError" and err == "", (value, out, err)
    out, err = _run(tmp_path, "yes")
    assert out == "NO ModuleNotFoundError" and "'yes' is not one of 1, force, 0" in err


def test_an_installed_deepspeed_is_not_shadowed_unless_forced(tmp_path):
    fake = tmp_path / "real"
    (fake / "deepspeed").mkdir(parents=True)
    (fake / "deepspeed" / "__init__.py").write_text("")
    out, err = _run(tmp_path, "1", extra_path=[fake])
    assert out.startswith("DS deepspeed") and "ZSPEED_AS_DEEPSPEED=1 is ignored: DeepSpeed is installed here" in err
    out, err = _run(tmp_path, "force", extra_path=[fake])
    assert out.startswith("DS zspeed"), (out, err)


def test_the_wheel_installs_the_hook():
    wheel = os.environ.get("ZSPEED_WHEEL")
    if not wheel:
        pytest.skip("ZSPEED_WHEEL not set (make test-python sets it)")
    with zipfile.ZipFile(wheel) as z:
        assert "zspeed_as_deepspeed.pth" in z.namelist() and "zspeed/_as_deepspeed.py" in z.namelist()
    # Installed (make test installs the wheel into the environment that runs this): a plain child.
    env = dict(os.environ, ZSPEED_AS_DEEPSPEED="1")
    r = subprocess.run([sys.executable, "-c", "import deepspeed; print(deepspeed.__name__)"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "zspeed", r.stderr
