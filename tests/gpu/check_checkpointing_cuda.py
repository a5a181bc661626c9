"""GPU check of zspeed.checkpointing with cpu_checkpointing (run on a CUDA machine): the saved
inputs go to page-locked host memory and come back ahead of recomputation; gradients must
equal an uncheckpointed run's bit for bit, and the GPU memory held between forward and
backward must drop.

  python tests/gpu/check_checkpointing_cuda.py
"""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0] + "/python")
from zspeed import checkpointing  # noqa: E402


def run(mode: str):
    torch.manual_seed(0)
    d, n = 1024, 8
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                                     torch.nn.Dropout(0.1), torch.nn.Linear(4 * d, d))
                                 for _ in range(n)).cuda()
    x = torch.randn(64, 512, d, device="cuda", requires_grad=True)
    checkpointing.reset()
    if mode == "cpu":
        checkpointing.configure(None, checkpoint_in_cpu=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.manual_seed(1)
    h = x
    for b in blocks:
        h = b(h) if mode == "plain" else checkpointing.checkpoint(b, h)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    h.float().square().mean().backward()
    torch.cuda.synchronize()
    return [p.grad.clone() for p in blocks.parameters()] + [x.grad.clone()], held


def main() -> int:
    if not torch.cuda.is_available():
        print("check_checkpointing_cuda: no CUDA device")
        return 2
    ref, held_plain = run("plain")
    bad = 0
    for mode in ("gpu", "cpu"):
        grads, held = run(mode)
        same = all(torch.equal(a, b) for a, b in zip(ref, grads))
        print(f"{'PASS' if same else 'FAIL'} checkpoint ({mode} copies): gradients equal the plain run; "
              f"GPU memory held after forward {held / 2**20:.0f} MiB (plain {held_plain / 2**20:.0f} MiB)")
        bad += not same
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
