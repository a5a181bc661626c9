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


# -- the summary block of initialize() -----------------------------------------------------------

def _engine(**zero):
    cfg = config(zero_optimization=zero or dict(OFFLOAD))
    engine, *_ = zspeed.initialize(model=mlp(), config=cfg)
    return engine


def _blocks(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "zspeed.summary" and r.levelno == logging.INFO]


@needs_native
def test_summary_block_names_what_the_run_is_made_of(caplog):
    """One INFO block whose first line has DeepSpeed's format ("DeepSpeed info: version=...,
    git-hash=..., git-branch=..."), then stage, offload, state dtype, timing, threads, SIMD
    level, I/O backend, world size and memory per tier."""
    from zspeed.runtime.summary import log_summary
    engine = _engine(stage=2, offload_optimizer={"device": "cpu", "pin_memory": True})
    try:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="zspeed"):
            log_summary(engine)
        blocks = _blocks(caplog)
        assert len(blocks) == 1, blocks
        text = blocks[0]
        first = text.splitlines()[0]
        assert re.fullmatch(r"\[Rank 0\] zspeed info: version=" + re.escape(zspeed.__version__)
                            + r", git-hash=\S+, git-branch=\S+", first), first
        simd = zspeed._native.lib.zs_simd_name(zspeed._native.lib.zs_simd_active()).decode() \
            if hasattr(zspeed._native.lib, "zs_simd_active") else None
        for needle in ("ZeRO stage ........ 2", "world size 1", "optimizer cpu (pinned)", "parameters none",
                       "state fp32", "step synchronous", "SIMD", "threads", "I/O backend", "host ",
                       "fp32 masters", "optimizer state (fp32)"):
            assert needle in text, (needle, text)
        if simd:
            assert f"{simd} SIMD" in text, text
    finally:
        engine.close()


@needs_native
def test_summary_says_the_cpu_share_and_timing(caplog):
    """offload_optimizer.ratio: the CPU's share of the parameters (the summary says whose share
    the number is); overlap_forward and int8 states are named."""
    from zspeed.runtime.summary import log_summary
    engine = _engine(stage=2, offload_optimizer={"device": "cpu", "ratio": 0.5, "overlap_forward": True})
    try:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="zspeed"):
            log_summary(engine)
        text = _blocks(caplog)[0]
        m = re.search(r"ratio \.+ ([0-9.]+) \(given 0\.5\): the CPU steps ([0-9.]+)% of the parameters", text)
        assert m, text
        assert 0.0 < float(m.group(1)) < 1.0 and abs(float(m.group(1)) * 100 - float(m.group(2))) < 0.06, text
        assert "overlap_forward" in text, text
    finally:
        engine.close()


@needs_native
def test_summary_quiet_on_other_ranks_and_with_the_config_key(caplog):
    from zspeed.runtime.summary import log_summary
    engine = _engine()
    try:
        with caplog.at_level(logging.INFO, logger="zspeed"):
            caplog.clear()
            engine._config.top["zspeed_summary"] = False
            log_summary(engine)
            assert _blocks(caplog) == []
            engine._config.top["zspeed_summary"] = True
            engine.global_rank = 1
            log_summary(engine)
            assert _blocks(caplog) == []
    finally:
        engine.close()


@needs_native
def test_initialize_logs_the_summary_once(caplog):
    """Once ZSpeedEngine.__init__ calls log_summary, initialize() logs exactly one block."""
    with caplog.at_level(logging.INFO, logger="zspeed"):
        engine = _engine()
    try:
        blocks = _blocks(caplog)
        assert len(blocks) == 1 and "zspeed info: version=" in blocks[0], blocks
    finally:
        engine.close()


def test_standing_in_for_deepspeed_the_summary_says_deepspeed_info(caplog):
    """After zspeed.hf.install() the first line is the "DeepSpeed info: version=" that
    transformers' tests and users look for, naming zspeed too."""
    import zspeed.hf
    was = zspeed.hf.installed()
    zspeed.hf.install()
    try:
        with caplog.at_level(logging.INFO, logger="zspeed"):
            engine = _engine()
        engine.close()
    finally:
        if not was:
            zspeed.hf.uninstall()
    first = _blocks(caplog)[0].splitlines()[0]
    assert first.startswith(f"[Rank 0] DeepSpeed info: version={zspeed.hf.DEEPSPEED_API_VERSION} (zspeed "
                            f"{zspeed.__version__} through zspeed.hf.install()), git-hash="), first


@needs_native
def test_summary_shows_without_logging_setup_and_a_level_hides_it(tmp_path):
    """With no logging configured the block reaches stderr (as DeepSpeed's start-up lines do);
    a WARNING level on the zspeed logger hides it."""
    res = run_script(tmp_path, "summary.py", textwrap.dedent("""
        import logging
        import zspeed
        from engine_helpers import OFFLOAD, config, mlp
        from zspeed.runtime.summary import log_summary
        engine, *_ = zspeed.initialize(model=mlp(), config=config(zero_optimization=OFFLOAD))
        log_summary(engine)
        logging.getLogger("zspeed").setLevel(logging.WARNING)
        log_summary(engine)
        engine.close()
    """))
    assert res.returncode == 0, res.stderr
    # One block from log_summary, and one more once initialize() calls it itself.
    assert res.stderr.count("zspeed info: version=") in (1, 2), res.stderr
    assert "optimizer cpu" in res.stderr and res.stdout == "", res


# -- the demo's closing lines --------------------------------------------------------------------

@needs_native
def test_demo_prints_commands_that_work_and_saves_its_loss_curve(tmp_path):
    """The to-fp32 hint runs as printed (no `zspeed` on PATH needed), and the loss curve is
    next to the checkpoint (CSV and an SVG chart)."""
    import shlex
    import xml.dom.minidom
    out = tmp_path / "demo"
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PATH="/usr/bin:/bin")
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "demo_train.py"), "--steps", "6",
                          "--sample-chars", "8", "--out", str(out)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    hint = next(line for line in res.stdout.splitlines() if line.startswith("fp32 weights: "))
    cmd = shlex.split(hint[len("fp32 weights: "):], posix=os.name != "nt")  # Windows: cmd.exe's quoting
    assert cmd[1:4] == ["-m", "zspeed", "to-fp32"], cmd
    conv = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert conv.returncode == 0, conv.stderr
    assert (out / "model_fp32.safetensors").is_file()
    rows = (out / "loss.csv").read_text().splitlines()
    assert rows[0] == "step,loss,loss_ema" and len(rows) == 7, rows
    assert all(float(r.split(",")[1]) > 0 for r in rows[1:])
    xml.dom.minidom.parse(str(out / "loss.svg"))
    assert "loss curve: " in res.stdout


# -- the README's numbers ------------------------------------------------------------------------

def test_readme_numbers_come_from_the_results_table():
    """Every number in the README's results section is in bench/RESULTS.md's table of quoted
    numbers, each row naming machine, date, commit and command (bench/plots.py reads the same
    table for the pictures), and every picture the README shows exists."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import plots
    finally:
        sys.path.pop(0)
    rows = plots.quoted_rows(ROOT / "bench" / "RESULTS.md")
    assert rows, "no table of quoted numbers in bench/RESULTS.md"
    for r in rows:
        for col in ("machine", "date", "commit", "command"):
            assert r[col].strip() and r[col].strip() != "-", (col, r)
        assert re.fullmatch(r"[0-9a-f]{7,40}", r["commit"].strip("` ")), r
    values = {v for r in rows for v in plots.numbers(" ".join(r[c] for c in ("what", "value", "gpu_memory",
                                                                           "machine", "date")))}
    readme = (ROOT / "README.md").read_text()
    sections = re.findall(r"<!-- numbers:begin -->(.*?)<!-- numbers:end -->", readme, re.S)
    assert len(sections) >= 2, "the README's quick-start times and results are marked <!-- numbers:begin/end -->"
    section = "\n".join(sections)
    quoted = plots.numbers(re.sub(r"\([^)]*RESULTS[^)]*\)|`[^`]*`|\[[^\]]*\]\([^)]*\)", "", section))
    missing = sorted(set(quoted) - values)
    assert not missing, f"README numbers not in bench/RESULTS.md's table: {missing}"
    for img in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):
        assert (ROOT / img).is_file(), img
