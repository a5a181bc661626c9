"""What a new user meets first (issue 28): the messages when torch is missing, one `zspeed`
command with every subcommand, the summary block of initialize(), the demo's closing hints,
and the README's numbers coming from bench/RESULTS.md's table."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

import zspeed  # noqa: E402
from engine_helpers import OFFLOAD, config, mlp, native_ops_available, run_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
needs_native = pytest.mark.skipif(not native_ops_available(), reason="libzspeed is not built")


# -- torch missing -------------------------------------------------------------------------------

def test_torch_missing_messages_name_commands_that_work():
    """Every torch-needing name says how to install torch, with commands that work: zspeed is
    not on the package index, so no `pip install zspeed[torch]`; the CPU-only index is named."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # `import torch` raises ImportError
        from zspeed.ops.adam import adam_step  # the numpy functions need no torch
        from zspeed.ops.lion import lion_step
        from zspeed.ops.adagrad import adagrad_step
        import zspeed
        attempts = [
            lambda: __import__("zspeed.ops.adam", fromlist=["CPUAdam"]).CPUAdam,
            lambda: __import__("zspeed.ops.adam", fromlist=["DeepSpeedCPUAdam"]).DeepSpeedCPUAdam,
            lambda: __import__("zspeed.ops.lion", fromlist=["CPULion"]).CPULion,
            lambda: __import__("zspeed.ops.adagrad", fromlist=["CPUAdagrad"]).CPUAdagrad,
            lambda: zspeed.initialize(model=None, config={}),
        ]
        for attempt in attempts:
            try:
                attempt()
                print("NO ERROR")
            except ImportError as e:
                print(type(e).__name__ + ": " + str(e))
        try:
            exec("from zspeed.ops.adam import CPUAdam")
        except ImportError as e:
            print("FROM-IMPORT: " + str(e))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 6 and "NO ERROR" not in res.stdout, res.stdout
    for line in lines:
        assert "ModuleNotFoundError" not in line, line
        assert "needs PyTorch" in line and "pip install torch" in line, line
        assert "https://download.pytorch.org/whl/cpu" in line, line
        assert "zspeed[torch]" not in line and "pip install '.[torch]'" in line, line
    assert lines[0].startswith("ImportError: zspeed.ops.adam.CPUAdam needs PyTorch"), lines[0]


# -- one `zspeed` command ------------------------------------------------------------------------

def _zspeed(*args, **kw):
    return subprocess.run([sys.executable, "-m", "zspeed", *args], capture_output=True, text=True,
                          timeout=120, **kw)


def test_python_command_lists_and_runs_bench():
    """`zspeed bench ...` answers from the Python command too (the wheel carries the native
    command; a checkout finds build/zspeed), so the README's `zspeed bench io` works however
    zspeed was installed."""
    from zspeed.cli import native_command
    usage = _zspeed("--help").stdout
    assert re.search(r"^\s+bench\s", usage, re.M), usage
    res = _zspeed("bench", "--help")
    if native_command() is None:
        assert res.returncode == 2 and "not part of this installation" in res.stderr, res
        pytest.skip("no native zspeed command here (no wheel installed, no build/zspeed)")
    assert res.returncode == 0, res.stderr
    for name in ("adam", "io", "swap"):
        assert re.search(rf"^\s+{name}\s", res.stdout, re.M), res.stdout
    bad = _zspeed("bench", "no-such-benchmark")
    assert bad.returncode != 0 and "no-such-benchmark" in bad.stderr, bad


def test_wheel_carries_the_native_command():
    """The wheel make test-python builds holds zspeed/bin/zspeed(.exe), executable."""
    wheel = os.environ.get("ZSPEED_WHEEL")
    if not wheel:
        pytest.skip("ZSPEED_WHEEL not set (make test-python sets it)")
    import zipfile
    with zipfile.ZipFile(wheel) as z:
        exe = [i for i in z.infolist() if i.filename in ("zspeed/bin/zspeed", "zspeed/bin/zspeed.exe")]
    assert len(exe) == 1, "the wheel has no zspeed/bin/zspeed"
    if exe[0].filename.endswith("zspeed"):
        assert (exe[0].external_attr >> 16) & 0o111, oct(exe[0].external_attr >> 16)

