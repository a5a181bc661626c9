"""zspeed plan's predicted step times against the steps measured on the H200 host (bench/RESULTS.md,
"The split and overlap_forward at ZeRO-3" and "ratio auto on a 24 GiB GPU"), with every rate
measured on the spot: the CPU Adam (fp32 and int8 states), the GPU's AdamW, and one transformer
block's forward and backward at the bench's shape. Run on the GPU host:

  python bench/plan_check.py        # one line per case: predicted, measured, ratio
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "python"))

from gpt import GPT, GPTConfig  # noqa: E402
from zspeed.planner import plan  # noqa: E402

# (layers, d_model, checkpointing, {candidate row: measured step s}); GPU capped at 24 GiB, batch 8 x 1024
CASES = [(24, 2048, False, {"ZeRO-2 + CPU offload, ratio auto": 0.302, "ZeRO-2 + CPU offload, ratio 1": 0.410}),
         (16, 4096, True, {"ZeRO-3, both offloaded, ratio auto": 0.853, "ZeRO-3, both offloaded to CPU": 1.380}),
         (32, 4096, True, {"ZeRO-3, both offloaded, int8 states, ratio auto": 1.672})]


def main() -> int:
    if not torch.cuda.is_available():
        print("plan_check: needs a GPU (the forward and backward are timed on it)")
        return 2
    worst = 0.0
    for layers, d, ckpt, steps in CASES:
        with torch.device("meta"):
            m = GPT(GPTConfig(vocab_size=32000, max_len=1024, d_model=d, n_layer=layers, n_head=d // 128))
        rep = plan(m, gpu_memory=24, host_memory=125, batch=8, seq=1024, ckpt=ckpt)
        mm = rep.machine
        print(f"{layers} x {d}{' ckpt' if ckpt else ''}: forward+backward {mm['fwd_bwd_s']:.3f} s ({mm['fwd_bwd_from']}), "
              f"CPU Adam {mm['cpu_ns']:.3f} ns (int8 {mm['int8_ns']:.3f}), GPU AdamW {mm['gpu_ns']:.4f} ns", flush=True)
        for row, measured in steps.items():
            c = next(c for c in rep.candidates if c.name.startswith(row))
            r = c.step_s / measured
            worst = max(worst, abs(r - 1))
            print(f"  {c.name:<60} predicted {c.step_s:.3f} s  measured {measured:.3f} s  ratio {r:.2f}", flush=True)
    print(f"RESULT worst deviation {100 * worst:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
