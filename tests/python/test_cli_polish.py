"""Issue 56, items 4 and 7: what the commands print and leave behind.

- `zspeed bench io` removes its scratch file (zspeed_bench_io.bin) when done, on an error and
  on Ctrl-C; `--file PATH` is used and kept.
- `zspeed bench adam` says what its percent column is a percent of.
- No log call prints a literal "%%" (a message with no arguments is not %-formatted) or
  trips on an unescaped "%" (one with arguments is).
- A wheel records the git commit and branch it was built from (cmake/zspeed_build_info.cmake
  writes zspeed/_build_info.py at build time; _version.py reads it), and the start-up summary
  prints them.
- `zspeed plan`'s table lines up whatever the length of a configuration's name."""
from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import zspeed
from zspeed.cli import native_command

ROOT = Path(__file__).resolve().parents[2]
PKG = Path(zspeed.__file__).resolve().parent
SCRATCH = "zspeed_bench_io.bin"


def _native():
    exe = native_command()
    if exe is None:
        pytest.skip("no native zspeed command here (no wheel installed, no build/zspeed)")
    return str(exe)


def _bench_io(cwd, *args, timeout=120):
    return subprocess.run([_native(), "bench", "io", "--size", "4M", "--buffer", "1M", "--loops", "1", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


# -- zspeed bench io: no 1 GiB file left behind ---------------------------------------------------

def test_bench_io_removes_its_scratch_file(tmp_path):
    res = _bench_io(tmp_path)
    assert res.returncode == 0, res.stderr
    assert "read: median" in res.stdout and "removed when done" in res.stdout, res.stdout
    assert list(tmp_path.iterdir()) == []
    sub = tmp_path / "sub"
    sub.mkdir()
    res = _bench_io(tmp_path, "--folder", str(sub), "--json", "--rw", "read")
    assert res.returncode == 0 and '"gbps_median"' in res.stdout, res
    assert list(tmp_path.iterdir()) == [sub] and list(sub.iterdir()) == []


def test_bench_io_keeps_the_file_given_with_file(tmp_path):
    keep = tmp_path / "mine.bin"
    res = _bench_io(tmp_path, "--file", str(keep), "--json")
    assert res.returncode == 0, res.stderr
    assert keep.is_file() and keep.stat().st_size == 4 << 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.bin"]
    usage = subprocess.run([_native(), "bench", "io", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"--file PATH .*\n.*keep it", usage), usage
    assert re.search(r"--folder DIR .*zspeed_bench_io\.bin", usage) and "removed" in usage, usage


@pytest.mark.skipif(os.name == "nt", reason="RLIMIT_FSIZE is POSIX")
def test_bench_io_removes_its_scratch_file_on_an_error(tmp_path):
    """A write that fails (here: past RLIMIT_FSIZE, EFBIG) ends the command with status 1 and
    the error, and the scratch file goes all the same."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    res = subprocess.run([_native(), "bench", "io", "--size", "4M", "--buffer", "1M", "--loops", "1", "--json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert res.returncode == 1 and "zspeed bench io:" in res.stderr, res
    assert list(tmp_path.iterdir()) == [], res.stderr


@pytest.mark.skipif(os.name == "nt", reason="POSIX signals")
def test_bench_io_removes_its_scratch_file_on_ctrl_c(tmp_path):
    """SIGINT removes the scratch file and the command dies of the signal (the exit status a
    shell expects)."""
    p = subprocess.Popen([_native(), "bench", "io", "--size", "64M", "--buffer", "4M", "--loops", "100000",
                          "--direct", "off", "--json"], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / SCRATCH).exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        assert (tmp_path / SCRATCH).exists(), "the benchmark never created its file"
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == -signal.SIGINT, (p.returncode, err)
    assert "interrupted" in err, err
    assert not (tmp_path / SCRATCH).exists()


# -- zspeed bench adam: a percent of what -------------------------------------------------------

def test_bench_adam_says_what_its_percent_is_of():
    res = subprocess.run([_native(), "bench", "adam", "--n", "100003", "--threads", "2", "--steps", "2"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    head = next(line for line in lines if line.startswith("case"))
    assert "% of copy GB/s" in head, head
    rows = [line for line in lines if line.startswith(("adamw", "offload"))]
    assert len(rows) == 4, res.stdout
    end = head.index("% of copy GB/s") + len("% of copy GB/s")
    for row in rows:  # each percent ends under the column's title
        assert row[end - 1] == "%" and row[end - 2].isdigit(), (head, row)
    assert re.search(r"^% of copy GB/s: that GB/s as a percent of the copy line's", res.stdout, re.M), res.stdout
    assert "can pass 100%" in res.stdout, res.stdout


# -- log calls and "%" --------------------------------------------------------------------------

_LEVELS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log", "warning_once"}
_SPEC = re.compile(r"%(\([^)]*\))?[#0\- +]*(\*|\d+)?(\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")


def _literal(node):
    """The text of a str constant, f-string (holes as NUL) or + concatenation; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal(node.left), _literal(node.right)
        return a + b if a is not None and b is not None else None
    return None


def _log_percent_problems(root: Path) -> list:
    bad = []
    for path in sorted(root.rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _LEVELS):
                continue
            base = n.func.value
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            if "log" not in name.lower():
                continue
            args = n.args[1:] if n.func.attr == "log" else n.args
            msg = _literal(args[0]) if args else None
            if msg is None:
                continue
            where = f"{path.relative_to(root.parent)}:{n.lineno}"
            if len(args) == 1:  # not %-formatted: "%%" prints as two characters
                if "%%" in msg:
                    bad.append(f"{where}: '%%' in a message without arguments prints '%%'")
            elif "%" in _SPEC.sub("", msg):
                bad.append(f"{where}: a '%' that is not a conversion in a message with arguments")
            elif not any(isinstance(a, ast.Starred) for a in args[1:]):
                convs = [m for m in _SPEC.finditer(msg) if not m.group().endswith("%")]
                if len(convs) != len(args) - 1 and not (len(args) == 2 and isinstance(args[1], ast.Dict)):
                    bad.append(f"{where}: {len(convs)} conversions for {len(args) - 1} arguments")
    return bad


def test_no_log_call_prints_a_double_percent():
    assert _log_percent_problems(PKG) == []


def test_the_scan_finds_the_mistakes_it_looks_for(tmp_path):
    (tmp_path / "m.py").write_text('log.warning("a 100.0%% b")\nlog.info("%d %", 3)\nlogger.error("%s %s", 1)\n'
                                   'log.warning("ok 100%")\nlog.info("%.1f%% ok", 2.0)\n')
    bad = _log_percent_problems(tmp_path)
    assert [b.split(":")[1] for b in bad] == ["1", "2", "3"], bad


# -- the git commit in the wheel -----------------------------------------------------------------

def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout.strip()


def _build_info(tmp_path, source) -> dict:
    """Runs the build step that writes zspeed/_build_info.py, as CMakeLists.txt does."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake here")
    script = ROOT / "cmake" / "zspeed_build_info.cmake"
    if not script.is_file():
        pytest.skip("not a zspeed checkout (no cmake/zspeed_build_info.cmake)")
    out = tmp_path / "_build_info.py"
    res = subprocess.run([cmake, f"-DSOURCE_DIR={source}", f"-DOUTPUT={out}", "-P", str(script)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    ns: dict = {}
    exec(out.read_text(), ns)
    return {k: ns[k] for k in ("git_hash", "git_branch")}


def _in_checkout() -> bool:
    return shutil.which("git") is not None and _git("rev-parse", "--show-toplevel") != "" and \
        Path(_git("rev-parse", "--show-toplevel")).resolve() == ROOT.resolve()


def test_the_build_records_the_commit_of_a_checkout(tmp_path):
    if not _in_checkout():
        pytest.skip("the tests do not run from a git checkout")
    info = _build_info(tmp_path, ROOT)
    assert info == {"git_hash": _git("rev-parse", "--short", "HEAD"),
                    "git_branch": _git("rev-parse", "--abbrev-ref", "HEAD")}
    # The source tree gets nothing: the file goes to the build folder, then the wheel.
    assert not (ROOT / "python" / "zspeed" / "_build_info.py").exists()


def test_the_build_records_none_outside_a_checkout(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "out").mkdir()
    assert _build_info(tmp_path / "out", src) == {"git_hash": None, "git_branch": None}


def test_an_installed_package_reports_the_recorded_commit(tmp_path):
    """A package with _build_info.py (what the wheel holds): _version, git_version_info and the
    start-up summary's first line carry the hash and branch; without it they are None."""
    pytest.importorskip("torch", reason="the summary needs the engine (torch)")
    from engine_helpers import native_ops_available
    if not native_ops_available():
        pytest.skip("libzspeed is not built")
    site = tmp_path / "site"
    shutil.copytree(PKG, site / "zspeed", ignore=shutil.ignore_patterns("__pycache__", "_build_info.py"))
    (site / "zspeed" / "_build_info.py").write_text('git_hash = "abc1234"\ngit_branch = "feature/x"\n')
    here = Path(__file__).resolve().parent
    code = ("import logging, sys\n"
            f"sys.path[:0] = [{str(site)!r}, {str(here)!r}]\n"
            "import zspeed, zspeed.git_version_info as g\n"
            "from zspeed._version import __git_hash__, __git_branch__\n"
            "assert zspeed.__file__.startswith(sys.path[0]), zspeed.__file__\n"
            "print('VERSION', __git_hash__, __git_branch__, g.git_hash, g.git_branch, zspeed.__git_hash__)\n"
            "from engine_helpers import OFFLOAD, config, mlp\n"
            "from zspeed.runtime.summary import summary_text\n"
            "engine, *_ = zspeed.initialize(model=mlp(), config=config(zero_optimization=OFFLOAD))\n"
            "print('SUMMARY', summary_text(engine).splitlines()[0])\n"
            "engine.close()\n")
    from zspeed import _native
    _native.load()
    env = dict(os.environ, ZSPEED_LIBRARY=str(_native.library_path()))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert "VERSION abc1234 feature/x abc1234 feature/x abc1234" in res.stdout, res.stdout
    assert re.search(r"^SUMMARY .*zspeed info: version=\S+, git-hash=abc1234, git-branch=feature/x$",
                     res.stdout, re.M), res.stdout
    (site / "zspeed" / "_build_info.py").unlink()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert "VERSION None None [none] [none] None" in res.stdout, res.stdout
    assert re.search(r"git-hash=unknown, git-branch=unknown$", res.stdout, re.M), res.stdout


def test_the_wheel_carries_the_commit():
    """The wheel make test-python builds (from this checkout) holds zspeed/_build_info.py with the
    commit, and the same _version.py as the sources."""
    wheel = os.environ.get("ZSPEED_WHEEL")
    if not wheel:
        pytest.skip("ZSPEED_WHEEL not set (make test-python sets it)")
    import zipfile
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "zspeed/_build_info.py" in names, names
        ns: dict = {}
        exec(z.read("zspeed/_build_info.py").decode(), ns)
        assert z.read("zspeed/_version.py") == (ROOT / "python" / "zspeed" / "_version.py").read_bytes()
    if _in_checkout():  # a commit of this checkout (HEAD when the wheel was built)
        assert ns["git_hash"] and _git("rev-parse", "--verify", "--quiet", ns["git_hash"] + "^{commit}"), ns


# -- zspeed plan: the table lines up --------------------------------------------------------------

def _cells(line: str) -> list:
    """(start, end) of each cell: cells are separated by two spaces or more."""
    return [(m.start(), m.end()) for m in re.finditer(r"\S+(?: \S+)*", line)]


def _check_table(text: str) -> int:
    lines = text.splitlines()
    h = next(i for i, line in enumerate(lines) if line.lstrip().startswith("configuration"))
    head = _cells(lines[h])
    assert len(head) == 7, lines[h]
    assert set(lines[h + 1].strip()) == {"-"} and len(lines[h + 1]) == len(lines[h]), lines[h + 1]
    rows = 0
    for line in lines[h + 2:]:
        if not line.strip():
            break
        if line.lstrip().startswith("does not fit:"):
            continue
        cells = _cells(line)
        assert len(cells) == 7, line
        # configuration and fits left-aligned (same start), the numbers right-aligned (same end)
        assert [c[0] for c in cells[:2]] == [c[0] for c in head[:2]], (lines[h], line)
        assert [c[1] for c in cells[2:]] == [c[1] for c in head[2:]], (lines[h], line)
        assert len(line) == len(lines[h]), (lines[h], line)
        rows += 1
    return rows


def test_plan_table_columns_line_up_for_any_name_length():
    from zspeed.planner import Candidate, PlanReport
    gib = 1 << 30
    machine = dict(dtype="bf16", batch=8, seq=1024, ckpt=False, gpus=2, gpu_gib=24.0, host_gib=125.0, disk_gib=900,
                   cores=16, cpu_ns=0.24, gpu_ns=0.01, fwd_bwd_s=None)
    cands = [Candidate("ZeRO-2, optimizer on the GPU", {"zero_optimization": {"stage": 2}},
                       tiers={"gpu": {"w": 30 * gib}}, fits=False, why=["GPU: 30.00 GiB > 24.00 GiB"]),
             Candidate("ZeRO-3, both offloaded, int8 states, ratio auto (GPU takes 83%)",
                       {"zero_optimization": {"stage": 3}}, tiers={"gpu": {"w": 3 * gib}, "host": {"m": 12345 * gib}},
                       cpu_step_s=12345.678, step_s=1.5),
             Candidate("x", {"zero_optimization": {"stage": 3}}, tiers={"nvme": {"s": 1.5 * gib}}, cpu_step_s=0.25,
                       step_s=123456.0),
             Candidate("ZeRO-3, parameters CPU, optimizer NVMe, a name longer than any the planner gives today",
                       {"zero_optimization": {"stage": 3}}, fits=False, why=["host"])]
    text = str(PlanReport(7 * 10 ** 9, machine, cands, []))
    assert _check_table(text) == 4, text


def test_plan_table_of_a_real_plan_lines_up():
    torch = pytest.importorskip("torch", reason="the planner sizes a torch model")
    from zspeed.planner import plan
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from gpt import GPT, GPTConfig
    finally:
        sys.path.remove(str(ROOT / "examples"))
    with torch.device("meta"):
        model = GPT(GPTConfig.gpt_1b())
    rep = plan(model, gpu_memory=24, host_memory=125, batch=8, seq=1024, cpu_seconds_per_element=2.4e-10)
    text = str(rep)
    assert _check_table(text) == len(rep.candidates), text
