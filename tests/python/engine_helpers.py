"""What the engine tests share: small models of odd sizes, deterministic data, and one
training loop (forward, loss, engine.backward, engine.step per micro-batch).

Imported by test_engine.py, test_engine_nvme.py, test_loss_scaler.py and
test_checkpoint.py, and by tests/gpu/check_engine_cuda.py, which runs the same loop
on a GPU machine."""
from __future__ import annotations

import torch

F = torch.nn.functional

# ZeRO-2 with the optimizer state in CPU memory (DeepSpeed's usual offload section).
OFFLOAD = {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}


def config(**top) -> dict:
    """An engine config for the mlp and regression_data defaults (micro-batch 6, AdamW); keyword
    arguments replace or add top-level sections."""
    c = {"train_micro_batch_size_per_gpu": 6, "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.01}}}
    c.update(top)
    return c


def mlp(d_in: int = 13, hidden: int = 37, d_out: int = 5, *, act=torch.nn.GELU, seed: int = 0):
    """Linear - act - Linear, initialized from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), act(), torch.nn.Linear(hidden, d_out))


def regression_data(n: int, bs: int = 6, d_in: int = 13, d_out: int = 5, seed: int = 1) -> list:
    """n batches (x, y) of a learnable regression: y = x @ W for a fixed random W, plus a
    little noise."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d_in, d_out, generator=torch.Generator().manual_seed(123))
    out = []
    for _ in range(n):
        x = torch.randn(bs, d_in, generator=g)
        out.append((x, x @ w + 0.01 * torch.randn(bs, d_out, generator=g)))
    return out


class TinyLM(torch.nn.Module):
    """A tiny language model with tied input/output embeddings (shared storage) and a buffer."""

    def __init__(self, vocab: int = 23, d: int = 11):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, d)
        self.mid = torch.nn.Linear(d, d)
        self.out = torch.nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, ids):
        return self.out(torch.tanh(self.mid(self.emb(ids))))


def token_data(n: int, seed: int = 4, vocab: int = 23) -> list:
    """n batches of 4 random token sequences of length 7."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (4, 7), generator=g) for _ in range(n)]


def mse_loss(engine, batch) -> torch.Tensor:
    """Mean squared error of the model on (x, y); x in the engine's dtype, the loss in fp32."""
    x, y = batch
    dev = getattr(engine, "device", x.device)  # the data follow the engine (tests/gpu runs them on CUDA)
    return F.mse_loss(engine(x.to(dev, engine.dtype)).float(), y.to(dev))


def lm_loss(engine, ids) -> torch.Tensor:
    """Next-token cross-entropy of a language model on a batch of token sequences."""
    ids = ids.to(getattr(engine, "device", ids.device))
    logits = engine(ids[:, :-1]).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def train(engine, data: list, steps: int | None = None, *, start: int = 0, inf_at=(), loss=mse_loss) -> list:
    """Micro-batches start, ..., start + steps - 1 (batch i is data[i % len(data)], steps defaults
    to len(data)): loss, engine.backward, engine.step. In the micro-batches listed in inf_at the
    loss is multiplied by inf, so every gradient is non-finite (an fp16 overflow). Returns the
    losses."""
    steps = len(data) if steps is None else steps
    losses = []
    for i in range(start, start + steps):
        value = loss(engine, data[i % len(data)])
        losses.append(value.item())
        if i in inf_at:
            value = value * float("inf")
        engine.backward(value)
        engine.step()
    return losses


def run_script(tmp_path, name: str, body: str, *, timeout: int = 120, env: dict | None = None):
    """Runs ``body`` as a Python script in a new interpreter, with tests/python and the folder of
    the zspeed package this process imported on its path (for what only a fresh process shows:
    exit, peak memory). Returns the CompletedProcess (text output captured)."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / name
    script.write_text("import sys\n"
                      f"sys.path[:0] = [{here!r}, {zspeed_site()!r}]\n" + body)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else dict(os.environ, **env))


def zspeed_site() -> str:
    """The folder holding the zspeed package this process imported (the installed wheel's
    site-packages, or the checkout's python/), for the path of the processes a test starts:
    they must load the same package and native library (on Windows the checkout's python/
    has no zspeed.dll; the wheel has)."""
    import os
    import zspeed
    return os.path.dirname(os.path.dirname(os.path.abspath(zspeed.__file__)))


def same_weights(a, b) -> bool:
    """Whether two engines' models hold bit-identical parameters."""
    return all(torch.equal(p, q) for p, q in zip(a.module.parameters(), b.module.parameters()))


def native_ops_available() -> bool:
    """Whether zspeed's native CPU optimizers load (libzspeed is built)."""
    try:
        from zspeed.ops import adam, grad_stats  # noqa: F401
        return True
    except Exception:  # ImportError without zspeed.ops, NativeError without libzspeed
        return False
