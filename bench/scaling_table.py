"""Scaling table from bench/gpu_host.sh scaling logs (issue 17).

    python bench/scaling_table.py DIR [DIR ...]

Reads every ``scaling_<case>_<impl>_<n>gpu.log`` under the folders (the ``RESULT {json}``
line bench_engine.py prints on rank 0) and prints, per case, one markdown row per
implementation and GPU count: step time, tokens/s, tokens/s per GPU, the scaling
efficiency (tokens/s per GPU relative to the same implementation on the fewest GPUs
measured, normally 1), zspeed's ratio to DeepSpeed at the same count, peak GPU memory and
host memory per rank. Logs without a RESULT line (a failed run) are listed as such.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

NAME = re.compile(r"scaling_(?P<case>.+)_(?P<impl>zspeed|deepspeed|torch)_(?P<n>\d+)gpu\.log$")


def read(dirs: list) -> dict:
    """case -> impl -> n -> RESULT dict (None for a run without one)."""
    out: dict = {}
    for d in dirs:
        for f in sorted(Path(d).glob("scaling_*gpu.log")):
            m = NAME.search(f.name)
            if not m:
                continue
            res = None
            for line in f.read_text(errors="replace").splitlines():
                if line.startswith("RESULT "):
                    res = json.loads(line[len("RESULT "):])
            out.setdefault(m["case"], {}).setdefault(m["impl"], {})[int(m["n"])] = res
    return out


def table(case: str, runs: dict) -> str:
    rows = [f"### {case}", "",
            "| impl | GPUs | step s | tokens/s | tokens/s per GPU | scaling efficiency | vs DeepSpeed | "
            "GPU peak GiB | host GiB per rank |",
            "|---|---|---|---|---|---|---|---|---|"]
    for impl in sorted(runs, key=lambda i: (i != "zspeed", i)):
        by_n = runs[impl]
        ok = {n: r for n, r in by_n.items() if r}
        base = min(ok) if ok else None
        for n in sorted(by_n):
            r = by_n[n]
            if r is None:
                rows.append(f"| {impl} | {n} | failed (no RESULT line) | | | | | | |")
                continue
            per = r["tokens_per_s"] / n
            eff = per / (ok[base]["tokens_per_s"] / base)
            ds = runs.get("deepspeed", {}).get(n)
            vs = f"{r['tokens_per_s'] / ds['tokens_per_s']:.2f}x" if impl != "deepspeed" and ds else ""
            host = max(r.get("host_rss_gib_per_rank") or [0])
            rows.append(f"| {impl} | {n} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {per:,.0f} | "
                        f"{100 * eff:.0f}% (vs {base} GPU) | {vs} | {r['peak_alloc_gib']:.2f} | {host:.1f} |")
    return "\n".join(rows)


def main(argv: list) -> int:
    if not argv:
        print(__doc__)
        return 2
    data = read(argv)
    if not data:
        print("no scaling_*gpu.log files found")
        return 1
    print("\n\n".join(table(case, runs) for case, runs in sorted(data.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
