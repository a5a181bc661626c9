"""Data-parallel training the DeepSpeed way, on synthetic data: start it with torchrun,
zspeed's or DeepSpeed's launcher, or plain python for one process.

  torchrun --nproc_per_node 2 examples/data_parallel.py --deepspeed_config examples/zero2_offload.json
  python examples/data_parallel.py --deepspeed_config examples/zero2_offload.json

Every rank builds the same model; zspeed.initialize creates the process group (NCCL
on Linux GPUs, Gloo on Windows and on the CPU), partitions the optimizer state (ZeRO
stage 1 or 2 from the config) and gives each rank its share of the dataset. Only rank
0 prints. With DeepSpeed installed, `import deepspeed` instead of zspeed runs it too.
"""
import argparse

import torch

import zspeed as deepspeed


class Regression(torch.utils.data.Dataset):
    """y = x @ W + noise, for a fixed random W: something an MLP can learn quickly."""

    def __init__(self, n=4096, d_in=32, d_out=8):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, d_in, generator=g)
        w = torch.randn(d_in, d_out, generator=g)
        self.y = self.x @ w + 0.01 * torch.randn(n, d_out, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1, help="set by DeepSpeed-style launchers")
    parser.add_argument("--epochs", type=int, default=2)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 257), torch.nn.GELU(), torch.nn.Linear(257, 8))
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=Regression())
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch) if hasattr(loader.sampler, "set_epoch") else None
        total, count = 0.0, 0
        for x, y in loader:
            x, y = x.to(engine.device, engine.dtype), y.to(engine.device)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            total, count = total + loss.item(), count + 1
        if engine.global_rank == 0:
            print(f"epoch {epoch}: mean loss {total / count:.4f} over {count} steps per rank, "
                  f"{engine.world_size} rank(s), local rank {engine.local_rank}", flush=True)
    if engine.global_rank == 0:
        print(f"done: {engine.global_steps} optimizer steps, final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
