"""A HelloDeepSpeed-style masked language model (train_bert_ds.py's shape: train,
checkpoint, resume) on random token data:

  python examples/masked_lm.py --out runs/mlm --steps 60            # trains, saves every 20 steps
  python examples/masked_lm.py --out runs/mlm --steps 100 --resume  # continues from the latest

Only the import differs from a DeepSpeed script.
"""
import argparse
import os

import torch

import zspeed as deepspeed

VOCAB, MASK, SEQ = 97, 0, 32


class TinyBert(torch.nn.Module):
    def __init__(self, d=64, layers=2, heads=4):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, d) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, ids, labels):
        h = self.enc(self.emb(ids) + self.pos)
        logits = self.head(h).float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


def batch(g, n=16):
    """Sequences with a learnable structure (token i+1 = token i + 1 mod VOCAB), 15% masked."""
    start = torch.randint(1, VOCAB, (n, 1), generator=g)
    ids = (start + torch.arange(SEQ)) % (VOCAB - 1) + 1
    mask = torch.rand(n, SEQ, generator=g) < 0.15
    labels = torch.where(mask, ids, torch.full_like(ids, -100))
    return ids.masked_fill(mask, MASK), labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--checkpoint_every", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = TinyBert()
    config = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10,
                                                                "total_num_steps": 1000, "warmup_max_lr": 3e-3}},
              "bf16": {"enabled": True},
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    ckpt = os.path.join(args.out, "checkpoints")
    start = 0
    if args.resume:
        path, client = engine.load_checkpoint(ckpt)
        if path is None:
            raise SystemExit(f"no checkpoint in {ckpt}")
        start = client["step"]
        print(f"resumed from {path} at step {start}", flush=True)
    g = torch.Generator().manual_seed(1000 + start)
    for step in range(start, args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            ids, labels = batch(g)
            loss = engine(ids.to(engine.device), labels.to(engine.device))
            engine.backward(loss)
            engine.step()
        if (step + 1) % args.checkpoint_every == 0:
            engine.save_checkpoint(ckpt, client_state={"step": step + 1})
            if engine.global_rank == 0:
                print(f"step {step + 1}: loss {loss.item():.3f}, checkpoint saved", flush=True)
    if engine.global_rank == 0:
        print(f"done: {engine.global_steps} optimizer steps, final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
