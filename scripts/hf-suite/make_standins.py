"""Tiny *randomly initialised* stand-ins for the hub models that transformers' tests/deepspeed/test_deepspeed.py
and accelerate's tests/deepspeed/ name, written in the HF cache layout under $HF_HOME/hub so that
`from_pretrained("<repo id>")` works offline (HF_HUB_OFFLINE=1). Same architectures (same model_type / classes),
NOT the hub weights or sizes. `gpt2` is a 2-layer 64-wide GPT-2, not the 124M one."""
import hashlib
import os

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTJConfig,
    GPTJModel,
    MobileViTConfig,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    T5Config,
    T5Model,
)

hub = os.path.join(os.environ["HF_HOME"], "hub")  # run.sh sets HF_HOME


def put(repo_id, obj):
    rev = hashlib.sha1(repo_id.encode()).hexdigest()
    d = os.path.join(hub, "models--" + repo_id.replace("/", "--"))
    snap = os.path.join(d, "snapshots", rev)
    os.makedirs(os.path.join(d, "refs"), exist_ok=True)
    obj.save_pretrained(snap)
    with open(os.path.join(d, "refs", "main"), "w") as f:
        f.write(rev)
    print(repo_id, "->", sorted(os.listdir(snap)))


torch.manual_seed(0)
# transformers' tests/deepspeed/test_deepspeed.py
put("patrickvonplaten/t5-tiny-random", T5Model(T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0)))
put("sshleifer/tiny-gpt2", GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_embd=16, n_layer=2, n_head=2, n_positions=128, bos_token_id=0, eos_token_id=0)))
put("hf-internal-testing/tiny-random-gptj", GPTJModel(GPTJConfig(vocab_size=1000, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=512, bos_token_id=0, eos_token_id=0)))
# accelerate's tests/deepspeed/ (sshleifer/tiny-gpt2 above too). Vocab 1000: the tests draw input ids in [0, 1000).
put("hf-internal-testing/tiny-random-gpt2", GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_embd=32, n_layer=2, n_head=4, n_positions=512, bos_token_id=0, eos_token_id=0)))
put("gpt2", GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0)))
put("apple/mobilevit-xx-small", MobileViTConfig(hidden_sizes=[64, 80, 96], neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320]))  # config only (AutoConfig)
put("peft-internal-testing/tiny-random-qwen-1.5-MoE", Qwen2MoeForCausalLM(Qwen2MoeConfig(
    vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, max_position_embeddings=256)))
