"""zspeed plan's predicted step times against steps measured in the same run, on the same card.

For each case (GPU capped at 24 GiB, batch 8 x 1024, the bench's GPT shapes), the real training
step is timed first (bench/bench_engine.py in a subprocess, so that its memory is gone before
the next case), then `zspeed plan` predicts the same configuration with every rate measured on
the spot (the CPU Adam with fp32 and int8 states, the GPU's AdamW, one transformer block's
forward and backward at the bench's shape). Each line: predicted, measured, ratio; the last line
is the worst deviation. Run on a GPU host:

  python bench/plan_check.py [--cases z2-auto z3-auto ...] [--steps 6]

Cases (ZS_PLAN_CASES or --cases; default all but the 6.58B one, which needs about 70 GiB of
host memory and several minutes): z2-one, z2-auto (1.28B ZeRO-2 + CPU offload, ratio 1 / "auto"
+ overlap_forward), z3-one, z3-auto (3.36B ZeRO-3, both offloads, checkpointing, ratio 1 /
"auto" + overlap_forward), z3-big-auto (6.58B, int8 states, "auto" + overlap_forward).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "python"))

# name -> (layers, d_model, checkpointing, the planner's candidate row, bench_engine arguments)
CASES = {
    "z2-one": (24, 2048, False, "ZeRO-2 + CPU offload, ratio 1", ["--stage", "2", "--ratio", "1"]),
    "z2-auto": (24, 2048, False, "ZeRO-2 + CPU offload, ratio auto",
                ["--stage", "2", "--ratio", "auto", "--overlap-forward"]),
    "z3-one": (16, 4096, True, "ZeRO-3, both offloaded to CPU", ["--stage", "3", "--offload-param", "cpu", "--ratio", "1"]),
    "z3-auto": (16, 4096, True, "ZeRO-3, both offloaded, ratio auto",
                ["--stage", "3", "--offload-param", "cpu", "--ratio", "auto", "--overlap-forward"]),
    "z3-big-auto": (32, 4096, True, "ZeRO-3, both offloaded, int8 states, ratio auto",
                    ["--stage", "3", "--offload-param", "cpu", "--state-dtype", "int8", "--ratio", "auto",
                     "--overlap-forward"]),
}
DEFAULT = ["z2-one", "z2-auto", "z3-one", "z3-auto"]


def measure(name: str, steps: int) -> dict:
    """The bench's RESULT of one case (median step, forward+backward), run here and now."""
    layers, d, ckpt, _row, args = CASES[name]
    cmd = [sys.executable, os.path.join(ROOT, "bench", "bench_engine.py"), "--gpu-cap", "24", "--batch", "8",
           "--seq", "1024", "--layers", str(layers), "--d-model", str(d), "--heads", str(d // 128),
           "--steps", str(steps), "--warmup", "2", *(["--ckpt"] if ckpt else []), *args]
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=os.environ.get("MASTER_PORT", "29517"))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"{name}: bench_engine failed ({r.returncode}): {(r.stderr or r.stdout)[-1500:]}")
    return json.loads(line[len("RESULT "):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=os.environ.get("ZS_PLAN_CASES", " ".join(DEFAULT)).split(),
                    choices=sorted(CASES))
    ap.add_argument("--steps", type=int, default=6, help="timed steps per case (after 2 warm-up steps)")
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("plan_check: needs a GPU (the steps and the forward and backward are timed on it)")
        return 2
    from gpt import GPT, GPTConfig
    from zspeed.planner import plan
    print(f"plan_check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    worst = {"timed here": 0.0, "measured fwd+bwd given": 0.0}
    for name in a.cases:
        layers, d, ckpt, row, _args = CASES[name]
        got = measure(name, a.steps)
        with torch.device("meta"):
            m = GPT(GPTConfig(vocab_size=32000, max_len=1024, d_model=d, n_layer=layers, n_head=d // 128))
        rep = plan(m, gpu_memory=24, host_memory=125, batch=8, seq=1024, ckpt=ckpt)
        mm = rep.machine
        given = plan(m, gpu_memory=24, host_memory=125, batch=8, seq=1024, ckpt=ckpt, fwd_bwd_seconds=got["fwd_bwd_s"],
                     cpu_seconds_per_element=mm["cpu_ns"] * 1e-9, int8_seconds_per_element=mm["int8_ns"] * 1e-9,
                     gpu_seconds_per_element=mm["gpu_ns"] * 1e-9)
        share = got.get("cpu_share")
        print(f"{name}: {layers} x {d}{' ckpt' if ckpt else ''}: measured step {got['step_s']:.3f} s (forward+"
              f"backward {got['fwd_bwd_s']:.3f} s, optimizer call {got.get('opt_step_s', float('nan')):.3f} s, CPU "
              f"share {'-' if share is None else format(share, '.3f')}, peak {got['peak_reserved_gib']:.2f} GiB "
              f"reserved); planner "
              f"forward+backward {mm['fwd_bwd_s']:.3f} s ({mm['fwd_bwd_from']}; + {mm['fetch_s']:.3f} s of ZeRO-3 "
              f"weight fetches), CPU Adam {mm['cpu_ns']:.3f} ns (int8 {mm['int8_ns']:.3f}), GPU AdamW "
              f"{mm['gpu_ns']:.4f} ns", flush=True)
        for how, r in (("timed here", rep), ("measured fwd+bwd given", given)):
            c = next(c for c in r.candidates if c.name.startswith(row))
            q = c.step_s / got["step_s"]
            worst[how] = max(worst[how], abs(q - 1))
            print(f"  {c.name:<60} {how:<24} predicted {c.step_s:.3f} s  measured {got['step_s']:.3f} s  "
                  f"ratio {q:.2f} (planner's CPU share {c.cpu_share:.3f}, CPU step {c.cpu_step_s or 0:.3f} s)",
                  flush=True)
    print("RESULT worst deviation: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
