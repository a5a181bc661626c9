"""``zspeed plan``: which ZeRO stage, offload tiers and optimizer state dtype fit a model on a
machine, the bytes each tier holds, the optimizer step's CPU time and the predicted step time.

The question it answers is the one offload users ask first ("will a 13B fit my 24 GB card and
64 GB of RAM, and how fast?"). It uses the engine's own accounting, not a second model of it:
for each candidate configuration it builds the run plan (runtime/plan.py) and asks the
components what they will hold (runtime/assemble.footprint, the same sums the engine checks
before it allocates), over the model's parameters on the ``meta`` device (no memory, no
weights read). On top of the engine's own tensors it counts what the engine does not know
at start-up:

  autograd's gradients   stages 0-2: the whole model's, in the training dtype, on the GPU
  activations            a transformer's per layer, with torch's scaled_dot_product_attention
                         (no attention matrix kept): 34 bytes x sequence x batch x hidden
                         per layer; with activation checkpointing each layer's input (2 bytes
                         x sequence x batch x hidden) plus one layer's during its recompute
                         (Korthikanti et al., "Reducing Activation Recomputation in Large
                         Transformer Models", 2022, without the attention-score term)

and, for ``"ratio": "auto"``, the GPU share the engine's AutoSplit would choose from that peak.
The CPU optimizer's speed is measured here (zspeed's C Adam on this machine's cores, 2^27
elements, per state dtype, as the engine runs the offloaded step: the model's 16-bit gradients
in, its 16-bit weights out; the median of 3 steps), and the step's CPU time is the CPU share's
elements at that rate.

The step time is predicted from rates: the CPU Adam's (above), the GPU's AdamW (measured on
the spot on a GPU) and the forward and backward of one micro-batch without offload
(``fwd_bwd_seconds``: given, or measured on the spot on a GPU by timing one transformer block
of the model's shape and its output layer at the batch and sequence; times the layers, and
4/3 with checkpointing, which recomputes each block's forward). Per configuration:

  optimizer on the GPU     forward+backward + the GPU's AdamW over the rank's part
  CPU offload (ratio 1)    forward+backward + the CPU's step (synchronous)
  ratio "auto" + overlap_forward
                           the GPU share's AdamW + the longer of (the forward, the CPU's share
                           of the step) + the backward: the next forward waits for each unit's
                           new weights, so the CPU's step runs during it, and the backward
                           starts when both are done (the forward is a third of forward+backward,
                           a quarter with checkpointing)
  optimizer on NVMe (whole, or the last of three tiers)
                           forward+backward + the GPU share's AdamW + the host share's CPU step +
                           the NVMe share's bytes (fp32 masters and state, per host) read at the
                           disk's read rate and written at its write rate one after the other
                           (given as --disk-read-gbs / --disk-write-gbs; without them, not
                           predicted). The swapper overlaps reads with writes and compute, so
                           a disk that serves both at once does better: on the H200 host's shared
                           virtual disk the measured steps were 0.86-1.15x this serial bound

Copies between host and GPU are taken to overlap the computation (they do, on a side stream),
but for one: with ZeRO-3's offload_param, forward+backward measured on the spot (the block
timing has no weight fetches) gets one pass of the 16-bit weights at the pinned host-to-GPU
rate measured on the spot. On the H200 host the engine's ZeRO-3 forward+backward exceeded the
block timing by 0.159 s at 3.36B and 0.249 s at 6.58B, 42-53 GB/s for 2 bytes per parameter:
one pass over PCIe (bench/RESULTS.md, "zspeed plan's step prediction"). A given
forward+backward is the run's own and is used as it is.

Limits: the activation formula is a transformer's; a model passed as a module without
a known shape gets no activation estimate (said in the output). The GPU check of each row is
the sum against the given GPU memory less a margin (the engine's AutoSplit margin).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field

__all__ = ["Shape", "Candidate", "PlanReport", "plan", "largest", "main", "measure_fwd_bwd", "predicted_step"]

GiB = float(1 << 30)
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class Shape:
    """A transformer's shape (what the activation estimate needs)."""
    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int | None = None

    @classmethod
    def for_params(cls, n: float) -> "Shape":
        """A GPT of about ``n`` parameters (12 x layers x hidden^2 in the blocks; hidden about
        100 x layers, as GPT-3's and Llama's shapes are, rounded to a multiple of 128)."""
        layers = max(2, round((n / 1.2e5) ** (1 / 3)))
        hidden = max(128, 128 * round(math.sqrt(n / (12 * layers)) / 128))
        return cls(layers=layers, hidden=hidden, heads=max(1, hidden // 128), vocab=32000)

    @classmethod
    def of_hf_config(cls, c) -> "Shape":
        get = (lambda k, d=None: c.get(k, d)) if isinstance(c, dict) else (lambda k, d=None: getattr(c, k, d))
        return cls(layers=int(get("num_hidden_layers", get("n_layer", 0))),
                   hidden=int(get("hidden_size", get("n_embd", get("d_model", 0)))),
                   heads=int(get("num_attention_heads", get("n_head", 1))),
                   vocab=int(get("vocab_size", 32000)), ffn=get("intermediate_size", get("ffn_dim", get("d_ff"))))


def _meta_gpt(s: Shape):
    """A GPT-shaped module of ``s`` on the meta device (tied input/output embedding)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            ff = s.ffn or 4 * s.hidden
            self.ln1, self.ln2 = nn.LayerNorm(s.hidden), nn.LayerNorm(s.hidden)
            self.qkv, self.proj = nn.Linear(s.hidden, 3 * s.hidden), nn.Linear(s.hidden, s.hidden)
            self.fc1, self.fc2 = nn.Linear(s.hidden, ff), nn.Linear(ff, s.hidden)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(s.vocab, s.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(s.layers))
            self.ln_f = nn.LayerNorm(s.hidden)
            self.head = nn.Linear(s.hidden, s.vocab, bias=False)
            self.head.weight = self.tok.weight

    with torch.device("meta"):
        return GPT()


_MAX_CONFIG_BYTES = 16 << 20  # a transformers config.json is a few KiB


def read_hf_config(path) -> dict:
    """The dict of a local transformers config: ``path`` is the config file itself (any name) or
    a folder holding config.json. Never goes to the network: a Hub repo id is refused with the
    command that downloads its config. ValueError names the problem and the fix."""
    p = os.fspath(path)
    if not p.strip():
        raise ValueError("--hf-config is empty: give the path of a transformers config.json (or of its folder)")
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
        if not os.path.isfile(p):
            raise ValueError(f"--hf-config {path!r}: the folder holds no config.json; give the config file itself")
    elif not os.path.exists(p):
        hint = ""
        if not os.path.isabs(p) and p.count("/") == 1 and not p.endswith(".json"):
            hint = (f" ({p!r} looks like a Hugging Face Hub model id: zspeed plan reads local files only; fetch its "
                    f"config first, e.g. huggingface-cli download {p} config.json --local-dir ./{p.split('/')[1]}, "
                    f"then give that folder)")
        raise ValueError(f"--hf-config {path!r}: no such file or folder{hint}")
    if not os.path.isfile(p):
        raise ValueError(f"--hf-config {path!r} is not a regular file (a device, a pipe?): give a config.json")
    if os.path.getsize(p) > _MAX_CONFIG_BYTES:
        raise ValueError(f"--hf-config {path!r} is {os.path.getsize(p)} bytes, not a transformers config (a few "
                         f"KiB): give the model's config.json")
    try:
        with open(p, "rb") as f:
            d = json.loads(f.read(_MAX_CONFIG_BYTES + 1).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"--hf-config {path!r} is not a readable JSON file ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("model_type"), str):
        raise ValueError(f"--hf-config {path!r} has no \"model_type\": it is not a transformers config.json")
    return d


def _hf_model(config):
    """The transformers causal LM of ``config`` (a path to a config file or its folder, a dict with
    model_type, or a PretrainedConfig) on the meta device."""
    import torch
    try:
        import transformers
    except ImportError as e:
        raise ValueError("a Hugging Face config needs the transformers package (pip install transformers)") from e
    if isinstance(config, (str, os.PathLike)):
        config = read_hf_config(config)
    if isinstance(config, dict):
        d = dict(config)
        if not isinstance(d.get("model_type"), str):
            raise ValueError("hf_config: a dict needs its \"model_type\" (as in config.json)")
        try:
            config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"hf_config: transformers cannot build this config ({type(e).__name__}: {e})") from None
    try:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(config), config
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"hf_config: transformers has no causal LM for this config ({type(e).__name__}: {e})") \
            from None


_COUNT_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
MAX_PARAMS = 1e15  # far beyond any model: a number larger is a typo (1e30)


def parse_count(v) -> float:
    """A parameter count: a number, or text such as 13e9, 7B, 7b, 1.5B, 350M, 70K, 1T. ValueError
    names the problem."""
    if isinstance(v, bool):
        raise ValueError(f"params={v!r}: give the parameter count, e.g. 13e9 or 7B")
    if isinstance(v, str):
        t = v.strip().replace("_", "").replace(",", "")
        mult = 1.0
        if t and t[-1].lower() in _COUNT_SUFFIX:
            mult, t = _COUNT_SUFFIX[t[-1].lower()], t[:-1]
        try:
            n = float(t) * mult
        except ValueError:
            raise ValueError(f"params={v!r} is not a parameter count: write e.g. 13e9, 7B, 1.5B or 350M") from None
    elif isinstance(v, (int, float)):
        n = float(v)
    else:
        raise ValueError(f"params must be a number or text such as 7B, got {type(v).__name__}")
    if not math.isfinite(n) or n < 1e6 or n > MAX_PARAMS:
        raise ValueError(f"params={v!r}: give the parameter count itself, between 1e6 and {MAX_PARAMS:g} (e.g. 13e9 "
                         f"or 7B)")
    return n


def _number(name: str, v, *, integer: bool = False, lo: float = 0.0, lo_open: bool = True, hi: float = 1e9,
            optional: bool = False):
    """``v`` checked: a finite number (an int where ``integer``) above ``lo`` (or at it, where not
    ``lo_open``) and at most ``hi``; None where ``optional``. ValueError names the argument."""
    if v is None:
        if optional:
            return None
        raise ValueError(f"{name} is required")
    kind = "an integer" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not float(v).is_integer()):
        raise ValueError(f"{name}={v!r}: give {kind}")
    f = float(v)
    if not math.isfinite(f) or f < lo or (lo_open and f == lo) or f > hi:
        rel = ">" if lo_open else ">="
        raise ValueError(f"{name}={v!r}: give {kind} {rel} {lo:g} and <= {hi:g}")
    return int(f) if integer else f


def check_inputs(*, params, gpu_memory, host_memory, disk, cores, gpus, batch, seq, fwd_bwd_seconds,
                 disk_read_gbs, disk_write_gbs, rates=()) -> dict:
    """The one validator of the planner's inputs (plan(), largest() and the command line): each
    value a finite number in its range, integers where a count is meant. Returns them converted."""
    out = dict(
        params=None if params is None else parse_count(params),
        gpu_memory=_number("gpu_memory (--gpu-mem, GiB)", gpu_memory, hi=1e6),
        host_memory=_number("host_memory (--host-mem, GiB)", host_memory, hi=1e7, optional=True),
        disk=_number("disk (--disk, GiB)", disk, hi=1e9, optional=True),
        cores=_number("cores (--cores)", cores, integer=True, lo=1, lo_open=False, hi=1e5, optional=True),
        gpus=_number("gpus (--gpus)", gpus, integer=True, lo=1, lo_open=False, hi=1e4),
        batch=_number("batch (--batch)", batch, integer=True, lo=1, lo_open=False, hi=1e7),
        seq=_number("seq (--seq)", seq, integer=True, lo=1, lo_open=False, hi=1e8),
        fwd_bwd_seconds=_number("fwd_bwd_seconds (--fwd-bwd-s)", fwd_bwd_seconds, hi=1e6, optional=True),
        disk_read_gbs=_number("disk_read_gbs (--disk-read-gbs)", disk_read_gbs, hi=1e4, optional=True),
        disk_write_gbs=_number("disk_write_gbs (--disk-write-gbs)", disk_write_gbs, hi=1e4, optional=True))
    for name, v in rates:
        _number(name, v, hi=1.0, optional=True)
    return out


@dataclass
class Candidate:
    """One configuration and what it holds."""
    name: str
    config: dict
    tiers: dict = field(default_factory=dict)      # tier -> {what: bytes}, per rank
    fits: bool = True
    why: list = field(default_factory=list)        # what does not fit
    cpu_share: float = 1.0                          # of the optimizer's elements
    cpu_step_s: float | None = None
    step_s: float | None = None                     # the predicted step (see the module docstring)

    def total(self, tier: str) -> int:
        return sum(self.tiers.get(tier, {}).values())


@dataclass
class PlanReport:
    """The answer of :func:`plan`: the machine, the model and the candidates, in order of
    preference (the first that fits is the recommendation)."""
    params: int
    machine: dict
    candidates: list
    notes: list

    @property
    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.fits), None)

    def to_dict(self) -> dict:
        return {"params": self.params, "machine": self.machine, "notes": self.notes,
                "best": self.best.name if self.best else None,
                "candidates": [{"name": c.name, "fits": c.fits, "why": c.why, "cpu_share": c.cpu_share,
                                "cpu_step_s": c.cpu_step_s, "step_s": c.step_s, "tiers": c.tiers,
                                "config": c.config}
                               for c in self.candidates]}

    def __str__(self) -> str:
        m = self.machine
        lines = [f"zspeed plan: {self.params / 1e9:.2f}B parameters, {m['dtype']}, batch {m['batch']} x "
                 f"{m['seq']}{' with activation checkpointing' if m['ckpt'] else ''}, {m['gpus']} GPU(s) of "
                 f"{m['gpu_gib']:.1f} GiB, {m['host_gib']:.1f} GiB host memory, "
                 + (f"{m['disk_gib']:.0f} GiB disk" if m.get("disk_gib") else "no NVMe disk given")
                 + f", {m['cores']} cores (CPU Adam {m['cpu_ns']:.2f} ns/element measured here"
                 + (f", scaled to {m['cores']} cores" if m.get("scaled") else "") + ")", ""]
        # The columns are as wide as their widest cell (a label such as "ZeRO-3, both offloaded,
        # int8 states, ratio auto (GPU takes 83%)" widens the first): every row lines up.
        titles = ("configuration", "fits", "GPU GiB", "host GiB", "NVMe GiB", "CPU step", "step")
        rows = [(c.name, "yes" if c.fits else "no", f"{c.total('gpu') / GiB:.2f}",
                 f"{c.total('host') * m['gpus'] / GiB:.2f}", f"{c.total('nvme') * m['gpus'] / GiB:.2f}",
                 f"{c.cpu_step_s:.2f} s" if c.cpu_step_s is not None else "-",
                 f"{c.step_s:.2f} s" if c.step_s is not None else "-") for c in self.candidates]
        widths = [max(len(r[i]) for r in [titles, *rows]) for i in range(len(titles))]

        def row(cells) -> str:  # the first two columns left-aligned, the numbers right-aligned
            return "  " + "  ".join(t.ljust(w) if i < 2 else t.rjust(w) for i, (t, w) in enumerate(zip(cells, widths)))
        head = row(titles)
        lines += [head, "  " + "-" * (len(head) - 2)]
        for c, cells in zip(self.candidates, rows):
            lines.append(row(cells))
            for w in c.why:
                lines.append(f"      does not fit: {w}")
        best = self.best
        lines.append("")
        if best is None:
            lines.append("Nothing fits: more host memory, an NVMe disk (--disk), more GPUs, or a smaller batch.")
        else:
            lines.append(f"Recommended: {best.name}. Its zero_optimization section:")
            lines.append("  " + json.dumps(best.config["zero_optimization"]))
            if best.config.get("optimizer", {}).get("params", {}).get("state_dtype"):
                lines.append(f"  with optimizer.params.state_dtype \"{best.config['optimizer']['params']['state_dtype']}\"")
            lines.append("Per tier (per rank on the GPU, for all ranks of the host in host memory and NVMe):")
            for tier in ("gpu", "host", "nvme"):
                if best.tiers.get(tier):
                    k = 1 if tier == "gpu" else m["gpus"]
                    lines.append(f"  {tier:<5} " + ", ".join(f"{w} {v * k / GiB:.2f}" for w, v in best.tiers[tier].items())
                                 + " GiB")
        if m.get("fwd_bwd_s") is not None:
            lines.append(f"Steps predicted from forward+backward {m['fwd_bwd_s']:.3f} s per micro-batch "
                         f"({m['fwd_bwd_from']}"
                         + (f"; + {m['fetch_s']:.3f} s of weight fetches where ZeRO-3 offloads the parameters"
                            if m.get("fetch_s") else "")
                         + f"), CPU Adam {m['cpu_ns']:.2f} ns/element (fp32 states) and the "
                         f"GPU's AdamW {m['gpu_ns']:.3f} ns/element.")
        else:
            lines.append("Steps not predicted: no GPU here to time the forward and backward (--fwd-bwd-s gives it).")
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _candidates(stage3_nvme: bool) -> list:
    """(name, zero_optimization, state dtype, ratio "auto") in order of preference: the fastest
    first."""
    rows = [("ZeRO-2, optimizer on the GPU", {"stage": 2}, "fp32", False),
            ("ZeRO-2 + CPU offload, ratio auto", {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "fp32", True),
            ("ZeRO-2 + CPU offload, ratio 1", {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "fp32", False),
            ("ZeRO-2 + CPU offload, int8 states", {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "int8", False),
            ("ZeRO-3, both offloaded, ratio auto", {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                    "offload_param": {"device": "cpu"}}, "fp32", True),
            ("ZeRO-3, both offloaded to CPU", {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                               "offload_param": {"device": "cpu"}}, "fp32", False),
            ("ZeRO-3, both offloaded, int8 states, ratio auto", {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                                 "offload_param": {"device": "cpu"}}, "int8", True),
            ("ZeRO-3, both offloaded, int8 states", {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                     "offload_param": {"device": "cpu"}}, "int8", False)]
    if stage3_nvme:
        # The three tiers: the GPU's share (ratio) and host memory's (max_in_cpu) sized here from the
        # memory left on each, the rest of the optimizer state on NVMe (less of it than below: faster).
        rows.append(("ZeRO-3, optimizer GPU + host + NVMe, int8 states",
                     {"stage": 3, "offload_optimizer": {"device": "nvme", "ratio": 0.5, "max_in_cpu": 1},
                      "offload_param": {"device": "cpu"}}, "int8", "tiers"))
        rows.append(("ZeRO-3, parameters CPU, optimizer NVMe", {"stage": 3, "offload_optimizer": {"device": "nvme"},
                                                                "offload_param": {"device": "cpu"}}, "int8", False))
    return rows


def _activations(shape: Shape | None, batch: int, seq: int, ckpt: bool, esize: int) -> int | None:
    if shape is None:
        return None
    per = seq * batch * shape.hidden
    layer = 17 * esize * per  # 34 bytes per element of sequence x batch x hidden at 2 bytes
    return (esize * per * shape.layers + layer) if ckpt else layer * shape.layers


def _adam_rates(device_type: str, state_dtype: str = "fp32", threads: int | None = None,
                dtype: str = "bf16") -> tuple:
    """(CPU, GPU) seconds per element of zspeed's C AdamW here (the offloaded step of a ``dtype``
    model: its gradients in, its weights out) and of torch's on ``device_type`` ("cuda"
    measures the GPU too), None where one cannot be measured."""
    try:
        import torch
        from .runtime import memory
        from .runtime.config import parse_config
        from .runtime.split import measure_rates
        params = {"lr": 1e-4, **({"state_dtype": state_dtype} if state_dtype != "fp32" else {})}
        c = parse_config({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": params},
                          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, world_size=1)
        # 2^27 elements (2 GiB of masters, moments, gradients and weights), or 1/16 of the host
        # memory available if that is less: far beyond the caches and the TLB's reach, as a
        # model's step is (2^25 timed 30% faster than the engine's steps on the H200 host).
        avail = memory.available_host_bytes() or (16 << 30)
        elems = max(1 << 22, min(1 << 27, avail // 16 // 16))
        return measure_rates(torch.device(device_type), c.optimizer_name, c.optimizer_params, False, threads,
                             cpu_elems=elems, repeats=3, model_dtype=getattr(torch, _DTYPES[dtype]))
    except Exception:  # noqa: BLE001 - the timing only informs the report
        return None, None


def cpu_adam_seconds_per_element(threads: int | None = None, state_dtype: str = "fp32",
                                 dtype: str = "bf16") -> float | None:
    """zspeed's C AdamW on this machine (seconds per element of the offloaded step of a ``dtype``
    model), None without the native library."""
    return _adam_rates("cpu", state_dtype, threads, dtype)[0]


def measure_fwd_bwd(shape: Shape, batch: int, seq: int, ckpt: bool, dtype: str = "bf16", device="cuda",
                    repeats: int = 3) -> float:
    """Seconds of one micro-batch's forward and backward of a GPT of ``shape`` on ``device``,
    from one transformer block and the output layer timed there (the median of ``repeats``):
    layers x the block (x 4/3 with checkpointing, which recomputes each block's forward) + the
    output layer with the loss."""
    import time
    import torch
    import torch.nn.functional as F
    dev = torch.device(device)
    dt = getattr(torch, _DTYPES[dtype])
    h, ff = shape.hidden, shape.ffn or 4 * shape.hidden
    heads = max(1, shape.heads)

    def lin(i, o):
        return torch.nn.Linear(i, o, device=dev, dtype=dt)
    ln1, ln2, ln_f = (torch.nn.LayerNorm(h, device=dev, dtype=dt) for _ in range(3))
    qkv, proj, fc1, fc2 = lin(h, 3 * h), lin(h, h), lin(h, ff), lin(ff, h)
    head = torch.nn.Linear(h, shape.vocab, bias=False, device=dev, dtype=dt)

    def block(x):
        q, k, v = qkv(ln1(x)).view(batch, seq, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, h)
        x = x + proj(a)
        return x + fc2(F.gelu(fc1(ln2(x))))

    def out(x, y):
        return F.cross_entropy(head(ln_f(x)).float().view(-1, shape.vocab), y.view(-1))

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def timed(fn) -> float:
        times = []
        for i in range(repeats + 1):
            x = torch.randn(batch, seq, h, device=dev, dtype=dt, requires_grad=True)
            sync()
            t0 = time.perf_counter()
            fn(x).backward()
            sync()
            if i:  # the first run warms up
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
    y = torch.randint(0, shape.vocab, (batch, seq), device=dev)
    t_block = timed(lambda x: block(x).float().square().mean())
    t_out = timed(lambda x: out(x, y))
    return shape.layers * t_block * (4 / 3 if ckpt else 1.0) + t_out


def measure_h2d_gbs(device="cuda", mib: int = 256, repeats: int = 3) -> float:
    """GB/s (10^9 bytes per second) of a copy from page-locked host memory to ``device``, the
    median of ``repeats`` copies of ``mib`` MiB."""
    import time
    import torch
    dev = torch.device(device)
    src = torch.empty(mib << 20, dtype=torch.uint8).pin_memory()
    dst = torch.empty(mib << 20, dtype=torch.uint8, device=dev)
    times = []
    for i in range(repeats + 1):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(dev)
        if i:  # the first copy warms up
            times.append(time.perf_counter() - t0)
    return src.numel() / sorted(times)[len(times) // 2] / 1e9


def disk_seconds(nvme_bytes: float, read_gbs: float, write_gbs: float) -> float:
    """Seconds to read and then write ``nvme_bytes`` (one step of the NVMe swapper's masters and
    state) at the given GB/s (10^9 bytes per second)."""
    return nvme_bytes / (read_gbs * 1e9) + nvme_bytes / (write_gbs * 1e9)


def predicted_step(rp, cand: "Candidate", local: int, fwd_bwd: float, ckpt: bool, cpu_s: float | None,
                   gpu_s: float | None, disk: tuple | None = None, host_elems: int = 0) -> float | None:
    """The step time of one configuration (the module docstring's formulas); ``disk`` is (read,
    write) GB/s for the NVMe rows, ``host_elems`` the elements of three tiers' host share."""
    gpu_s = gpu_s or 0.0
    if rp.optimizer == "device":
        return fwd_bwd + gpu_s * local
    if "nvme" in (rp.optimizer, rp.cpu_tier):
        if disk is None or cpu_s is None:
            return None
        share = cand.cpu_share if rp.optimizer == "split" else 1.0
        return (fwd_bwd + gpu_s * local * (1 - share) + cpu_s * host_elems
                + disk_seconds(cand.total("nvme") * rp.world_size, *disk))
    if cpu_s is None:
        return None
    cpu = cpu_s * local * cand.cpu_share
    if rp.timing != "overlap":
        return fwd_bwd + gpu_s * local * (1 - cand.cpu_share) + cpu
    fwd = fwd_bwd / (4 if ckpt else 3)
    return gpu_s * local * (1 - cand.cpu_share) + max(fwd, cpu) + (fwd_bwd - fwd)


def _by_tier(rp, place, config, sizes, extra: list) -> dict:
    """The engine's footprint of one configuration (its components' needs) plus ``extra``, by tier."""
    from .runtime import memory
    from .runtime.assemble import footprint
    return memory.by_tier([n for n in footprint(rp, place, config, sizes) + extra if n.bytes])


def _tier_sizes(rp, place, config, sizes, extra: list, gpu_room: float, host_room: float) -> tuple:
    """(ratio, max_in_cpu) of the three-tier row: the GPU's share of the optimizer fills what the
    GPU has left of ``gpu_room`` (bytes) with the whole optimizer off it (as AutoSplit would,
    rounded up to 0.001 so the GPU is never asked for more), then host memory keeps the fp32
    masters and state of as many of the rest's elements as ``host_room`` leaves room for."""
    from .runtime import memory
    from .runtime.split import choose_ratio
    used = _by_tier(rp, place, config, dataclasses.replace(sizes, cpu_share=1.0, host_elems=0), extra)
    budget = max(0, gpu_room - sum(used.get("gpu", {}).values()))
    share = math.ceil(choose_ratio(sizes.local, budget, None, None) * 1000) / 1000
    host = _by_tier(rp, place, config, dataclasses.replace(sizes, cpu_share=share, host_elems=0), extra)
    room = host_room - sum(host.get("host", {}).values())
    _, per = memory.state_bytes(config)
    return share, int(max(0.0, min(room / (4 + per), sizes.local * share)))


def plan(model=None, *, params: float | None = None, hf_config=None, gpu_memory: float = 24.0,
         host_memory: float | None = None, disk: float | None = None, cores: int | None = None, gpus: int = 1,
         dtype: str = "bf16", batch: int = 1, seq: int = 1024, ckpt: bool = False,
         cpu_seconds_per_element: float | None = None, fwd_bwd_seconds: float | None = None,
         gpu_seconds_per_element: float | None = None, int8_seconds_per_element: float | None = None,
         disk_read_gbs: float | None = None, disk_write_gbs: float | None = None) -> PlanReport:
    """What fits (see the module docstring). Give the model as a module (best on the meta device),
    a transformers config (``hf_config``: a config.json path, a dict with model_type, or a
    PretrainedConfig) or a parameter count (``params``: a GPT of that size); memory in GiB
    (``host_memory`` defaults to what this machine has available; ``disk``: free space for NVMe
    swap files, None for no NVMe); ``gpus``: GPUs (ranks) on the host. The rates of the step
    prediction (seconds; per element for the optimizers: fp32 and int8 states on the CPU, the
    GPU's AdamW) are measured here where not given; ``fwd_bwd_seconds`` is measured only on a
    GPU (without it and without a GPU, no step is predicted); the NVMe rows' steps need the
    disk's rates (``disk_read_gbs``, ``disk_write_gbs``: GB/s, e.g. from ``zspeed bench io``)."""
    import torch
    from .runtime import memory
    from .runtime.assemble import placement
    from .runtime.config import ConfigError, parse_config
    from .runtime.layout import FlatLayout
    from .runtime.plan import RunPlan
    from .runtime.split import GPU_BYTES_PER_ELEM, MARGIN_FRACTION, MARGIN_MIN, choose_ratio
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    v = check_inputs(params=params, gpu_memory=gpu_memory, host_memory=host_memory, disk=disk, cores=cores,
                     gpus=gpus, batch=batch, seq=seq, fwd_bwd_seconds=fwd_bwd_seconds, disk_read_gbs=disk_read_gbs,
                     disk_write_gbs=disk_write_gbs,
                     rates=[("cpu_seconds_per_element", cpu_seconds_per_element),
                            ("gpu_seconds_per_element", gpu_seconds_per_element),
                            ("int8_seconds_per_element", int8_seconds_per_element)])
    params, gpu_memory, host_memory, disk, cores = v["params"], v["gpu_memory"], v["host_memory"], v["disk"], v["cores"]
    gpus, batch, seq, fwd_bwd_seconds = v["gpus"], v["batch"], v["seq"], v["fwd_bwd_seconds"]
    disk_read_gbs, disk_write_gbs = v["disk_read_gbs"], v["disk_write_gbs"]
    if (disk_read_gbs is None) != (disk_write_gbs is None):
        raise ValueError("give both disk_read_gbs and disk_write_gbs (GB/s, > 0; zspeed bench io measures "
                         "them), or neither")
    disk_rates = (disk_read_gbs, disk_write_gbs) if disk_read_gbs is not None else None
    given = sum(x is not None for x in (model, params, hf_config))
    if given != 1:
        raise ValueError("give exactly one of model=, params= or hf_config=")
    notes: list = []
    shape = None
    if params is not None:
        shape = Shape.for_params(params)
        model = _meta_gpt(shape)
        notes.append(f"the model is a GPT of {shape.layers} layers x {shape.hidden} hidden ({shape.heads} heads, "
                     f"vocabulary {shape.vocab}); give --hf-config for your model's own shape")
    elif hf_config is not None:
        model, cfg = _hf_model(hf_config)
        shape = Shape.of_hf_config(cfg)
    else:
        c = getattr(model, "config", None)
        if c is not None and (getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", None)) and \
                (getattr(c, "hidden_size", None) or getattr(c, "n_embd", None) or getattr(c, "d_model", None)):
            shape = Shape.of_hf_config(c)
        else:
            notes.append("the module's transformer shape is unknown: activations are not counted (add them "
                         "to the GPU column)")
    tdtype = getattr(torch, _DTYPES[dtype])
    esize = torch.empty((), dtype=tdtype).element_size()
    trained = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]
    layout = FlatLayout([{"params": trained}])
    nparams = sum(p.numel() for p in dict.fromkeys(model.parameters()))
    avail = memory.available_host_bytes()
    host_b = int(host_memory * GiB) if host_memory is not None else avail
    if host_memory is None:
        notes.append("host memory: what this machine has available now (--host-mem to plan another)")
    ncores = cores or os.cpu_count() or 1
    here = os.cpu_count() or 1
    cpu_s = cpu_seconds_per_element if cpu_seconds_per_element is not None else \
        cpu_adam_seconds_per_element(dtype=dtype)
    int8_s = int8_seconds_per_element
    if int8_s is None:  # the rate given applies to every state dtype; else measured here
        int8_s = cpu_s if cpu_seconds_per_element is not None else \
            cpu_adam_seconds_per_element(state_dtype="int8", dtype=dtype)
    scaled = cpu_s is not None and cores is not None and cores != here
    if scaled:  # the C kernel's threads scale about linearly with cores until memory bandwidth binds
        cpu_s = cpu_s * here / cores
        int8_s = int8_s * here / cores if int8_s is not None else None
        notes.append(f"CPU Adam time measured on {here} cores here and scaled to {cores}: an estimate")
    on_gpu = torch.cuda.is_available()
    gpu_s = gpu_seconds_per_element
    if gpu_s is None and on_gpu:
        gpu_s = _adam_rates("cuda")[1]
    fb_from, fetch_s = "given", 0.0
    if fwd_bwd_seconds is None and on_gpu and shape is not None:
        fwd_bwd_seconds = measure_fwd_bwd(shape, batch, seq, ckpt, dtype)
        fb_from = f"one block and the output layer timed on {torch.cuda.get_device_name(0)}"
        # ZeRO-3 with offload_param: the block timing has no weight fetches; about one pass of the
        # 16-bit weights over PCIe is not hidden by compute (the module docstring).
        fetch_s = nparams * esize / (measure_h2d_gbs() * 1e9)
    gpu_b = int(gpu_memory * GiB)
    margin = max(MARGIN_MIN, int(MARGIN_FRACTION * gpu_b))
    act = _activations(shape, batch, seq, ckpt, esize)
    rows = []
    for name, zero, sd, auto in _candidates(disk is not None):
        cfg = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, **({"state_dtype": sd} if sd != "fp32" else {})}},
               "zero_optimization": json.loads(json.dumps(zero)), "zspeed_summary": False}
        if dtype != "fp32":
            cfg[dtype] = {"enabled": True}
        if auto is True:  # with overlap_forward: the fastest exact step
            cfg["zero_optimization"]["offload_optimizer"].update(ratio="auto", overlap_forward=True)
        if zero.get("offload_optimizer", {}).get("device") == "nvme":  # a folder that exists: the disk is --disk
            cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = tempfile.gettempdir()
        try:
            config = parse_config(cfg, world_size=gpus)
            rp = RunPlan.build(config, world_size=gpus, rank=0, device=torch.device("cuda", 0), dtype=tdtype,
                               backend="nccl" if gpus > 1 else None, client="none")
        except ConfigError as e:
            notes.append(f"{name}: {e}")
            continue
        place = placement(rp)
        sizes = place.sizes(config, model, layout)
        cand = Candidate(name, cfg)
        # What the engine cannot know at start-up, on top of its components' footprint.
        extra = []
        if rp.store != "partitioned":
            extra.append(memory.Need("gpu", "gradients (autograd's, whole model)", esize * sizes.model))
        if act is not None:
            extra.append(memory.Need("gpu", "activations" + (" (checkpointed)" if ckpt else ""), act))
        tiers = _by_tier(rp, place, config, sizes, extra)
        if auto == "tiers":  # the GPU's share from its room, then host memory's from what is left there
            share, kept = _tier_sizes(rp, place, config, sizes, extra, gpu_b - margin,
                                      0.9 * host_b / gpus if host_b is not None else 0.0)
            sizes = dataclasses.replace(sizes, cpu_share=share, host_elems=kept)
            tiers = _by_tier(rp, place, config, sizes, extra)
            cfg["zero_optimization"]["offload_optimizer"].update(ratio=share, max_in_cpu=kept)
            cand.name = f"{name} (GPU {100 * (1 - share):.0f}%, host {100 * kept / max(1, sizes.local):.0f}%)"
        elif auto:  # what AutoSplit would give the GPU after the first step
            budget = max(0, gpu_b - sum(tiers.get("gpu", {}).values()) - margin)
            share = choose_ratio(sizes.local, budget, None, None)
            sizes = dataclasses.replace(sizes, cpu_share=share)
            tiers = _by_tier(rp, place, config, sizes, extra)
            cand.name = f"{name} (GPU takes {100 * (1 - share):.0f}%)"
        cand.tiers = tiers
        cand.cpu_share = sizes.cpu_share if rp.optimizer != "device" else 0.0
        rate = int8_s if sd == "int8" else cpu_s
        kept = min(sizes.host_elems, int(sizes.local * sizes.cpu_share))  # three tiers: the host's share
        if rate is not None and rp.optimizer in ("host", "split") and rp.cpu_tier == "host":
            cand.cpu_step_s = rate * sizes.local * cand.cpu_share
        elif rate is not None and kept:  # the NVMe share's time is the disk's (see predicted_step)
            cand.cpu_step_s = rate * kept
        if fwd_bwd_seconds is not None:
            fb = fwd_bwd_seconds + (fetch_s if rp.param_medium == "host" else 0.0)
            cand.step_s = predicted_step(rp, cand, sizes.local, fb, ckpt, rate, gpu_s, disk_rates, kept)
        if "nvme" in (rp.optimizer, rp.cpu_tier):
            cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = "/path/on/your/nvme"
        gpu_need = cand.total("gpu")
        if gpu_need + margin > gpu_b + GPU_BYTES_PER_ELEM:  # "auto" fills its budget to the element
            cand.why.append(f"GPU: {gpu_need / GiB:.2f} GiB + {margin / GiB:.2f} GiB margin > {gpu_memory:g} GiB")
        host_need = cand.total("host") * gpus
        if host_b is not None and host_need > 0.9 * host_b:
            cand.why.append(f"host: {host_need / GiB:.2f} GiB > 90% of {host_b / GiB:.1f} GiB")
        nvme_need = cand.total("nvme") * gpus
        if nvme_need and nvme_need > disk * GiB:
            cand.why.append(f"NVMe: {nvme_need / GiB:.2f} GiB > {disk:g} GiB")
        cand.fits = not cand.why
        rows.append(cand)
    if disk is not None and disk_rates is None:
        notes.append("with the optimizer on NVMe each step reads and writes the masters and state (the NVMe "
                     "column) once: the disk's speed sets the step time (--disk-read-gbs and --disk-write-gbs "
                     "predict it; zspeed bench io measures them)")
    machine = {"gpus": gpus, "gpu_gib": gpu_memory, "host_gib": (host_b or 0) / GiB, "disk_gib": disk,
               "cores": ncores, "cpu_ns": (cpu_s or float("nan")) * 1e9, "scaled": scaled, "dtype": dtype,
               "batch": batch, "seq": seq, "ckpt": ckpt, "fwd_bwd_s": fwd_bwd_seconds, "fwd_bwd_from": fb_from,
               "fetch_s": fetch_s,
               "gpu_ns": (gpu_s or 0.0) * 1e9, "int8_ns": (int8_s or float("nan")) * 1e9}
    return PlanReport(params=nparams, machine=machine, candidates=rows, notes=notes)


def largest(*, gpu_memory: float = 24.0, host_memory: float | None = None, disk: float | None = None,
            gpus: int = 1, dtype: str = "bf16", batch: int = 1, seq: int = 1024, ckpt: bool = True,
            cpu_seconds_per_element: float | None = None) -> dict:
    """The largest GPT (``Shape.for_params`` shapes) each candidate configuration fits on the
    machine, by bisection on the parameter count: {candidate name without its GPU share: params}
    (0 where not even 100M parameters fit)."""
    check_inputs(params=None, gpu_memory=gpu_memory, host_memory=host_memory, disk=disk, cores=None, gpus=gpus,
                 batch=batch, seq=seq, fwd_bwd_seconds=None, disk_read_gbs=None, disk_write_gbs=None,
                 rates=[("cpu_seconds_per_element", cpu_seconds_per_element)])
    if cpu_seconds_per_element is None:
        cpu_seconds_per_element = cpu_adam_seconds_per_element(dtype=dtype) or 1e-9
    kw = dict(gpu_memory=gpu_memory, host_memory=host_memory, disk=disk, gpus=gpus, dtype=dtype, batch=batch,
              seq=seq, ckpt=ckpt, cpu_seconds_per_element=cpu_seconds_per_element)

    seen: dict = {}

    def fits(n) -> dict:
        rep = plan(params=n, **kw)
        seen[n] = rep.params  # the GPT of that size has this many parameters (its shape is rounded)
        return {c.name.split(" (GPU")[0]: c.fits for c in rep.candidates}

    names = list(fits(1e8))
    out = {}
    for name in names:
        lo, hi = 1e8, 1e13
        if not fits(lo).get(name):
            out[name] = 0
            continue
        for _ in range(40):  # to well under 1% of the answer
            mid = math.sqrt(lo * hi)
            if fits(mid).get(name):
                lo = mid
            else:
                hi = mid
            if hi / lo < 1.002:
                break
        out[name] = seen[lo]
    return out


def _cli_count(text: str) -> float:
    try:
        return parse_count(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("params=", "")) from None


def _cli_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _cli_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zspeed plan", description=(
        "Which ZeRO stage, offload tiers and optimizer state dtype fit a model on a machine, what each "
        "tier holds, and the CPU optimizer's time per step (measured here). Give the model as a "
        "parameter count or a Hugging Face config."))
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--params", type=_cli_count, help="parameter count of a GPT-shaped model, e.g. 13e9, 7B or 1.5B")
    src.add_argument("--hf-config", help="a transformers config.json (or its folder): the model's own shape")
    ap.add_argument("--gpu-mem", type=_cli_float, default=24.0, help="GiB of memory per GPU (default 24)")
    ap.add_argument("--gpus", type=_cli_int, default=1, help="GPUs (ranks) on this host (default 1)")
    ap.add_argument("--host-mem", type=_cli_float, default=None, help="GiB of host memory (default: available here)")
    ap.add_argument("--disk", type=_cli_float, default=None, help="GiB free on an NVMe disk for swap files (default: none)")
    ap.add_argument("--cores", type=_cli_int, default=None, help="CPU cores of the host (default: this machine's)")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    ap.add_argument("--batch", type=_cli_int, default=1, help="micro-batch per GPU (default 1)")
    ap.add_argument("--seq", type=_cli_int, default=1024, help="sequence length (default 1024)")
    ap.add_argument("--ckpt", action="store_true", help="with activation checkpointing per layer")
    ap.add_argument("--fwd-bwd-s", type=_cli_float, default=None, help="seconds of one micro-batch's forward and "
                    "backward without offload (default: timed here on a GPU; without one, no step is predicted)")
    ap.add_argument("--disk-read-gbs", type=_cli_float, default=None, help="the NVMe disk's read rate in GB/s (with "
                    "--disk-write-gbs: the NVMe rows' steps are predicted; zspeed bench io measures both)")
    ap.add_argument("--disk-write-gbs", type=_cli_float, default=None, help="the NVMe disk's write rate in GB/s")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--largest", action="store_true", help="instead: the largest GPT each configuration fits "
                    "(with --ckpt for activation checkpointing)")
    a = ap.parse_args(argv)
    if a.largest:
        if a.params is not None or a.hf_config is not None:
            ap.error("--largest finds the model size itself: leave out --params and --hf-config")
        try:
            sizes = largest(gpu_memory=a.gpu_mem, host_memory=a.host_mem, disk=a.disk, gpus=a.gpus, dtype=a.dtype,
                            batch=a.batch, seq=a.seq, ckpt=a.ckpt)
        except ValueError as e:
            sys.stderr.write(f"zspeed plan: {e}\n")
            return 2
        if a.json:
            sys.stdout.write(json.dumps(sizes, indent=1) + "\n")
        else:
            sys.stdout.write(f"zspeed plan --largest: the largest GPT each configuration fits ({a.gpus} GPU(s) of "
                             f"{a.gpu_mem:g} GiB, batch {a.batch} x {a.seq}{', checkpointing' if a.ckpt else ''}):\n")
            for name, n in sizes.items():
                sys.stdout.write(f"  {name:<52} {n / 1e9:8.2f}B\n")
        return 0 if any(sizes.values()) else 1
    if a.params is None and a.hf_config is None:
        ap.error("give the model: --params N or --hf-config PATH (or --largest)")
    try:
        rep = plan(params=a.params, hf_config=a.hf_config, gpu_memory=a.gpu_mem, host_memory=a.host_mem,
                   disk=a.disk, cores=a.cores, gpus=a.gpus, dtype=a.dtype, batch=a.batch, seq=a.seq, ckpt=a.ckpt,
                   fwd_bwd_seconds=a.fwd_bwd_s, disk_read_gbs=a.disk_read_gbs, disk_write_gbs=a.disk_write_gbs)
    except ValueError as e:
        sys.stderr.write(f"zspeed plan: {e}\n")
        return 2
    sys.stdout.write(json.dumps(rep.to_dict(), indent=1) + "\n" if a.json else str(rep))
    return 0 if rep.best is not None else 1
