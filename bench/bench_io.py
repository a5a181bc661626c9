#!/usr/bin/env python3
"""zspeed's aio engine against fio on the same file, alternating runs.

For each loop and direction (write, then read) it runs fio (io_uring engine,
direct=1, the same block size, queue depth and number of jobs) and
`zspeed bench io` (one loop, --json) back to back, swapping which goes first
every loop, and prints the median GB/s (10^9 bytes/s) of each and the ratio
zspeed/fio. Without fio (e.g. the GPU host) it says so, runs zspeed alone
and compares with the fio-less reference recorded in issue 4.

One command, from the repository root (builds build/zspeed if missing):

    python3 bench/bench_io.py --folder /path/on/nvme --size 4G

Options: --file/--folder, --size, --bs, --qd, --threads, --loops, --rw,
--backend, --zspeed (path of the zspeed binary), --keep (keep the file).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Issue 4: the H200 machine's disk, 2026-11-30, plain O_DIRECT threads.
REFERENCE = {"write": (2.3, 2.3), "read": (1.3, 1.5)}


def parse_size(s: str) -> int:
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B").rstrip("I")
    return int(float(s[:-1]) * mul[s[-1]]) if s[-1] in mul else int(s)


def find_zspeed(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("ZSPEED_BIN"):
        return os.environ["ZSPEED_BIN"]
    exe = REPO / "build" / ("zspeed.exe" if os.name == "nt" else "zspeed")
    if not exe.exists():
        print(f"building {exe} ...", flush=True)
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(["cmake", "-S", str(REPO), "-B", str(REPO / "build"), *gen,
                        "-DCMAKE_BUILD_TYPE=Release", "-DZSPEED_BUILD_TESTS=OFF"],
                       check=True)
        subprocess.run(["cmake", "--build", str(REPO / "build"), "--target",
                        "zspeed_cli", "-j", str(os.cpu_count() or 2)], check=True)
    return str(exe)


def run_fio(path: str, rw: str, size: int, bs: int, qd: int, jobs: int) -> float:
    per_job = size // jobs // bs * bs
    cmd = ["fio", "--name=zspeed_cmp", f"--filename={path}", f"--rw={rw}",
           f"--bs={bs}", f"--iodepth={qd}", f"--numjobs={jobs}",
           "--ioengine=io_uring", "--direct=1", f"--size={per_job}",
           f"--offset_increment={per_job}", "--group_reporting",
           "--output-format=json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    return job[rw]["bw_bytes"] / 1e9


def run_zspeed(exe: str, path: str, rw: str, size: int, bs: int, qd: int,
               jobs: int, backend: str) -> float:
    cmd = [exe, "bench", "io", "--file", path, "--rw", rw, "--size", str(size),
           "--block-size", str(bs), "--queue-depth", str(qd), "--threads",
           str(jobs), "--loops", "1", "--direct", "on", "--backend", backend,
           "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["gbps_median"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file")
    ap.add_argument("--folder", default=".")
    ap.add_argument("--size", default="4G")
    ap.add_argument("--bs", default="1M")
    ap.add_argument("--qd", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--loops", type=int, default=3)
    ap.add_argument("--rw", default="write,read")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--zspeed")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    size, bs = parse_size(a.size), parse_size(a.bs)
    path = a.file or os.path.join(a.folder, "zspeed_bench_io_cmp.bin")
    exe = find_zspeed(a.zspeed)
    have_fio = shutil.which("fio") is not None
    dirs = [d.strip() for d in a.rw.split(",") if d.strip()]
    print(f"machine: {platform.node()} {platform.platform()}, {os.cpu_count()} cpus")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"file: {path}, size {size / (1 << 30):.2f} GiB, bs {bs}, qd {a.qd}, "
          f"jobs/threads {a.threads}, loops {a.loops}, backend {a.backend}")
    if not have_fio:
        print("fio not found on this machine: running zspeed only and comparing "
              "with the fio-less reference of issue 4 (H200 host disk, plain "
              "O_DIRECT threads: write 2.3 GB/s, read 1.3-1.5 GB/s)")
    res = {d: {"fio": [], "zspeed": []} for d in dirs}
    try:
        for i in range(a.loops):
            for d in dirs:
                order = ["fio", "zspeed"] if i % 2 == 0 else ["zspeed", "fio"]
                for tool in order:
                    if tool == "fio" and not have_fio:
                        continue
                    if tool == "fio":
                        v = run_fio(path, d, size, bs, a.qd, a.threads)
                    else:
                        v = run_zspeed(exe, path, d, size, bs, a.qd, a.threads, a.backend)
                    res[d][tool].append(v)
                    print(f"  loop {i + 1} {d:5s} {tool:6s} {v:7.3f} GB/s", flush=True)
    finally:
        if not a.keep and os.path.exists(path):
            os.remove(path)
    print("\n| direction | fio GB/s (median) | zspeed GB/s (median) | zspeed/fio |")
    print("|---|---|---|---|")
    for d in dirs:
        z = statistics.median(res[d]["zspeed"])
        if have_fio:
            f = statistics.median(res[d]["fio"])
            print(f"| {d} | {f:.3f} | {z:.3f} | {z / f:.3f} |")
        else:
            lo, hi = REFERENCE[d]
            print(f"| {d} | (no fio; reference {lo}-{hi}) | {z:.3f} | "
                  f"{z / hi:.3f}-{z / lo:.3f} vs reference |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
