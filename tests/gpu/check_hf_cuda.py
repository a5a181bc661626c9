"""CUDA check of the Hugging Face Trainer route (run on a GPU machine with transformers):
examples/hf_trainer.py at ZeRO-2 + CPU offload and at ZeRO-3 with parameters and optimizer
state offloaded, on the GPU (the Trainer's inputs and zspeed's model on the same device),
checkpointed at step 3 and resumed (the resumed steps 4-6 repeat the uninterrupted run's
losses to a relative 1e-5: the same kernels on the same data; zspeed resumes bit-exactly, the
Trainer restores the data order and the RNG); and an evaluation-only run at ZeRO-3, whose engine
has no optimizer. Prints one PASS/FAIL line per check; exit 1 if any fails.

    python tests/gpu/check_hf_cuda.py
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "hf_trainer.py")
FAILS = []


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)
    if not ok:
        FAILS.append(name)


def run(args):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                          "MASTER_PORT", "ZSPEED_DEVICE")}
    res = subprocess.run([sys.executable, EXAMPLE, *args], env=env, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        print(res.stdout[-3000:] + res.stderr[-3000:], flush=True)
    return res.returncode


def main():
    import torch
    if not torch.cuda.is_available():
        print("SKIP  no CUDA device")
        return 0
    for stage in (2, 3):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "run")
            base = ["--out", out, "--max_steps", "6", "--save_steps", "3", "--stage", str(stage)]
            rc = run(base)
            check(f"stage {stage}: trains on the GPU", rc == 0)
            if rc:
                continue
            full = json.load(open(os.path.join(out, "summary.json")))
            check(f"stage {stage}: zspeed's engine on cuda", full["engine"] == "zspeed.runtime.engine"
                  and full["device"].startswith("cuda"), f"{full['engine']} {full['device']}")
            check(f"stage {stage}: the loss falls", full["losses"][-1] < full["losses"][0],
                  f"{full['losses'][0]:.4f} -> {full['losses'][-1]:.4f}")
            rc = run(base + ["--resume", os.path.join(out, "checkpoint-3")])
            check(f"stage {stage}: resumes from checkpoint-3", rc == 0)
            if rc:
                continue
            res = json.load(open(os.path.join(out, "summary_resumed.json")))
            a, b = full["losses"][3:], res["losses"][3:]
            ok = len(a) == len(b) == 3 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b))
            check(f"stage {stage}: the resumed steps repeat the run's losses", ok, f"{a} vs {b}")
    with tempfile.TemporaryDirectory() as d:  # an evaluation-only run: an engine without an optimizer
        rc = run(["--out", d, "--stage", "3", "--eval_only"])
        check("stage 3: evaluate() without training runs", rc == 0)
        if not rc:
            got = json.load(open(os.path.join(d, "summary_eval.json")))
            # The plain loss is the model's on the CPU before the Trainer took it: fp32 on two
            # devices, so to a relative 1e-4.
            rel = abs(got["eval_loss"] - got["plain_loss"]) / abs(got["plain_loss"])
            check("stage 3: evaluate() gives the plain model's loss, with no optimizer",
                  rel <= 1e-4 and got["optimizer"] == "None", f"{got['eval_loss']} vs {got['plain_loss']}")
    print(f"check_hf_cuda: {'FAIL' if FAILS else 'PASS'} ({len(FAILS)} failed)")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
