"""GPU check of data-parallel ZeRO (run on a CUDA machine): 2 ranks against one process,
with CUDA models. On a machine with one GPU both ranks share it through Gloo (NCCL
needs one GPU per rank); with two or more GPUs it also runs NCCL, one GPU per rank.

  python tests/gpu/check_dp_cuda.py [gloo] [nccl]   # default: every backend the machine allows

Same comparisons and tolerances as tests/python/test_dp.py (which runs them on the CPU);
prints PASS/FAIL per case and exits non-zero on any failure."""
import os
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE.parent.parent / "python"))
import test_dp as T  # noqa: E402

CASES = [(1, "none", "fp32"), (2, "none", "bf16"), (2, "cpu", "fp32"), (2, "cpu", "bf16"), (2, "nvme", "bf16")]


def main() -> int:
    if not torch.cuda.is_available():
        print("check_dp_cuda: no CUDA device")
        return 2
    backends = [("gloo", "cuda:0")]
    if torch.cuda.device_count() >= 2:
        backends.append(("nccl", None))
    wanted = set(sys.argv[1:])
    if wanted:
        backends = [b for b in backends if b[0] in wanted]
    bad = 0
    for backend, forced in backends:
        for stage, dev, prec in CASES:
            with tempfile.TemporaryDirectory() as d:
                tmp = Path(d)
                os.environ["ZSPEED_DEVICE"] = "cuda:0"
                ref = T._run(1, T._cfg(stage, dev, prec, 1, clip=0.5, mb=6, tmp=tmp), tmp, "ref", groups=True)[0]
                env = {"ZSPEED_DIST_BACKEND": backend}
                if forced:
                    env["ZSPEED_DEVICE"] = forced
                else:
                    env["ZSPEED_DEVICE"] = ""
                os.environ.update(env)
                try:
                    outs = T._run(2, T._cfg(stage, dev, prec, 1, clip=0.5, mb=3, tmp=tmp), tmp, "dp", groups=True)
                    tol = (1e-5, 1e-6) if prec == "fp32" else (2e-2, 2e-2)
                    for o in outs:
                        T._close(o, ref, *tol)
                    for k in outs[0]["state"]:
                        assert torch.equal(outs[0]["state"][k], outs[1]["state"][k]), k
                    print(f"PASS {backend} stage {stage} offload {dev} {prec}", flush=True)
                except Exception as e:  # noqa: BLE001 - report every case
                    bad += 1
                    print(f"FAIL {backend} stage {stage} offload {dev} {prec}: {str(e)[-1500:]}", flush=True)
        # offload_optimizer.overlap_forward: units all-gathered from the background step (on
        # CUDA: a copy stream, events, and with NCCL a process group of its own).
        os.environ.update(ZSPEED_DIST_BACKEND=backend, ZSPEED_DEVICE=forced or "")
        for case in [(1, "fp32", "mlp", 3), (2, "bf16", "mlp", 3), (2, "fp32", "lm", 4)]:
            with tempfile.TemporaryDirectory() as d:
                try:
                    T.test_overlap_forward_on_ranks_equals_the_synchronous_step(Path(d), *case)
                    print(f"PASS {backend} overlap_forward {case}", flush=True)
                except Exception as e:  # noqa: BLE001 - report every case
                    bad += 1
                    print(f"FAIL {backend} overlap_forward {case}: {str(e)[-1500:]}", flush=True)
        # Every rank starts from rank 0's weights (replicate.py: the broadcast runs on the
        # device with NCCL, from host memory through Gloo).
        import test_replicate as R
        try:
            R.test_every_rank_starts_from_rank_0s_weights_at_every_stage(
                env={"ZSPEED_DIST_BACKEND": backend, "ZSPEED_DEVICE": forced or ""})
            print(f"PASS {backend} ranks start from rank 0's weights", flush=True)
        except Exception as e:  # noqa: BLE001 - report every case
            bad += 1
            print(f"FAIL {backend} ranks start from rank 0's weights: {str(e)[-1500:]}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
