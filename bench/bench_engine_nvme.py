"""Engine step time with offload_optimizer.device nvme vs cpu (one command, Markdown rows).

Model: a stack of square bf16 Linear layers (``--params`` elements in total) with a
trivial loss, so the optimizer step dominates; on a GPU machine the model runs on the
GPU (the offload data path with pinned buffers and async copies), else on the CPU.
For nvme the row also shows the swapper's own split of the step (compute vs waiting
on reads / writes) and the bytes it moved.

    python bench/bench_engine_nvme.py --params 2^24 --folder <dir on the NVMe> [--steps 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import zspeed  # noqa: E402


def _count(text: str) -> int:
    if "^" in text:
        b, e = text.split("^")
        return int(b) ** int(e)
    return int(float(text))


def bench(device: str, params: int, folder: str, steps: int, state_dtype: str, sub: int) -> tuple[float, dict]:
    width = 4096
    layers = max(1, params // (width * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "steps_per_print": 0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "state_dtype": state_dtype}},
           "zero_optimization": {"stage": 2, "sub_group_size": sub,
                                 "offload_optimizer": {"device": device, "nvme_path": folder,
                                                       "pin_memory": True, "buffer_count": 4}},
           "aio": {"block_size": 1 << 20, "queue_depth": 32, "intra_op_parallelism": 2}}
    e, *_ = zspeed.initialize(model=model, config=cfg)
    x = torch.randn(1, width, device=e.device, dtype=e.dtype)
    times = []
    for s in range(steps + 1):
        loss = e(x).float().square().mean()
        e.backward(loss)
        if e.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        e.step()
        if e.device.type == "cuda":
            torch.cuda.synchronize()
        if s:  # the first step also warms up the files and buffers
            times.append(time.perf_counter() - t0)
        if s == 0 and device == "nvme":
            e.nvme_stats(reset=True)
    st = e.nvme_stats()[0] if device == "nvme" else {}
    e.close()
    return sorted(times)[len(times) // 2], st


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="2^24", help="parameters (e.g. 2^24 or 1e8)")
    ap.add_argument("--folder", default=None, help="nvme_path (default: a temporary directory)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--state", default="fp32", choices=("fp32", "bf16", "int8"))
    ap.add_argument("--sub-group-size", type=int, default=1 << 23)
    a = ap.parse_args()
    n = _count(a.params)
    with tempfile.TemporaryDirectory(dir=a.folder) as folder:
        cpu, _ = bench("cpu", n, folder, a.steps, a.state, a.sub_group_size)
        nv, st = bench("nvme", n, folder, a.steps, a.state, a.sub_group_size)
    k = max(1, st.get("steps", 0))
    dev = "cuda" if torch.cuda.is_available() and os.environ.get("ZSPEED_DEVICE", "cuda") != "cpu" else "cpu"
    print("| params | state | model on | cpu offload step | nvme offload step | nvme compute | nvme read wait "
          "| nvme write wait | nvme MB moved/step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {n} | {a.state} | {dev} | {cpu * 1e3:.0f} ms | {nv * 1e3:.0f} ms | "
          f"{st['compute_ns'] / k / 1e6:.0f} ms | {st['read_wait_ns'] / k / 1e6:.0f} ms | "
          f"{st['write_wait_ns'] / k / 1e6:.0f} ms | "
          f"{(st['bytes_read'] + st['bytes_written']) / k / 2**20:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
