"""Hugging Face Trainer with zspeed's ZeRO-2 + CPU offload (or, with --stage 3, ZeRO-3 with
parameters and optimizer state in CPU memory): a small Llama built from a config (random
weights, no download) trained on synthetic tokens, checkpointed, and resumed. The one
change to an ordinary Trainer script is the two zspeed lines at the top.

    python examples/hf_trainer.py --out /tmp/hf_run --max_steps 6 --save_steps 3
    python examples/hf_trainer.py --out /tmp/hf_run --max_steps 6 --resume /tmp/hf_run/checkpoint-3
    python examples/hf_trainer.py --out /tmp/hf_z3 --stage 3
    python examples/hf_trainer.py --out /tmp/hf_z3 --stage 3 --eval_only

--eval_only evaluates without training (an evaluation-only run: Trainer.evaluate() builds an engine
without an optimizer, DeepSpeed's ZeRO-Inference) and compares with the plain model's loss.

On a machine with a GPU it trains there (--cpu, or ZSPEED_DEVICE=cpu, keeps it on the CPU).
"""
import copy
import argparse
import json
import os

import zspeed.hf

zspeed.hf.install()  # before transformers: "deepspeed" is zspeed from here on

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

# The ZeRO-2 offload config of the transformers documentation ("auto" is filled by the Trainer).
DS_CONFIG = {
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                          "reduce_scatter": True, "reduce_bucket_size": 2e8, "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}


class Tokens(torch.utils.data.Dataset):
    """Random token sequences (a fixed seed): the model learns their unigram statistics."""

    def __init__(self, n=64, seq=16, vocab=97, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max_steps", type=int, default=6)
    ap.add_argument("--save_steps", type=int, default=3)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--stage", type=int, choices=[2, 3], default=2)
    ap.add_argument("--cpu", action="store_true", help="train on the CPU even with a GPU (also ZSPEED_DEVICE=cpu)")
    ap.add_argument("--eval_only", action="store_true", help="Trainer.evaluate() only, no training")
    args = ap.parse_args()
    # The Trainer puts the inputs where its arguments say and zspeed the model on zspeed's device:
    # both follow the same rule (the GPU when there is one, unless told otherwise).
    use_cpu = args.cpu or not torch.cuda.is_available() or os.environ.get("ZSPEED_DEVICE", "").startswith("cpu")
    if use_cpu:
        os.environ["ZSPEED_DEVICE"] = "cpu"
    ds_config = copy.deepcopy(DS_CONFIG)
    if args.stage == 3:  # the ZeRO-3 offload config of the transformers documentation
        ds_config["zero_optimization"] = {
            "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
            "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
            "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True}
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    targs = TrainingArguments(output_dir=args.out, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                              gradient_accumulation_steps=2,
                              max_steps=args.max_steps, save_steps=args.save_steps, learning_rate=1e-3,
                              warmup_steps=2, logging_steps=1, report_to=[], deepspeed=ds_config, use_cpu=use_cpu,
                              seed=0, data_seed=0, dataloader_num_workers=0)
    if args.eval_only:
        held_out = Tokens(n=16, seed=1)
        with torch.no_grad():  # the plain model's loss on the held-out tokens, batch by batch
            ids = held_out.ids
            plain = sum(model(input_ids=ids[i:i + 4], labels=ids[i:i + 4]).loss.item()
                        for i in range(0, len(ids), 4)) / (len(ids) // 4)
        trainer = Trainer(model=model, args=targs, eval_dataset=held_out)
        got = trainer.evaluate()["eval_loss"]
        summary = {"eval_loss": got, "plain_loss": plain, "engine": type(trainer.model_wrapped).__module__,
                   "optimizer": repr(trainer.model_wrapped.optimizer)}
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "summary_eval.json"), "w") as f:
            json.dump(summary, f)
        print(json.dumps(summary))
        return
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens())
    out = trainer.train(resume_from_checkpoint=args.resume)
    if args.stage == 3:
        trainer.save_model(os.path.join(args.out, "final"))  # the whole 16-bit model (gathered)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    summary = {"global_step": trainer.state.global_step, "train_loss": out.training_loss, "losses": losses,
               "engine": type(trainer.model_wrapped).__module__, "device": str(trainer.model_wrapped.device)}
    with open(os.path.join(args.out, "summary.json" if args.resume is None else "summary_resumed.json"), "w") as f:
        json.dump(summary, f)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
