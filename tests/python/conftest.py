"""Shared pytest set-up: tests import the installed zspeed package (make test
installs it into the venv); ZSPEED_LIBRARY may point at another build."""
import os
import subprocess
import sys

import pytest


def run_zspeed(*args, env=None, check=True):
    """Runs ``python -m zspeed ARGS`` in a subprocess; returns the result."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    res = subprocess.run([sys.executable, "-m", "zspeed", *args], env=full_env,
                         capture_output=True, text=True, timeout=120)
    if check and res.returncode != 0:
        raise AssertionError(f"zspeed {args} failed ({res.returncode}):\n"
                             f"{res.stdout}\n{res.stderr}")
    return res


@pytest.fixture
def zs():
    return run_zspeed
