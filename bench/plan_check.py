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

# (layers, d_model, checkpointing, the ratio-1 run's measured forward+backward s,
#  {candidate row: measured step s}); GPU capped at 24 GiB, batch 8 x 1024
CASES = [(24, 2048, False, 0.12, {"ZeRO-2 + CPU offload, ratio auto": 0.302, "ZeRO-2 + CPU offload, ratio 1": 0.410}),
         (16, 4096, True, 0.519, {"ZeRO-3, both offloaded, ratio auto": 0.853,
                                  "ZeRO-3, both offloaded to CPU": 1.380}),
         (32, 4096, True, 0.965, {"ZeRO-3, both offloaded, int8 states, ratio auto": 1.672})]


def main() -> int:
    if not torch.cuda.is_available():
        print("plan_check: needs a GPU (the forward and backward are timed on it)")
        return 2
    worst = {"timed here": 0.0, "measured fwd+bwd given": 0.0}
    for layers, d, ckpt, fb, steps in CASES:
        with torch.device("meta"):
            m = GPT(GPTConfig(vocab_size=32000, max_len=1024, d_model=d, n_layer=layers, n_head=d // 128))
        rep = plan(m, gpu_memory=24, host_memory=125, batch=8, seq=1024, ckpt=ckpt)
        mm = rep.machine
        given = plan(m, gpu_memory=24, host_memory=125, batch=8, seq=1024, ckpt=ckpt, fwd_bwd_seconds=fb,
                     cpu_seconds_per_element=mm["cpu_ns"] * 1e-9, int8_seconds_per_element=mm["int8_ns"] * 1e-9,
                     gpu_seconds_per_element=mm["gpu_ns"] * 1e-9)
        print(f"{layers} x {d}{' ckpt' if ckpt else ''}: forward+backward {mm['fwd_bwd_s']:.3f} s ({mm['fwd_bwd_from']}; "
              f"the run measured {fb} s; + {mm['fetch_s']:.3f} s of ZeRO-3 weight fetches), CPU Adam {mm['cpu_ns']:.3f} ns (int8 {mm['int8_ns']:.3f}), GPU AdamW "
              f"{mm['gpu_ns']:.4f} ns", flush=True)
        for row, measured in steps.items():
            for how, r in (("timed here", rep), ("measured fwd+bwd given", given)):
                c = next(c for c in r.candidates if c.name.startswith(row))
                q = c.step_s / measured
                worst[how] = max(worst[how], abs(q - 1))
                print(f"  {c.name:<60} {how:<24} predicted {c.step_s:.3f} s  measured {measured:.3f} s  "
                      f"ratio {q:.2f}", flush=True)
    print("RESULT worst deviation: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
