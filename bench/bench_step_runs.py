#!/usr/bin/env python3
"""The host optimizer step over a GPT's parameter list: one kernel call per parameter against
one call per run of parameters that lie end to end (CPUAdam.flatten_states, what the engine's
host path does), in one process, same data, same thread count, round-robin.

    python bench/bench_step_runs.py --d-model 512 --layers 24 --threads 2

The parameters are views of one flat fp32 buffer in a GPT's order (token embedding; per layer
two LayerNorms, the fused QKV, the attention output and the two MLP projections with their
biases; the final LayerNorm), the gradients bf16 views of another, the new bf16 weights
written out as the offloaded step does (AdamW, fp32 states). Prints the median of --steps
timed steps of each case after one warm-up step, the ratio, the time saved per parameter, and
checks that both cases end with the same weights bit for bit.

Run from the repository root after building (make build); it finds build/libzspeed.so itself
(or set ZSPEED_LIBRARY). Needs torch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("ZSPEED_LIBRARY", str(ROOT / "build" / "libzspeed.so"))

import torch  # noqa: E402

from zspeed.ops._torch_optim import CPUAdam  # noqa: E402


def gpt_sizes(d: int, layers: int, vocab: int) -> list:
    sizes = [vocab * d]
    for _ in range(layers):
        sizes += [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
    return sizes + [d, d]


def views(flat: torch.Tensor, sizes: list) -> list:
    out, at = [], 0
    for n in sizes:
        out.append(flat[at:at + n])
        at += n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    sizes = gpt_sizes(a.d_model, a.layers, a.vocab)
    n = sum(sizes)
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(n, generator=gen)
    grad = torch.randn(n, generator=gen).to(torch.bfloat16)
    cases = {}
    for name in ("per parameter", "runs"):
        master = start.clone()
        out = torch.empty(n, dtype=torch.bfloat16)
        opt = CPUAdam([{"params": views(master, sizes)}], lr=1e-3, weight_decay=0.01, num_threads=a.threads)
        if name == "runs":
            opt.flatten_states()
        cases[name] = (master, opt, [views(out, sizes)])
    gv = [views(grad, sizes)]
    times = {k: [] for k in cases}
    for step in range(a.steps + 1):
        for name, (_, opt, outs) in cases.items():
            t0 = time.perf_counter()
            opt.step(grads=gv, grad_scale=0.5, fp16_param_groups=outs)
            if step:
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    same = torch.equal(cases["per parameter"][0], cases["runs"][0])
    print(f"{len(sizes)} parameters, {n / 1e6:.1f}M elements, {a.threads} threads, median of {a.steps} steps")
    for k, v in med.items():
        print(f"  {k:14s} {v * 1e3:8.2f} ms")
    saved = med["per parameter"] - med["runs"]
    print(f"  runs / per parameter {med['runs'] / med['per parameter']:.3f}; saved {saved * 1e3:.2f} ms "
          f"({saved / len(sizes) * 1e6:.1f} us per parameter); same weights bit for bit: {same}")
    if not same:
        sys.exit("the two cases differ")


if __name__ == "__main__":
    main()
