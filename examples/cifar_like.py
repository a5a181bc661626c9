"""A DeepSpeedExamples-style image classifier (cifar10_deepspeed.py's shape) on synthetic
32x32 images, so it runs anywhere without a download:

  python examples/cifar_like.py --precision fp16 --stage 0      # fp16, dynamic loss scaling
  python examples/cifar_like.py --precision bf16 --stage 2      # bf16, ZeRO-2 + CPU offload
  torchrun --nproc_per_node 2 examples/cifar_like.py --precision bf16 --stage 2

The script is written against DeepSpeed's API; only the import differs.
"""
import argparse

import torch

import zspeed as deepspeed


class SyntheticImages(torch.utils.data.Dataset):
    """10 classes of 3x32x32 images: noise around a per-class color pattern."""

    def __init__(self, n=2048, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.proto = torch.randn(10, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.noise = torch.randn(n, 3, 32, 32, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.proto[self.y[i]] + 0.8 * self.noise[i], self.y[i]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 6, 5), torch.nn.Conv2d(6, 16, 5)
        self.pool = torch.nn.MaxPool2d(2, 2)
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(400, 120), torch.nn.Linear(120, 84), torch.nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def ds_config(precision: str, stage: int) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": 16, "steps_per_print": 2000,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.8, 0.999], "eps": 1e-8,
                                                    "weight_decay": 3e-7}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                                                        "warmup_num_steps": 50}},
           "gradient_clipping": 1.0, "zero_optimization": {"stage": stage}}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 15, "loss_scale_window": 500,
                       "hysteresis": 2, "min_loss_scale": 1}
    elif precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if stage > 0:
        cfg["zero_optimization"].update(offload_optimizer={"device": "cpu", "pin_memory": True},
                                        overlap_comm=True, contiguous_gradients=True)
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="bf16")
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args()
    torch.manual_seed(0)
    net = Net()
    engine, _, loader, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                                training_data=SyntheticImages(),
                                                config=ds_config(args.precision, args.stage))
    dtype = torch.half if engine.fp16_enabled() else torch.bfloat16 if engine.bfloat16_enabled() else torch.float
    criterion = torch.nn.CrossEntropyLoss()
    step, correct, seen = 0, 0, 0
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(engine.local_rank if engine.device.type == "cuda" else "cpu", dtype), y.to(engine.device)
            out = engine(x)
            loss = criterion(out.float(), y)
            engine.backward(loss)
            engine.step()
            correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
            step += 1
            if step % 40 == 0 and engine.global_rank == 0:
                print(f"step {step}: loss {loss.item():.3f}, accuracy of the last 40 steps {correct / seen:.2f}, "
                      f"loss scale {engine.loss_scale:g}", flush=True)
                correct = seen = 0
            if step >= args.steps:
                break
    if engine.global_rank == 0:
        print(f"done: {engine.global_steps} steps, {engine.skipped_steps} skipped")


if __name__ == "__main__":
    main()
