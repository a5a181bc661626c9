"""The ``zspeed`` command (``python -m zspeed``).

Subcommands: ``report`` (environment report, ``--json``), ``plan`` (what fits: planner.py), ``to-fp32``
(consolidate a checkpoint's fp32 weights, like DeepSpeed's zero_to_fp32),
``launch`` (DeepSpeed's launcher command line, see launch.py) and ``bench``
(the native command's benchmarks: adam, io, swap).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ._native import ZSpeedError


def _cmd_report(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="zspeed report",
        description="What zspeed sees on this machine: build, OS, CPU and SIMD "
                    "level, memory and page-lock limit, I/O backends, CUDA "
                    "driver, and the Python side (numpy, torch, GPUs). Exits "
                    "with status 1, after the whole report, when ZSPEED_SIMD or "
                    "ZSPEED_AIO_BACKEND asks for something that is refused or "
                    "the library is missing or of another version.")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    from .report import build
    text, problems = build(as_json=args.json)
    sys.stdout.write(text)
    if not problems:
        return 0
    sys.stdout.flush()
    n = len(problems)
    sys.stderr.write(f"zspeed report: {n} problem{'' if n == 1 else 's'} with this "
                     f"environment:\n" + "".join(f"  {p}\n" for p in problems))
    return 1


def _cmd_to_fp32(argv: List[str]) -> int:
    from .runtime.checkpoint_fp32 import main_to_fp32
    return main_to_fp32(argv)


def _cmd_plan(argv: List[str]) -> int:
    from .planner import main as plan_main
    return plan_main(argv)


def _cmd_launch(argv: List[str]) -> int:
    from .launch import main as launch_main
    return launch_main(argv)


def native_command() -> Optional[Path]:
    """The native ``zspeed`` executable (src/cli) that goes with this package: the wheel
    carries it in ``zspeed/bin/``; a source checkout's package (python/zspeed, used in
    place) finds the one CMake built in ``build/``. None when neither exists."""
    exe = "zspeed.exe" if os.name == "nt" else "zspeed"
    here = Path(__file__).resolve().parent
    for candidate in (here / "bin" / exe, here.parent.parent / "build" / exe):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _cmd_bench(argv: List[str]) -> int:
    """``zspeed bench ...`` runs the native command's benchmarks (they time the C library
    with no Python in the loop), so the command is the same however zspeed was installed."""
    exe = native_command()
    if exe is None:
        sys.stderr.write(
            "zspeed bench: the native benchmark command is not part of this installation. It comes "
            "with the wheel (pip install . from a zspeed checkout) or with a CMake build of the "
            "checkout (cmake -S . -B build && cmake --build build, then build/zspeed bench ...).\n")
        return 2
    try:
        return subprocess.run([str(exe), "bench", *argv]).returncode
    except KeyboardInterrupt:
        return 130


COMMANDS: Dict[str, tuple] = {
    "bench": (_cmd_bench, "run a benchmark of the C library: bench adam | io | swap ... "
                          "(bench --help lists them)"),
    "launch": (_cmd_launch, "start a training script on several processes (DeepSpeed's "
                            "`deepspeed` launcher, over torchrun)"),
    "plan": (_cmd_plan, "which ZeRO stage, offload tiers and state dtype fit a model on this machine "
                        "(or one you describe), with the bytes per tier"),
    "report": (_cmd_report, "print the environment report (--json for JSON)"),
    "to-fp32": (_cmd_to_fp32, "consolidate a checkpoint's fp32 weights (of any world "
                              "size) into one safetensors file (zero_to_fp32)"),
}


def _usage() -> str:
    rows = "\n".join(f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items())
    return f"usage: zspeed <command> [options]\n\ncommands:\n{rows}\n"


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        out = sys.stdout if argv else sys.stderr
        out.write(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from ._version import __version__
        print(f"zspeed {__version__}")
        return 0
    entry = COMMANDS.get(argv[0])
    if entry is None:
        sys.stderr.write(f"zspeed: unknown command '{argv[0]}'\n\n{_usage()}")
        return 2
    fn: Callable[[List[str]], int] = entry[0]
    try:
        return fn(argv[1:])
    except ZSpeedError as e:
        sys.stderr.write(f"zspeed {argv[0]}: {e}\n")
        return 1
