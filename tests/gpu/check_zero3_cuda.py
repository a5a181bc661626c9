"""GPU check of ZeRO-3 (run on a CUDA machine): the single-process cases of
tests/python/test_zero3.py, test_inference.py, test_split.py and test_split_zero3.py (the
optimizer split between GPU and CPU), test_overlap_forward.py, test_step_atomic.py,
test_grads_in_shards.py, test_tensor_fragments.py and test_zero_init_config.py on the GPU, then the multi-rank cases with CUDA models (ZeRO-3, the
split at stages 1-3 with and without overlap_forward, the gradients in the shards): 2 ranks sharing GPU 0 through Gloo (Windows' backend), and with two
or more GPUs 2 ranks on NCCL, one GPU each.

  python tests/gpu/check_zero3_cuda.py [gloo] [nccl]   # default: every backend the machine allows

Same comparisons and tolerances as the CPU suite; prints PASS/FAIL per case and exits
non-zero on any failure."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "python"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(HERE.parent.parent / "python"))


def main() -> int:
    if not torch.cuda.is_available():
        print("check_zero3_cuda: no CUDA device")
        return 2
    bad = 0
    env = dict(os.environ, ZSPEED_DEVICE="cuda:0")
    if os.environ.get("ZS_GPU_GATE") == "1":  # tests/gpu/gate.py ran the whole suite on cuda:0 already
        return _rank_cases(bad)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                        str(TESTS / "test_zero3.py"), str(TESTS / "test_inference.py"),
                        str(TESTS / "test_split.py"), str(TESTS / "test_split_zero3.py"),
                        str(TESTS / "test_overlap_forward.py"),
                        str(TESTS / "test_step_atomic.py"), str(TESTS / "test_grads_in_shards.py"),
                        str(TESTS / "test_tensor_fragments.py"), str(TESTS / "test_zero_init_config.py")], env=env,
                       capture_output=True, text=True)
    print(("PASS" if r.returncode == 0 else "FAIL") + " single-process cases on cuda:0: " +
          r.stdout.strip().splitlines()[-1], flush=True)
    if r.returncode:
        print(r.stdout[-6000:], flush=True)
    bad += r.returncode != 0
    return _rank_cases(bad)


def _rank_cases(bad: int) -> int:
    import test_zero3 as T  # noqa: E402
    backends = [("gloo", "cuda:0")]
    if torch.cuda.device_count() >= 2:
        backends.append(("nccl", ""))
    wanted = set(sys.argv[1:])
    if wanted:
        backends = [b for b in backends if b[0] in wanted]
    for backend, device in backends:
        os.environ.update(ZSPEED_DIST_BACKEND=backend, ZS_RANK_DEVICE=device)
        for case in T.RANK_CASES:
            if case[0] != 2:
                continue
            with tempfile.TemporaryDirectory() as d:
                try:
                    os.environ["ZSPEED_DEVICE"] = "cpu"  # the one-process reference
                    T.test_ranks_match_stage2_and_one_process(Path(d), *case)
                    print(f"PASS {backend} {case}", flush=True)
                except Exception as e:  # noqa: BLE001 - report every case
                    bad += 1
                    print(f"FAIL {backend} {case}: {type(e).__name__}: {str(e)[-3000:]}", flush=True)
        import test_split_zero3 as S  # noqa: E402
        split_cases = [("zero3 split", S.test_zero3_split_on_ranks_equals_plain_offload, (2, 0.5, "fp32", 1), "cpu"),
                       *[(f"split stage {st}", S.test_split_on_ranks_equals_plain_offload_and_overlaps_exactly,
                          (st, "fp32"), device or "cuda") for st in (1, 2, 3)]]
        import test_grads_in_shards as G  # noqa: E402
        split_cases.append(("grads in shards", G.test_two_ranks_equal_a_separate_gradient_buffer, (), "cpu"))
        for name, fn, case, dev in split_cases:
            with tempfile.TemporaryDirectory() as d:
                try:
                    os.environ["ZSPEED_DEVICE"] = dev
                    fn(Path(d), *case)
                    print(f"PASS {backend} {name} {case}", flush=True)
                except Exception as e:  # noqa: BLE001 - report every case
                    bad += 1
                    print(f"FAIL {backend} {name} {case}: {type(e).__name__}: {str(e)[-3000:]}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
