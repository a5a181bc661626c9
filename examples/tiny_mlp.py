"""The tiny-MLP smoke test that DeepSpeed-on-Windows guides use to prove an install,
run with zspeed: only the import differs from the DeepSpeed version.

Linear(512, 1024) -> ReLU -> Linear(1024, 512), MSE loss on random data, 100 steps,
{train_batch_size 16, gradient_accumulation_steps 1, Adam lr 1e-4, ZeRO stage 2,
fp16}, loss printed every 20 steps. Runs on the GPU if there is one, else the CPU.

    python examples/tiny_mlp.py
"""
import torch
import torch.nn as nn

import zspeed as deepspeed  # was: import deepspeed


class SimpleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(512, 1024)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(1024, 512)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


ds_config = {
    "train_batch_size": 16,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 2},
    "fp16": {"enabled": True},
}


def main():
    torch.manual_seed(0)
    model = SimpleModel()
    model_engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                         config=ds_config)
    loss_fn = nn.MSELoss()
    for step in range(100):
        inputs = torch.randn(16, 512).to(model_engine.device).half()
        targets = torch.randn(16, 512).to(model_engine.device).half()
        outputs = model_engine(inputs)
        loss = loss_fn(outputs, targets)
        model_engine.backward(loss)
        model_engine.step()
        if step % 20 == 0:
            print(f"step {step}: loss {loss.item():.4f}")
    print(f"done: {model_engine.global_steps} steps on {model_engine.device}, "
          f"loss scale {model_engine.loss_scale:g}, skipped {model_engine.skipped_steps}")


if __name__ == "__main__":
    main()
