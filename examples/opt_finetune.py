"""Causal-LM fine-tune of an OPT-125M-shaped model with ZeRO-2 + CPU offload, as in the
DeepSpeed-on-Windows guides; only the import differs from the DeepSpeed version.

The model is built from the local config examples/opt-125m-config.json with random
weights (no hub access): with Hugging Face transformers installed and --transformers
it is OPTForCausalLM.from_config, otherwise the same shape from examples/gpt.py.
Text: the bundled public-domain corpus (data/), as bytes (ids 3..258 of OPT's vocabulary).
Config: AdamW lr 5e-5 betas (0.9, 0.999) eps 1e-8; WarmupLR 0 -> 5e-5 over 100 steps;
ZeRO-2 with offload_optimizer cpu + pin_memory; gradient_accumulation_steps 8; micro batch 4.

    python examples/opt_finetune.py --steps 20            # GPU: bf16; CPU: fp32 (slow: try --seq-len 64 --steps 2)
"""
import argparse
import os
import sys
import time

import torch

import zspeed as deepspeed  # was: import deepspeed

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt import GPT, GPTConfig  # noqa: E402


def build_model(use_transformers: bool):
    cfg_path = os.path.join(HERE, "opt-125m-config.json")
    if use_transformers:
        from transformers import OPTConfig, OPTForCausalLM
        return OPTForCausalLM(OPTConfig.from_json_file(cfg_path)), True
    return GPT(GPTConfig.from_hf_opt_json(cfg_path)), False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps (each = 8 micro-batches of 4)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--transformers", action="store_true", help="use transformers.OPTForCausalLM")
    ap.add_argument("--torch-adam", action="store_true", help="torch's AdamW on the CPU instead of zspeed's")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    ds_config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 8,
        "optimizer": {"type": "AdamW", "params": {"lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.0, "torch_adam": args.torch_adam}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 5e-5,
                                                     "warmup_num_steps": 100}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
        "bf16": {"enabled": cuda and torch.cuda.is_bf16_supported()},
        "gradient_clipping": 1.0,
    }
    torch.manual_seed(0)
    model, is_hf = build_model(args.transformers)
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                           config=ds_config)
    text = open(os.path.join(HERE, "..", "data", "pride_and_prejudice.txt"), "rb").read()
    ids = torch.tensor(list(text), dtype=torch.long) + 3  # bytes -> ids 3..258 (0-2 are OPT specials)
    g = torch.Generator().manual_seed(0)
    T = args.seq_len
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params on {engine.device}, "
          f"dtype {engine.dtype}, optimizer {type(optimizer).__name__} on the CPU")
    t0 = time.time()
    for step in range(args.steps * 8):
        start = torch.randint(0, len(ids) - T - 1, (4,), generator=g)
        batch = torch.stack([ids[s:s + T + 1] for s in start]).to(engine.device)
        if is_hf:
            loss = engine(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        else:
            loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        engine.step()
        if (step + 1) % 8 == 0:
            print(f"step {engine.global_steps}: loss {loss.item():.4f} lr {engine.get_lr()[0]:.2e} "
                  f"({(time.time() - t0) / engine.global_steps:.2f} s/step)")
    if cuda:
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
