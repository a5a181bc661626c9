#!/usr/bin/env python3
"""NVMe optimizer offload benchmark: one command, one Markdown row.

Runs ``zspeed bench swap`` (the C benchmark: swap step vs max(disk time of
the bytes a step moves, in-RAM step), all measured per round in the same
run) and, with ``--python``, the same step through
``zspeed.ops.swap.NVMeOptimizerSwapper`` on numpy buffers, to show what the
Python layer costs. Prints the C benchmark's report and a row for
bench/RESULTS.md.

    python bench/bench_swap.py --params 2^28 --folder /path/on/nvme
    python bench/bench_swap.py --params 2^26 --folder /tmp --python

Builds ``build/`` with CMake (Release) if ``build/zspeed`` is missing;
``--build DIR`` points at another tree.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _count(s: str) -> int:
    return 1 << int(s[2:]) if s.startswith("2^") else int(float(s))


def _pretty(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_c(exe: Path, a) -> dict:
    args = [str(exe), "bench", "swap", "--params", str(a.params), "--partition",
            str(a.partition), "--folder", a.folder, "--state", a.state,
            "--buffers", str(a.buffers), "--steps", str(a.steps), "--backend", a.backend]
    human = subprocess.run(args, capture_output=True, text=True)
    print(human.stdout, end="")
    if human.returncode != 0:
        sys.exit(f"zspeed bench swap failed:\n{human.stderr}")
    # The JSON run repeats the measurement; both are printed, the JSON one
    # makes the table row.
    res = subprocess.run(args + ["--json"], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_python(a) -> float:
    """Median NVMeOptimizerSwapper.step seconds on numpy buffers."""
    sys.path.insert(0, str(ROOT / "python"))
    import numpy as np

    from zspeed.ops.swap import NVMeOptimizerSwapper
    sizes = [min(a.partition, a.params - i) for i in range(0, a.params, a.partition)]
    rng = np.random.default_rng(0)
    st = {"f32": "fp32", "bf16": "bf16", "q8": "int8"}[a.state]
    with NVMeOptimizerSwapper(sizes, a.folder, state_dtype=st, buffer_count=a.buffers,
                              weight_decay=0.01, backend=a.backend, overwrite=True,
                              name="zspeed_bench_swap_py") as sw:
        for i, n in enumerate(sizes):
            sw.init_partition(i, rng.uniform(-1, 1, n).astype(np.float32))
        grads = [(rng.uniform(-0.01, 0.01, n).astype(np.float32).view(np.uint32) >> 16)
                 .astype(np.uint16) for n in sizes]
        outs = [np.empty(n, np.uint16) for n in sizes]
        times = []
        for _ in range(a.steps + 1):
            t0 = time.perf_counter()
            sw.step(grads, out=outs, grad_dtype="bf16", out_dtype="bf16")
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=_count, default=1 << 26)
    ap.add_argument("--partition", type=_count, default=1 << 22)
    ap.add_argument("--folder", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--state", choices=["f32", "bf16", "q8"], default="f32")
    ap.add_argument("--buffers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--python", action="store_true",
                    help="also time the step through the Python wrapper")
    a = ap.parse_args()
    exe = Path(a.build) / ("zspeed.exe" if os.name == "nt" else "zspeed")
    if not exe.exists():
        # One command on a fresh host: configure and build the release tree.
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        print(f"{exe} not found: building it", flush=True)
        subprocess.run(["cmake", "-S", str(ROOT), "-B", a.build, *gen,
                        "-DCMAKE_BUILD_TYPE=Release"], check=True)
        subprocess.run(["cmake", "--build", a.build, "--parallel"], check=True)
    r = run_c(exe, a)
    py = ""
    if a.python:
        os.environ.setdefault("ZSPEED_LIBRARY", str(Path(a.build) / "libzspeed.so"))
        t = run_python(a)
        py = f" Python wrapper step {t:.3f} s."
        print(f"python: NVMeOptimizerSwapper.step median {t:.3f} s "
              f"(C {r['swap_step_s']:.3f} s)")
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    print("\n| date | machine | params | state | disk GB/s (r+w) | I/O bound s | "
          "RAM step s | swap step s | ratio | compute / read wait / write wait s |")
    print(f"| {day} | {_cpu_model()}, {os.cpu_count()} cpus, {r['backend']}"
          f"{', direct' if r['direct'] else ''} | {_pretty(a.params)}"
          f" ({r['partitions']} parts) | {r['state']} | {r['disk_gbps_rw']:.2f} | "
          f"{r['io_bound_s']:.3f} | {r['ram_step_s']:.3f} | {r['swap_step_s']:.3f} | "
          f"{r['ratio']:.3f} | {r['compute_s']:.3f} / {r['read_wait_s']:.3f} / "
          f"{r['write_wait_s']:.3f} |{py}")


if __name__ == "__main__":
    main()
