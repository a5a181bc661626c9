"""The GPU gate: every GPU check of zspeed in one command, ending with one summary line.

    python tests/gpu/gate.py [--log-dir DIR] [--workers N]
    bench/gpu_host.sh gpu-checks          # the same, with the host's set-up (logs in $OUT)

What it runs, on cuda:0 (the CPU suite cannot see stream, device or allocator bugs):

1. the Python suite's engine files (GPU_FILES; ``--all``: all of tests/python) with CUDA
   models: ZSPEED_DEVICE=cuda:0, so every single-process engine a test builds trains on the
   GPU; a test that cannot run there skips saying why (multi-rank cases run their ranks on
   the CPU with Gloo unless a check below puts them on the GPU); with pytest-xdist, N workers
   share the GPU (default: 8, or fewer on a machine with fewer cores);
2. each check script of tests/gpu (engine offload path, checkpointing, data-parallel ranks
   with CUDA models, ZeRO-3 ranks with CUDA models, the Hugging Face Trainer route), each
   printing one PASS/FAIL line per case.

A check script that exits non-zero without a FAIL line (a crash) counts as one failure. The
last line is ``gpu-checks: N passed, M failed``; the exit status is 1 when M > 0, 2 without a
GPU.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# The files of tests/python whose engines train a model on the device: the gate's default pytest
# run (--all runs the whole suite, the rest of which skips or runs on the CPU anyway).
GPU_FILES = ["test_zero3.py", "test_inference.py", "test_split.py", "test_split_zero3.py", "test_overlap_forward.py",
             "test_step_atomic.py", "test_grads_in_shards.py", "test_tensor_fragments.py", "test_zero_init_config.py",
             "test_zero_grad.py", "test_step_transaction.py", "test_checkpointing.py", "test_offload_states.py"]
CHECKS = ["check_engine_cuda.py", "check_checkpointing_cuda.py", "check_dp_cuda.py", "check_zero3_cuda.py",
          "check_hf_cuda.py"]


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python")] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    env.update(extra)
    return env


def run_pytest(log_dir: Path, workers: int, everything: bool) -> tuple[int, int, int, list]:
    """(passed, failed, skipped, failed test ids) of tests/python with CUDA models."""
    xml = log_dir / "gpu-pytest.xml"
    where = ROOT / "tests" / "python"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", f"--junitxml={xml}",
           *([str(where)] if everything else [str(where / f) for f in GPU_FILES])]
    try:
        import xdist  # noqa: F401
        if workers > 1:
            cmd[4:4] = ["-n", str(workers)]
    except ImportError:
        pass
    with open(log_dir / "gpu-pytest.log", "w") as log:
        subprocess.run(cmd, env=_env(ZSPEED_DEVICE="cuda:0"), stdout=log, stderr=subprocess.STDOUT,
                       cwd=ROOT / "tests" / "python")
    if not xml.exists():
        return 0, 1, 0, ["tests/python (pytest wrote no report: see gpu-pytest.log)"]
    passed = failed = skipped = 0
    bad = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = {c.tag for c in case}
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if kinds & {"failure", "error"}:
            failed += 1
            bad.append(name)
        elif "skipped" in kinds:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, bad


def run_check(script: str, log_dir: Path) -> tuple[int, int, list]:
    """(PASS lines, FAIL lines, failed lines) of one check script (a crash is one failure)."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(HERE / script)], env=_env(ZS_GPU_GATE="1"), capture_output=True,
                       text=True, cwd=ROOT)
    out = r.stdout + ("\n" + r.stderr if r.stderr else "")
    (log_dir / (Path(script).stem + ".log")).write_text(out)
    passes = len(re.findall(r"^PASS\b", r.stdout, flags=re.M))
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    if r.returncode not in (0, 1) or (r.returncode == 1 and not fails):
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        fails.append(f"FAIL {script} exited with status {r.returncode}: {tail[0][:300]}")
    print(f"{script}: {passes} passed, {len(fails)} failed ({time.monotonic() - t0:.0f} s)", flush=True)
    return passes, len(fails), fails


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-dir", default=os.environ.get("OUT", "gpu-checks-logs"))
    ap.add_argument("--workers", type=int, default=min(8, max(1, (os.cpu_count() or 2) // 2)))
    ap.add_argument("--only", choices=["pytest", "checks"], help="run one half only")
    ap.add_argument("--all", action="store_true", help="the whole Python suite on cuda:0, not only GPU_FILES")
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("gpu-checks: no CUDA device (this gate runs on a GPU machine)")
        return 2
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"gpu-checks on {torch.cuda.get_device_name(0)}, torch {torch.__version__}; logs in {log_dir}", flush=True)
    passed = failed = skipped = 0
    failures: list = []
    if args.only != "checks":
        t0 = time.monotonic()
        p, f, s, bad = run_pytest(log_dir, args.workers, args.all)
        print(f"tests/python on cuda:0: {p} passed, {f} failed, {s} skipped ({time.monotonic() - t0:.0f} s)",
              flush=True)
        passed, failed, skipped = passed + p, failed + f, skipped + s
        failures += [f"FAIL {b}" for b in bad]
    if args.only != "pytest":
        for script in CHECKS:
            p, f, bad = run_check(script, log_dir)
            passed, failed = passed + p, failed + f
            failures += bad
    for line in failures:
        print(line[:400])
    print(f"({skipped} skipped: each says why in gpu-pytest.log)")
    print(f"gpu-checks: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
