#!/usr/bin/env python3
"""AdamW step throughput: zspeed (fp32 / bf16 / int8 states and the offload
case) vs torch.optim.AdamW(fused=True), torch foreach and DeepSpeed's
cpu_adam, in one process, same N and thread count, next to a STREAM-like
copy measured in the same run.

    python bench/bench_adam.py --threads 16 --n 268435456

Cases are timed round-robin (one step of each per round) so load changes on
a shared machine hit all alike; all cases are allocated at once (about
110 bytes per param in total: ~30 GB at N = 2^28).

torch's OpenMP workers busy-wait for a while after every torch operation
(libgomp's default wait policy); zspeed's own threads then share the cores
with spinning threads. DeepSpeed's cpu_adam uses OpenMP itself and so reuses
those threads. --omp-passive makes them sleep instead; RESULTS.md reports
both.

Run from the repository root after building (cmake ... && cmake --build
build); it finds build/libzspeed.so itself (or set ZSPEED_LIBRARY). Needs
numpy and torch; DeepSpeed is optional (pip install deepspeed; its cpu_adam
op is JIT-built on first use, which needs a C++ compiler and ninja). Prints
medians of --steps timed steps after one warm-up step, per case.

Byte model per param (what must cross the memory bus): fp32 states 28
(read p,g,m,v 16 + write p,m,v 12), bf16 states 20, int8 states 16.06,
offload (bf16 grad in, bf16 copy out, fp32 states) 28. The copy counts 8 B
per element (read + write), as STREAM does.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1 << 26, 1 << 28],
                    help="parameter counts (default 2^26 2^28)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads for zspeed and torch (default: all cores)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per case")
    ap.add_argument("--no-deepspeed", action="store_true",
                    help="skip DeepSpeed's cpu_adam")
    ap.add_argument("--omp-passive", action="store_true",
                    help="set OMP_WAIT_POLICY=PASSIVE before importing torch, "
                         "so torch's idle OpenMP workers sleep instead of "
                         "spinning on the cores zspeed's threads need")
    ap.add_argument("--cases", default="all",
                    help="comma list of case names to run (default all)")
    return ap.parse_args()


def main():
    args = parse()
    # The default zspeed pool is sized when the library first runs a step.
    os.environ.setdefault("ZSPEED_NUM_THREADS", str(args.threads))
    if args.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    sys.path.insert(0, str(ROOT / "python"))
    lib = ROOT / "build" / "libzspeed.so"
    if "ZSPEED_LIBRARY" not in os.environ and lib.is_file():
        os.environ["ZSPEED_LIBRARY"] = str(lib)
    import torch

    from zspeed._native import lib as zlib
    from zspeed.ops.adam import CPUAdam

    torch.set_num_threads(args.threads)
    simd = zlib.zs_simd_name(zlib.zs_simd_level()).decode()
    print(f"# bench_adam: threads={args.threads} steps={args.steps} "
          f"zspeed simd={simd} cpu={zlib.zs_cpu_model().decode()} "
          f"torch={torch.__version__} "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')} date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")

    ds_cls, ds_why = None, "skipped (--no-deepspeed)"
    if not args.no_deepspeed:
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            probe = torch.zeros(16, requires_grad=True)
            probe.grad = torch.zeros(16)
            DeepSpeedCPUAdam([probe]).step()
            ds_cls, ds_why = DeepSpeedCPUAdam, ""
        except Exception as e:  # any import or JIT-build failure: skip, say why
            ds_why = f"unavailable: {type(e).__name__}: {str(e).splitlines()[0][:160]}"

    wanted = None if args.cases == "all" else set(args.cases.split(","))
    for n in args.n:
        print(f"\n## N = {n} ({n / 2**20:.0f} Mi params)")
        results = {}

        def report(name, sec, bpp):
            results[name] = sec
            gp = n / sec / 1e9
            base = results.get("torch AdamW fused=True")
            ratio = f"{base / sec:7.2f}x" if base else "       -"
            print(f"{name:44s} {gp:9.3f} {bpp * gp:7.2f} {100 * bpp * gp / copy_gbs:5.0f}% "
                  f"{ratio} {sec * 1e3:8.2f}", flush=True)

        def fp32_case(make_opt):
            p = torch.rand(n)
            p.grad = torch.rand(n) - 0.5
            opt = make_opt([p])
            return lambda: opt.step()

        cases = [
            ("torch AdamW fused=True", 28,
             lambda: fp32_case(lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True))),
            ("torch AdamW foreach=True", 28,
             lambda: fp32_case(lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True))),
        ]
        if ds_cls is not None:
            cases.append(("deepspeed cpu_adam (fp32)", 28,
                          lambda: fp32_case(lambda ps: ds_cls(ps, lr=1e-3))))
        for sd, bpp in (("fp32", 28), ("bf16", 20), ("int8", 16 + 16 / 256)):
            cases.append((f"zspeed CPUAdam {sd} states", bpp,
                          lambda sd=sd: fp32_case(lambda ps: CPUAdam(
                              ps, lr=1e-3, state_dtype=sd, num_threads=args.threads))))

        def offload_torch():
            p = torch.rand(n)
            g16 = (torch.rand(n) - 0.5).to(torch.bfloat16)
            out = torch.empty(n, dtype=torch.bfloat16)
            opt = torch.optim.AdamW([p], lr=1e-3, fused=True)

            def step():
                p.grad = g16.float()   # cast 1: bf16 grads -> fp32
                opt.step()
                out.copy_(p)           # cast 2: fp32 params -> bf16 copy
            return step

        def offload_zspeed():
            p = torch.rand(n)
            g16 = (torch.rand(n) - 0.5).to(torch.bfloat16)
            out = torch.empty(n, dtype=torch.bfloat16)
            opt = CPUAdam([p], lr=1e-3, num_threads=args.threads)
            return lambda: opt.step(grads=[[g16]], fp16_param_groups=[[out]])

        cases.append(("offload: torch fused + 2 casts (bf16 in/out)", 28, offload_torch))
        cases.append(("offload: zspeed bf16 in -> fp32 -> bf16 out", 28, offload_zspeed))

        def copy_case():
            src = torch.rand(n)
            dst = torch.empty(n)
            return lambda: dst.copy_(src)

        cases.insert(0, ("copy", 8, copy_case))
        cases = [c for c in cases if c[0] == "copy" or not wanted or c[0] in wanted]
        # All cases live at once and are timed round-robin, one step each per
        # round, so a load change on a shared machine hits every case alike.
        fns = []
        for name, bpp, make in cases:
            fn = make()
            fn()  # warm-up: allocates lazily created state, touches pages
            fns.append(fn)
        times = [[] for _ in cases]
        for _ in range(args.steps):
            for k, fn in enumerate(fns):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
        copy_gbs = 8 * n / statistics.median(times[0]) / 1e9
        print(f"copy (STREAM-like, torch copy_, 8 B/elem): {copy_gbs:.2f} GB/s")
        print(f"{'case':44s} {'Gparam/s':>9s} {'GB/s':>7s} {'%copy':>6s} "
              f"{'vs fused':>8s} {'ms/step':>8s}")
        for (name, bpp, _), ts in zip(cases[1:], times[1:]):
            report(name, statistics.median(ts), bpp)
        del fns
        if ds_cls is None:
            print(f"{'deepspeed cpu_adam':44s} {ds_why}")

        fused = results.get("torch AdamW fused=True")
        best = min([v for k, v in results.items()
                    if k in ("torch AdamW fused=True", "deepspeed cpu_adam (fp32)")] or [0])
        z32 = results.get("zspeed CPUAdam fp32 states")
        if best and z32:
            print(f"target fp32 >= 1.0x best of torch fused/DeepSpeed: {best / z32:.2f}x; "
                  f">= 90% of copy: {100 * 28 * n / z32 / 1e9 / copy_gbs:.0f}%")
        if results.get("offload: torch fused + 2 casts (bf16 in/out)") and \
                results.get("offload: zspeed bf16 in -> fp32 -> bf16 out"):
            print("target offload >= 1.5x torch: "
                  f"{results['offload: torch fused + 2 casts (bf16 in/out)'] / results['offload: zspeed bf16 in -> fp32 -> bf16 out']:.2f}x")
        if fused and results.get("zspeed CPUAdam int8 states"):
            print(f"target int8 >= 1.6x torch fused fp32: "
                  f"{fused / results['zspeed CPUAdam int8 states']:.2f}x")


if __name__ == "__main__":
    main()
