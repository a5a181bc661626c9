"""What `pip install zspeed` gives: the wheel's declared dependencies, and a
clear message where the one optional dependency (torch) is missing."""
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest


def _requires(wheel: str) -> list:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


def test_wheel_depends_on_what_the_engine_needs():
    """Checkpoints need safetensors and progress bars tqdm: plain `pip install .`
    must bring them; torch stays an extra (the user picks the CPU or CUDA build)."""
    wheel = os.environ.get("ZSPEED_WHEEL")
    if not wheel:
        pytest.skip("ZSPEED_WHEEL not set (make test-python sets it)")
    req = _requires(wheel)
    plain = {r.split(";")[0].strip().split(">")[0].split("=")[0].split("<")[0].strip()
             for r in req if "extra ==" not in r}
    assert {"numpy", "safetensors", "tqdm"} <= plain, req
    assert "torch" not in plain, req
    assert any(r.startswith("torch") and 'extra == "torch"' in r for r in req), req


def test_initialize_without_torch_names_the_package():
    """With torch not importable, zspeed imports and initialize() says what to install."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
        import zspeed
        try:
            zspeed.initialize(model=None, config={})
        except ImportError as e:
            print("ERR", e)
        try:
            zspeed.ZSpeedEngine
        except ImportError as e:
            print("ERR2", e)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "ERR " in res.stdout and "pip install torch" in res.stdout, res.stdout
    assert "ERR2" in res.stdout and "PyTorch" in res.stdout, res.stdout
