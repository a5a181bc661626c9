"""A small decoder-only transformer (GPT/OPT family) used by the examples and benches.

Pre-LayerNorm blocks, causal self-attention through
torch.nn.functional.scaled_dot_product_attention, learned positions, and an
output head tied to the token embedding. ``GPTConfig.opt_125m()`` gives OPT-125M's
shape (12 layers, d_model 768, 12 heads, FFN 3072, ReLU, vocabulary 50272,
2048 positions); ``GPTConfig.gpt_1b()`` the ~1.3B model of the GPU bench.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    vocab_size: int = 96
    max_len: int = 256
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    d_ff: int | None = None
    activation: str = "gelu"
    dropout: float = 0.0

    @classmethod
    def opt_125m(cls):
        return cls(vocab_size=50272, max_len=2048, d_model=768, n_layer=12, n_head=12, d_ff=3072,
                   activation="relu")

    @classmethod
    def gpt_1b(cls):
        return cls(vocab_size=32000, max_len=1024, d_model=2048, n_layer=24, n_head=16)

    @classmethod
    def from_hf_opt_json(cls, path):
        """Reads the fields of a Hugging Face OPTConfig JSON (config.json) that shape the model."""
        with open(path) as f:
            c = json.load(f)
        return cls(vocab_size=c["vocab_size"], max_len=c["max_position_embeddings"], d_model=c["hidden_size"],
                   n_layer=c["num_hidden_layers"], n_head=c["num_attention_heads"], d_ff=c["ffn_dim"],
                   activation=c.get("activation_function", "relu"), dropout=c.get("dropout", 0.0))

    def to_dict(self):
        return asdict(self)


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_head = c.n_head
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        ff = c.d_ff or 4 * c.d_model
        self.fc1 = nn.Linear(c.d_model, ff)
        self.fc2 = nn.Linear(ff, c.d_model)
        self.act = nn.ReLU() if c.activation == "relu" else nn.GELU(approximate="tanh")
        self.dropout = c.dropout

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.config = c
        self.tok = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.max_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)
        for blk in self.blocks:  # GPT-2's scaled init of residual projections
            nn.init.normal_(blk.proj.weight, std=0.02 / math.sqrt(2 * c.n_layer))
            nn.init.normal_(blk.fc2.weight, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, targets=None):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def generate(self, ids, n, temperature=0.8, top_k=None, generator=None):
        for _ in range(n):
            logits = self(ids[:, -self.config.max_len:])[:, -1, :].float() / temperature
            if top_k:
                v, _ = torch.topk(logits, top_k)
                logits[logits < v[:, [-1]]] = -float("inf")
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            ids = torch.cat([ids, nxt], dim=1)
        return ids

    def num_params(self):
        return sum(p.numel() for p in self.parameters())
