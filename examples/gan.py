"""A GAN with two engines (DeepSpeedExamples' gan_deepspeed_train.py shape) on a synthetic
2-D distribution (8 Gaussians on a ring), so it runs on a CPU in seconds:

  python examples/gan.py --steps 300

One engine per network, each with its own optimizer config; only the import differs
from a DeepSpeed script.
"""
import argparse
import math

import torch

import zspeed as deepspeed


def ring(n, g):
    k = torch.randint(0, 8, (n,), generator=g).float() * (2 * math.pi / 8)
    centers = torch.stack([torch.cos(k), torch.sin(k)], 1) * 2.0
    return centers + 0.05 * torch.randn(n, 2, generator=g)


def mlp(d_in, d_out, hidden=64):
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.LeakyReLU(0.2),
                               torch.nn.Linear(hidden, hidden), torch.nn.LeakyReLU(0.2),
                               torch.nn.Linear(hidden, d_out))


def config(lr):
    return {"train_micro_batch_size_per_gpu": 128, "steps_per_print": 10 ** 6,
            "optimizer": {"type": "Adam", "params": {"lr": lr, "betas": [0.5, 0.999]}},
            "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(0)
    gen, disc = mlp(8, 2), mlp(2, 1)
    g_engine, _, _, _ = deepspeed.initialize(model=gen, model_parameters=gen.parameters(), config=config(2e-4))
    d_engine, _, _, _ = deepspeed.initialize(model=disc, model_parameters=disc.parameters(), config=config(2e-4))
    bce = torch.nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(1)
    dev = g_engine.device
    for step in range(args.steps):
        real = ring(128, g).to(dev)
        fake = g_engine(torch.randn(128, 8, generator=g).to(dev))
        d_loss = bce(d_engine(real), torch.ones(128, 1, device=dev)) + \
            bce(d_engine(fake.detach()), torch.zeros(128, 1, device=dev))
        d_engine.backward(d_loss)
        d_engine.step()
        g_loss = bce(d_engine(fake), torch.ones(128, 1, device=dev))
        g_engine.backward(g_loss)
        g_engine.step()
        d_engine.zero_grad()  # the generator's backward also reached the discriminator
        if (step + 1) % 100 == 0 and g_engine.global_rank == 0:
            with torch.no_grad():
                radius = g_engine(torch.randn(512, 8, generator=g).to(dev)).norm(dim=1).mean().item()
            print(f"step {step + 1}: d_loss {d_loss.item():.3f} g_loss {g_loss.item():.3f} "
                  f"mean radius of samples {radius:.2f} (data: 2.0)", flush=True)
    if g_engine.global_rank == 0:
        print("done")


if __name__ == "__main__":
    main()
