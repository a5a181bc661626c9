"""`make demo`: train a small GPT on a bundled public-domain novel with ZeRO-Offload.

A character-level GPT (examples/gpt.py, ~0.8M parameters by default) learns
*Pride and Prejudice* (data/, public domain; see data/README.md). The fp32 master
weights and the AdamW state live in CPU memory and are updated by zspeed's native
CPU optimizer (ZeRO-2 with offload_optimizer cpu); the model runs on the GPU if
there is one (bf16), else on the CPU (fp32). A progress bar shows loss, tokens/s
and memory; at the end a text sample is generated, the loss curve is saved next to the
checkpoint (loss.csv, and loss.svg to look at in a browser) and the checkpoint location
printed with the command that consolidates its fp32 weights.

    python examples/demo_train.py [--steps 1200] [--out runs/demo]
"""
import argparse
import math
import os
import shlex
import sys
import time

import torch
from tqdm import tqdm

import zspeed

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt import GPT, GPTConfig  # noqa: E402

CORPUS = os.path.join(HERE, "..", "data", "pride_and_prejudice.txt")


def native_optimizer_available() -> bool:
    try:
        from zspeed.ops import adam  # noqa: F401
        return True
    except Exception:  # ImportError (ops not built into this tree) or NativeError (libzspeed missing)
        return False


def memory_text(device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.max_memory_allocated(device) / 2**20:.0f}MiB gpu"
    try:
        import resource
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return f"{rss / (2**20 if sys.platform == 'darwin' else 2**10):.0f}MiB rss"
    except ImportError:  # Windows has no resource module
        return "n/a"


def write_loss_curve(out_dir: str, losses: list) -> tuple:
    """Saves the per-step training loss as loss.csv (step, loss, its running average) and
    loss.svg (a plain line chart: no plotting package needed); returns both paths."""
    os.makedirs(out_dir, exist_ok=True)
    csv_path, svg_path = os.path.join(out_dir, "loss.csv"), os.path.join(out_dir, "loss.svg")
    ema, rows = None, []
    for i, lv in enumerate(losses, 1):
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        rows.append((i, lv, ema))
    with open(csv_path, "w", encoding="utf-8") as f:
        f.write("step,loss,loss_ema\n" + "".join(f"{i},{lv:.5f},{e:.5f}\n" for i, lv, e in rows))
    w, h, left, bottom, top, right = 640, 360, 56, 40, 16, 16
    hi = max(lv for _, lv, _ in rows) if rows else 1.0
    n = max(1, len(rows))
    def xy(i, v):
        return (left + (w - left - right) * (i - 1) / max(1, n - 1), top + (h - top - bottom) * (1 - v / hi))
    def line(pts, color, width):
        return (f'<polyline fill="none" stroke="{color}" stroke-width="{width}" points="'
                + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
    raw = [xy(i, lv) for i, lv, _ in rows]
    avg = [xy(i, e) for i, _, e in rows]
    ticks = "".join(f'<text x="{left - 6}" y="{xy(1, v)[1] + 4:.1f}" text-anchor="end">{v:.1f}</text>'
                    f'<line x1="{left}" x2="{w - right}" y1="{xy(1, v)[1]:.1f}" y2="{xy(1, v)[1]:.1f}" '
                    f'stroke="#ddd"/>' for v in [hi * k / 4 for k in range(5)])
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>{ticks}'
           f'{line(raw, "#9ecae1", 1)}{line(avg, "#08519c", 2)}'
           f'<text x="{(w + left) / 2}" y="{h - 8}" text-anchor="middle">step (1 to {len(rows)})</text>'
           f'<text x="{left + 8}" y="{top + 14}">training loss, nats/char (light: per step; dark: running '
           f'average)</text></svg>\n')
    with open(svg_path, "w", encoding="utf-8") as f:
        f.write(svg)
    return csv_path, svg_path


def _shown(path: str) -> str:
    """``path`` as the user can type it from the current folder (quoted for this platform's
    shell; on Windows a path on another drive has no relative form)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = path
    shown = rel if not rel.startswith("..") else path
    if os.name == "nt":
        import subprocess
        return subprocess.list2cmdline([shown])
    return shlex.quote(shown)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--out", default=os.path.join("runs", "demo"))
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--sample-chars", type=int, default=400)
    ap.add_argument("--delayed-update", action="store_true",
                    help="offload_optimizer.delayed_update: the CPU step overlaps the next step (one step stale)")
    ap.add_argument("--overlap-forward", action="store_true",
                    help="offload_optimizer.overlap_forward: the CPU step runs during the next forward (exact)")
    args = ap.parse_args(argv)

    text = open(CORPUS, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(len(data) * 0.95)
    train, val = data[:split], data[split:]

    cuda = torch.cuda.is_available()
    native = native_optimizer_available()
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.95], "weight_decay": 0.1,
                                                  "torch_adam": not native}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": args.steps,
                                                           "warmup_num_steps": max(2, args.steps // 20),
                                                           "warmup_type": "linear", "cos_min_ratio": 0.1}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True,
                                                               "delayed_update": args.delayed_update,
                                                               "overlap_forward": args.overlap_forward}},
        "bf16": {"enabled": bool(cuda and torch.cuda.is_bf16_supported())},
        "steps_per_print": 0,
    }
    torch.manual_seed(args.seed)
    gcfg = GPTConfig(vocab_size=len(chars), max_len=args.ctx, d_model=args.d_model, n_layer=args.layers,
                     n_head=max(1, args.d_model // 32))
    model = GPT(gcfg)
    engine, optimizer, _, _ = zspeed.initialize(model=model, config=config)
    dev = engine.device
    print(f"zspeed demo: GPT {model.num_params() / 1e6:.2f}M params, vocab {len(chars)} chars, "
          f"{len(text) / 1e3:.0f}k chars of Pride and Prejudice (public domain)")
    print(f"  model on {dev} ({engine.dtype}); fp32 masters + AdamW state in CPU memory "
          f"({'zspeed native CPUAdam' if native else 'torch AdamW on the CPU: libzspeed ops not available'})")

    g = torch.Generator().manual_seed(args.seed)

    def batch(src):
        idx = torch.randint(0, len(src) - args.ctx - 1, (args.batch,), generator=g)
        x = torch.stack([src[i:i + args.ctx] for i in idx])
        y = torch.stack([src[i + 1:i + args.ctx + 1] for i in idx])
        return x.to(dev), y.to(dev)

    tokens_per_step = args.batch * args.ctx
    bar = tqdm(range(args.steps), desc="train", unit="step", dynamic_ncols=True)
    t0, ema, losses = time.perf_counter(), None, []
    for step in bar:
        x, y = batch(train)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        lv = loss.item()
        losses.append(lv)
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        tps = tokens_per_step * (step + 1) / (time.perf_counter() - t0)
        bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{tps:,.0f}", mem=memory_text(dev))
    bar.close()

    engine.eval()
    with torch.no_grad():
        vl = sum(engine(*batch(val)).item() for _ in range(10)) / 10
    print(f"validation loss {vl:.3f} nats/char (perplexity {math.exp(vl):.2f}); "
          f"{engine.global_steps} steps, {engine.skipped_steps} skipped")
    prompt = "Elizabeth"
    ids = torch.tensor([[stoi[c] for c in prompt]], device=dev)
    out = model.generate(ids, args.sample_chars, temperature=0.8, top_k=20,
                         generator=torch.Generator(device=dev).manual_seed(args.seed))
    print("\n--- sample ---\n" + "".join(chars[i] for i in out[0].tolist()) + "\n--------------")
    ckpt = os.path.join(args.out, "checkpoints")
    engine.save_checkpoint(ckpt, client_state={"chars": "".join(chars), "gpt_config": gcfg.to_dict()})
    print(f"checkpoint: {os.path.abspath(os.path.join(ckpt, open(os.path.join(ckpt, 'latest')).read()))}")
    csv_path, svg_path = write_loss_curve(args.out, losses)
    print(f"loss curve: {_shown(svg_path)} (open it in a browser; the numbers: {_shown(csv_path)})")
    # The interpreter running this script has zspeed: its `-m zspeed` works whether or not
    # the venv's bin folder is on PATH.
    print(f"fp32 weights: {_shown(sys.executable)} -m zspeed to-fp32 {_shown(ckpt)} "
          f"{_shown(os.path.join(args.out, 'model_fp32.safetensors'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
