"""GPU check of zspeed.checkpointing with cpu_checkpointing (run on a CUDA machine): the saved
inputs go to page-locked host memory and come back ahead of recomputation; gradients must
equal an uncheckpointed run's bit for bit, the GPU memory held between forward and
backward must drop, and the peak during backward must not exceed keeping the inputs on the
GPU (the copies come back one block ahead and are dropped after their recomputation).

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
    torch.cuda.reset_peak_memory_stats()
    h.float().square().mean().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return [p.grad.clone() for p in blocks.parameters()] + [x.grad.clone()], held, peak


def run_loop(mode: str, iters: int = 4):
    """Training iterations on one model, the previous loss (and its graph's host copies) alive
    while the next forward runs, as in a training loop: from the third iteration on the host
    copies reuse page-locked blocks, so no cudaHostAlloc synchronizes the device any more. Each
    block's input is made by a kernel queued behind a 2 ms GPU sleep: a copy to the host that
    did not wait for it would save stale memory. Per iteration, the gradients."""
    torch.manual_seed(0)
    d, n = 512, 6
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                                     torch.nn.Linear(4 * d, d)) for _ in range(n)).cuda()
    checkpointing.reset()
    if mode == "cpu":
        checkpointing.configure(None, checkpoint_in_cpu=True)
    g = torch.Generator(device="cuda").manual_seed(3)
    out, loss = [], None
    for _ in range(iters):
        x = torch.randn(16, 1024, d, device="cuda", generator=g, requires_grad=True)
        h = x
        for b in blocks:
            torch.cuda._sleep(2_000_000)
            h = h * 1.0  # written after the sleep
            h = h + (b(h) if mode == "plain" else checkpointing.checkpoint(b, h))
        torch.cuda.synchronize()
        loss = h.float().square().mean()
        loss.backward()
        out.append([p.grad.clone() for p in blocks.parameters()] + [x.grad.clone()])
        for p in blocks.parameters():
            p.grad = None
    return out


def main() -> int:
    if not torch.cuda.is_available():
        print("check_checkpointing_cuda: no CUDA device")
        return 2
    ref, held_plain, _ = run("plain")
    bad = 0
    peaks = {}
    for mode in ("gpu", "cpu"):
        grads, held, peaks[mode] = run(mode)
        same = all(torch.equal(a, b) for a, b in zip(ref, grads))
        print(f"{'PASS' if same else 'FAIL'} checkpoint ({mode} copies): gradients equal the plain run; "
              f"GPU memory held after forward {held / 2**20:.0f} MiB (plain {held_plain / 2**20:.0f} MiB), "
              f"peak during backward {peaks[mode] / 2**20:.0f} MiB")
        bad += not same
    ref_it = run_loop("plain")
    for mode in ("gpu", "cpu"):
        its = run_loop(mode)
        same = [all(torch.equal(a, b) for a, b in zip(r, o)) for r, o in zip(ref_it, its)]
        print(f"{'PASS' if all(same) else 'FAIL'} checkpoint ({mode} copies) over {len(its)} iterations: "
              f"gradients equal the plain run's in each ({same})")
        bad += not all(same)
    lower = peaks["cpu"] <= peaks["gpu"]
    print(f"{'PASS' if lower else 'FAIL'} cpu_checkpointing's backward peak ({peaks['cpu'] / 2**20:.0f} MiB) "
          f"does not exceed keeping the inputs on the GPU ({peaks['gpu'] / 2**20:.0f} MiB)")
    bad += not lower
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
