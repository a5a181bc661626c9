"""Can the GPU step part of the CPU's share of the optimizer by streaming its state?

At ZeRO-3 with both offloads the step is about the CPU's share of AdamW plus the backward
(bench/RESULTS.md, "The split and overlap_forward at ZeRO-3"), and the CPU's AdamW is bound by host memory
bandwidth. This benchmark measures, on one machine with a CUDA GPU, the three numbers that
decide whether a fourth place to step -- fp32 masters and moments kept in page-locked host
memory, copied to the GPU chunk by chunk, stepped there by torch's fused AdamW, copied back --
would shorten that share:

- ``cpu``: zspeed's CPUAdam on N elements (bf16 gradients in, fp32 masters and moments,
  bf16 weights out: the CPU half's step), alone;
- ``stream``: the streamed step on N elements (the gradients already on the GPU in bf16,
  as the reducer leaves them; per chunk: masters and moments in, fused AdamW, masters,
  moments and the bf16 weights out, on two streams so copies in and out overlap), alone;
- ``both``: the two at once on two halves of 2N elements (the CPU in a thread: ctypes drops
  the GIL during the C step), so their contention for host memory shows.

It prints each one's Gparam/s, the combined rate, and the ratio of ``both`` to ``cpu`` (the
speed-up of the CPU share if the streamed tier took its part). Medians of ``--steps`` rounds.

    python bench/bench_stream_step.py --n 268435456 --threads 16 --steps 7
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1 << 28, help="elements per half (default 2^28)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="zspeed's threads")
    ap.add_argument("--steps", type=int, default=7, help="timed rounds (medians)")
    ap.add_argument("--chunk", type=int, default=1 << 24, help="elements per streamed chunk")
    return ap.parse_args()


def main():
    args = parse()
    os.environ.setdefault("ZSPEED_NUM_THREADS", str(args.threads))
    sys.path.insert(0, str(ROOT / "python"))
    lib = ROOT / "build" / "libzspeed.so"
    if "ZSPEED_LIBRARY" not in os.environ and lib.is_file():
        os.environ["ZSPEED_LIBRARY"] = str(lib)
    import torch

    from zspeed.ops.adam import CPUAdam

    if not torch.cuda.is_available():
        sys.exit("bench_stream_step: needs a CUDA GPU (the streamed step runs on it)")
    dev = torch.device("cuda", 0)
    n, chunk = args.n, min(args.chunk, args.n)
    print(f"# bench_stream_step: n={n} chunk={chunk} threads={args.threads} steps={args.steps} "
          f"gpu={torch.cuda.get_device_name(0)} torch={torch.__version__} "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)

    # The CPU half: what HostPath steps at ZeRO-3 (bf16 gradients in, bf16 weights out).
    p = torch.rand(n)
    g16 = (torch.rand(n) - 0.5).to(torch.bfloat16)
    out = torch.empty(n, dtype=torch.bfloat16)
    opt = CPUAdam([p], lr=1e-3, weight_decay=0.01, num_threads=args.threads)

    def cpu_step():
        opt.step(grads=[[g16]], fp16_param_groups=[[out]])

    # The streamed half: page-locked masters, moments and weight shards; bf16 gradients on the GPU.
    hm = torch.rand(n).pin_memory()
    hexp = torch.zeros(n).pin_memory()
    hsq = torch.zeros(n).pin_memory()
    hw = torch.empty(n, dtype=torch.bfloat16).pin_memory()
    dg = ((torch.rand(n) - 0.5).to(torch.bfloat16)).to(dev)
    bufs = [[torch.empty(chunk, device=dev) for _ in range(4)] for _ in range(2)]  # m, a, s, g32
    wbuf = [torch.empty(chunk, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    copy_in, copy_out = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    compute = torch.cuda.current_stream(dev)
    lr = torch.tensor(1e-3, device=dev)
    steps = [torch.tensor(1.0, device=dev) for _ in range(2)]
    freed = [None, None]  # per buffer: the copy-out event after which it may be refilled

    def stream_step():
        for k, lo in enumerate(range(0, n, chunk)):
            b = k % 2
            m, a, s, g = bufs[b]
            c = min(chunk, n - lo)
            m, a, s, g, w = m[:c], a[:c], s[:c], g[:c], wbuf[b][:c]
            with torch.cuda.stream(copy_in):
                if freed[b] is not None:
                    copy_in.wait_event(freed[b])
                m.copy_(hm[lo:lo + c], non_blocking=True)
                a.copy_(hexp[lo:lo + c], non_blocking=True)
                s.copy_(hsq[lo:lo + c], non_blocking=True)
                arrived = copy_in.record_event()
            compute.wait_event(arrived)
            g.copy_(dg[lo:lo + c])
            steps[b].fill_(2.0)
            torch._fused_adamw_([m], [g], [a], [s], [], [steps[b]], lr=lr, beta1=0.9, beta2=0.999,
                                weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
            w.copy_(m)
            stepped = compute.record_event()
            with torch.cuda.stream(copy_out):
                copy_out.wait_event(stepped)
                hm[lo:lo + c].copy_(m, non_blocking=True)
                hexp[lo:lo + c].copy_(a, non_blocking=True)
                hsq[lo:lo + c].copy_(s, non_blocking=True)
                hw[lo:lo + c].copy_(w, non_blocking=True)
                freed[b] = copy_out.record_event()
        torch.cuda.synchronize(dev)

    def both():
        t = threading.Thread(target=cpu_step)
        t.start()
        stream_step()
        t.join()

    cases = [("cpu", n, cpu_step), ("stream", n, stream_step), ("both", 2 * n, both)]
    for _, _, fn in cases:
        fn()  # warm-up: pages touched, kernels loaded
    times = {name: [] for name, _, _ in cases}
    for _ in range(args.steps):  # round-robin, so a load change hits every case alike
        for name, _, fn in cases:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    rate = {}
    print(f"{'case':8s} {'elements':>12s} {'s/step':>8s} {'Gparam/s':>9s}")
    for name, elems, _ in cases:
        sec = statistics.median(times[name])
        rate[name] = elems / sec / 1e9
        print(f"{name:8s} {elems:12d} {sec:8.4f} {rate[name]:9.3f}  (runs: "
              f"{', '.join(f'{t:.4f}' for t in times[name])})")
    print(f"sum of alone: {rate['cpu'] + rate['stream']:.3f} Gparam/s; both at once: {rate['both']:.3f} "
          f"({rate['both'] / (rate['cpu'] + rate['stream']):.2f} of the sum); "
          f"both / cpu alone: {rate['both'] / rate['cpu']:.2f}x")


if __name__ == "__main__":
    main()
