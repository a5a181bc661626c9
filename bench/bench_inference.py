"""Generation throughput with the weights offloaded to host memory or NVMe (ZeRO-Inference):
zspeed against DeepSpeed, one implementation per run of this script.

Model: a Llama-architecture model from transformers with random weights, 13B-class by
default (40 layers, d_model 5120, 40 heads, FFN 13824, vocabulary 32000: 13.0B parameters,
26 GB in bf16). It is built in the inference dtype on the host without running any
initializer: the parameters are created on the meta device while the modules are
constructed (the buffers, such as the rotary frequencies, are computed normally on the
host), then each one is allocated on the host and filled from one pool of N(0, 0.02)
values at a random offset (norm weights: ones). Building needs one copy of the model in
host memory, and the same --seed gives the same weights to every implementation.

- ``--impl zspeed``: ``zspeed.init_inference(model, config={"dtype", "zero": {"stage": 3,
  "offload_param": {"device": cpu|nvme, "pin_memory", "nvme_path"}, stage-3 knobs}})``;
  generation through ``engine.generate`` (the model's own, under no_grad).
- ``--impl deepspeed``: DeepSpeed's ZeRO-Inference path: ZeRO stage 3 with the same
  offload_param and stage-3 knobs, the same dtype, train_micro_batch_size_per_gpu 1, no
  optimizer. ``deepspeed.initialize`` moves a model that zero.Init did not partition to
  the GPU whole before partitioning it (it would not fit under the cap), so the host-built
  model is first partitioned in place with ``deepspeed.zero.Init(module=model,
  config_dict_or_path=ds_config)`` (one parameter at a time through the GPU into its
  offload device); its buffers are moved to the GPU as zero.Init would have created them
  there; then ``deepspeed.initialize(model=model, config=ds_config)``,
  ``engine.module.eval()`` and generation on ``engine.module``. NVMe adds DeepSpeed's
  buffer pool (``--ds-nvme-buffers`` buffers of the largest parameter's size) and the aio
  section of DeepSpeed's own ZeRO-Inference example (16 MiB blocks, queue depth 64, 8
  threads); DeepSpeed keeps parameters smaller than one block in host memory (at 13B: the
  norm weights only). zspeed gets no aio section (init_inference reads dtype and zero only).
- ``--impl torch``: the plain model on the GPU (no offload), when it fits: the anchor.

Measured: a warm-up generation of --warmup-tokens new tokens, then --runs prefill
forwards of the prompt (time to first token, without sampling) and --runs timed
``generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False, use_cache=True)``
calls (greedy, always N new tokens). Printed: median tokens/s (N * batch / time), the
median prefill time, the decode rate after the first token, peak GPU memory during the
timed part and during set-up, the host's peak RSS, the build and set-up times, and the
first generated tokens (to compare implementations), then one ``RESULT {json}`` line.
--budget-s stops starting timed runs once the next one would end past that many seconds
since start (at least one run of each kind is made).

Commands for the H200 (GPU capped at 24 GiB, 13B bf16, prompt 32, batch 1, 128 new
tokens). DeepSpeed needs RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, which this
script sets when they are absent; for DeepSpeed's NVMe path its async_io op must build
(libaio: run under ``bench/gpu_host.sh``'s environment with ZS_HOST_DEBS, as ds-nvme
does; TORCH_CUDA_ARCH_LIST is set to the GPU's major.minor when absent):

    python3 bench/bench_inference.py --impl zspeed --offload-param cpu --gpu-cap 24 --budget-s 540
    python3 bench/bench_inference.py --impl zspeed --offload-param nvme --nvme-path /tmp/zs-inf \\
        --gpu-cap 24 --new-tokens 8 --runs 1 --budget-s 540
    python3 bench/bench_inference.py --impl deepspeed --offload-param cpu --gpu-cap 24 --budget-s 540
    python3 bench/bench_inference.py --impl deepspeed --offload-param nvme --nvme-path /tmp/zs-inf \\
        --gpu-cap 24 --new-tokens 8 --runs 1 --budget-s 540
    python3 bench/bench_inference.py --impl torch --gpu-cap 0 --layers 20    # no-offload anchor (6.6B)

Every generated token streams all the weights to the GPU once (26 GB at 13B): about 1 s
per token at ~25 GB/s of host-to-device copies, and ~20 s per token from a disk that
reads 1.3 GB/s (the H200 host's), so 128 tokens from NVMe do not fit in a 10-minute
command; the NVMe lines above generate 8 tokens (tokens/s then includes the prefill step;
the decode rate is printed too). The NVMe folder needs about the model's size free
(checked); each run writes in its own subfolder, deleted at the end.

Exit codes: 0 done, 2 the implementation refuses the configuration (e.g. NVMe where it
is not supported) or a prerequisite is missing, 3 out of GPU memory (one line
``OOM during <phase>``).

CPU smoke run (no GPU): ``python3 bench/bench_inference.py --device cpu --impl zspeed
--layers 2 --d-model 64 --heads 4 --ffn 128 --vocab 256 --new-tokens 4 --dtype fp32``.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from bench_engine import _peak_rss, _rss, exit_on_oom  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Weights are copied from a pool of this many N(0, 0.02) values, at a random offset below SHIFT.
POOL, SHIFT = 1 << 24, 1 << 20
# DeepSpeed's own ZeRO-Inference example (DeepSpeedExamples, inference/huggingface/zero_inference)
# uses these aio settings for NVMe.
DS_AIO = {"block_size": 16 << 20, "queue_depth": 64, "intra_op_parallelism": 8, "single_submit": False,
          "overlap_events": True}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=["zspeed", "deepspeed", "torch"], default="zspeed")
    ap.add_argument("--offload-param", choices=["cpu", "nvme", "none"], default="cpu",
                    help="where the weights live between uses (none: ZeRO-3 shards on the GPU)")
    ap.add_argument("--nvme-path", default="/tmp/zs-inf", help="folder for --offload-param nvme")
    ap.add_argument("--no-pin", action="store_true", help="offload_param.pin_memory false")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--d-model", type=int, default=5120)
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--ffn", type=int, default=13824)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--warmup-tokens", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=0, help="start no timed run that would end later than "
                    "this many seconds after start (0: no limit); one run of each kind is always made")
    ap.add_argument("--gpu-cap", type=float, default=24, help="GiB of GPU memory this process may use (0: all)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke run without a GPU")
    ap.add_argument("--persistence", type=float, default=1e5, help="stage3_param_persistence_threshold")
    ap.add_argument("--max-live", type=float, default=1e9, help="stage3_max_live_parameters")
    ap.add_argument("--prefetch", type=float, default=5e7, help="stage3_prefetch_bucket_size")
    ap.add_argument("--ds-nvme-buffers", type=int, default=5, help="DeepSpeed offload_param.buffer_count (nvme)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.impl == "torch" and a.offload_param != "none":
        a.offload_param = "none"  # the anchor keeps the whole model on the device
    for name in ("layers", "d_model", "heads", "ffn", "vocab", "prompt_len", "batch", "new_tokens", "runs"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.d_model % a.heads:
        ap.error("--d-model must be a multiple of --heads")
    if a.warmup_tokens < 1:
        ap.error("--warmup-tokens must be at least 1")
    return a


# -- the model -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def parameters_on_meta():
    """While inside, every parameter a module registers is replaced by a meta tensor of the
    same shape (no memory, and initializers on it do nothing); buffers stay real."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def materialize(model: torch.nn.Module, dtype: torch.dtype, seed: int) -> None:
    """Gives every meta parameter host storage in ``dtype``: 1-D parameters of norm layers get
    ones, other 1-D parameters zeros, the rest slices of one random pool at random offsets
    (a copy, not a random draw per element: fast, and the same for the same seed)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.empty(POOL + SHIFT).normal_(0.0, 0.02, generator=gen).to(dtype)
    done: dict[int, torch.nn.Parameter] = {}
    with torch.no_grad():
        for m in model.modules():
            for name, p in list(m._parameters.items()):
                if p is None:
                    continue
                if id(p) in done:  # a tied parameter: the same new tensor
                    m._parameters[name] = done[id(p)]
                    continue
                t = torch.empty(p.shape, dtype=dtype if p.is_floating_point() else p.dtype)
                if p.dim() <= 1:
                    t.fill_(1.0 if "norm" in type(m).__name__.lower() else 0.0)
                else:
                    flat, i = t.view(-1), 0
                    while i < flat.numel():
                        k = min(POOL, flat.numel() - i)
                        s = int(torch.randint(0, SHIFT, (1,), generator=gen))
                        flat[i:i + k].copy_(pool[s:s + k])
                        i += k
                new = torch.nn.Parameter(t, requires_grad=p.requires_grad)
                m._parameters[name] = new
                done[id(p)] = new


def build_llama(a, dtype: torch.dtype) -> torch.nn.Module:
    """The Llama model of the arguments on the host in ``dtype`` (see the module docstring)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
                      max_position_embeddings=max(2048, a.prompt_len + a.new_tokens),
                      tie_word_embeddings=False, attn_implementation="sdpa")
    with parameters_on_meta():
        model = LlamaForCausalLM(cfg)
    materialize(model, dtype, a.seed)
    return model.eval()


def count_params(model: torch.nn.Module) -> int:
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def released(model: torch.nn.Module) -> str:
    """How many parameters hold no data outside a forward (partitioned away), of how many."""
    ps = list(model.parameters())
    return f"{sum(p.numel() == 0 for p in ps)}/{len(ps)}"


def buffers_to(model: torch.nn.Module, device: torch.device) -> None:
    """Moves the buffers (not the parameters) to ``device``, keeping their dtypes."""
    for m in model.modules():
        for name, b in m._buffers.items():
            if b is not None:
                m._buffers[name] = b.to(device)


# -- configs -------------------------------------------------------------------------------------------
def offload_section(a, folder: str | None) -> dict:
    off = {"device": a.offload_param, "pin_memory": not a.no_pin}
    if a.offload_param == "nvme":
        off["nvme_path"] = folder
    return off


def stage3_knobs(a) -> dict:
    return {"stage3_param_persistence_threshold": int(a.persistence),
            "stage3_max_live_parameters": int(a.max_live), "stage3_prefetch_bucket_size": int(a.prefetch)}


def zspeed_config(a, folder: str | None, largest: int = 0) -> dict:
    zero = {"stage": 3, **stage3_knobs(a)}
    if a.offload_param != "none":
        zero["offload_param"] = offload_section(a, folder)
    if a.offload_param == "nvme":
        # Every weight on NVMe (max_in_cpu 0), read through buffers that take the largest one.
        zero["offload_param"].update(buffer_count=a.ds_nvme_buffers, buffer_size=largest, max_in_cpu=0)
    return {"dtype": a.dtype, "zero": zero}


def deepspeed_config(a, folder: str | None, largest: int) -> dict:
    zero = {"stage": 3, **stage3_knobs(a)}
    if a.offload_param != "none":
        zero["offload_param"] = offload_section(a, folder)
    c = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": zero,
         "bf16": {"enabled": a.dtype == "bf16"}, "fp16": {"enabled": a.dtype == "fp16"},
         "steps_per_print": 10**9, "wall_clock_breakdown": False}
    if a.offload_param == "nvme":
        # One buffer holds one parameter: each must take the largest one.
        zero["offload_param"].update(buffer_count=a.ds_nvme_buffers, buffer_size=largest)
        c["aio"] = dict(DS_AIO)
    return c


# -- helpers -------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fail(code: int, line: str) -> None:
    print(line, flush=True)
    sys.stderr.flush()
    raise SystemExit(code)


def oom_exits(phase: str):
    """Running out of GPU memory prints the one line ``OOM during <phase>`` and exits with code 3."""
    return exit_on_oom(f"OOM during {phase}")


def _deepspeed_env(a) -> None:
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", str(_free_port())), ("NCCL_NVLS_ENABLE", "0")):
        os.environ.setdefault(k, v)
    if a.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    elif a.offload_param == "nvme" and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        # torch names Hopper "9.0a", which DeepSpeed's op builder cannot parse; its async_io
        # op is JIT-built for the plain major.minor.
        os.environ["TORCH_CUDA_ARCH_LIST"] = "%d.%d" % torch.cuda.get_device_capability()


def _deepspeed_aio_ready() -> str | None:
    """None when DeepSpeed's async_io op loads here, else why not."""
    try:
        from deepspeed.accelerator import get_accelerator
        b = get_accelerator().create_op_builder("AsyncIOBuilder")
        if b is None or not b.is_compatible(verbose=False):
            return ("DeepSpeed's async_io op is not compatible here (it needs libaio's header and library; "
                    "on the H200 host run under bench/gpu_host.sh's environment with ZS_HOST_DEBS)")
        b.load(verbose=False)
    except Exception as e:  # noqa: BLE001 - any failure to build or load is the reason
        return f"DeepSpeed's async_io op does not build or load: {type(e).__name__}: {str(e)[-300:]}"
    return None


def _digest(ids: torch.Tensor) -> str:
    return hashlib.sha1(ids.detach().cpu().to(torch.int64).numpy().tobytes()).hexdigest()[:12]


# -- the run -------------------------------------------------------------------------------------------
def setup(a, model, dev, folder):
    """The implementation's engine around ``model``: returns (forward, generate, versions)."""
    if a.impl == "torch":
        model.to(dev)
        return model, model.generate, {}
    if a.impl == "zspeed":
        import zspeed
        from zspeed.runtime.config import ConfigError
        try:
            engine = zspeed.init_inference(model, config=zspeed_config(
                a, folder, max(p.numel() for p in model.parameters())))
        except ConfigError as e:
            if a.offload_param == "nvme":
                _fail(2, f"zspeed refuses offload_param nvme: {e}")
            raise
        return engine, engine.generate, {"zspeed": getattr(zspeed, "__version__", "?"),
                                         "released_params": released(engine.module)}
    import deepspeed
    largest = max(p.numel() for p in model.parameters())
    cfg = deepspeed_config(a, folder, largest)
    deepspeed.init_distributed()
    deepspeed.zero.Init(module=model, config_dict_or_path=cfg)
    buffers_to(model, dev)
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    module = engine.module
    module.eval()
    return module, module.generate, {"deepspeed": deepspeed.__version__, "released_params": released(module),
                                     "ds_param_manager": type(engine.optimizer).__name__}


def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        _fail(2, "no CUDA device: run with --device cpu for a smoke run")
    if a.impl == "zspeed":
        if cuda:
            os.environ.setdefault("ZSPEED_DEVICE", "cuda:0")
        else:
            os.environ["ZSPEED_DEVICE"] = "cpu"
    if a.impl == "deepspeed":
        _deepspeed_env(a)
        try:
            importlib.import_module("deepspeed")
        except Exception as e:  # noqa: BLE001 - not installed, or broken: either way it cannot run
            _fail(2, f"deepspeed does not import: {type(e).__name__}: {e}")
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
        if a.gpu_cap:
            total = torch.cuda.get_device_properties(dev).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, a.gpu_cap * 2**30 / total), dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = DTYPES[a.dtype]

    folder = None
    if a.offload_param == "nvme":
        os.makedirs(a.nvme_path, exist_ok=True)
        elems = a.layers * (4 * a.d_model**2 + 3 * a.d_model * a.ffn) + 2 * a.vocab * a.d_model
        need = elems * torch.tensor([], dtype=dtype).element_size() + (1 << 30)
        free = shutil.disk_usage(a.nvme_path).free
        if free < need:
            _fail(2, f"{a.nvme_path} has {free / 2**30:.1f} GiB free; the weights need about {need / 2**30:.1f} GiB")
        folder = tempfile.mkdtemp(prefix=f"{a.impl}-", dir=a.nvme_path)
    try:
        if a.impl == "deepspeed" and a.offload_param == "nvme":
            # Before the model is built, and outside the set-up time: the op may be JIT-built now.
            t0 = time.perf_counter()
            why = _deepspeed_aio_ready()
            if why:
                _fail(2, f"deepspeed cannot offload to nvme here: {why}")
            print(f"DeepSpeed's async_io op loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        return _run(a, dev, cuda, sync, dtype, folder, t_start)
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def _run(a, dev, cuda, sync, dtype, folder, t_start) -> int:
    t0 = time.perf_counter()
    model = build_llama(a, dtype)
    nparams = count_params(model)
    build_s = time.perf_counter() - t0
    print(f"built {nparams / 1e9:.2f}B parameters ({a.dtype}) on the host in {build_s:.1f} s, "
          f"RSS {_rss() / 2**30:.1f} GiB", flush=True)
    t0 = time.perf_counter()
    with oom_exits("set-up"):
        fwd, generate, versions = setup(a, model, dev, folder)
    del model
    sync()
    init_s = time.perf_counter() - t0
    print(f"{a.impl}: ready in {init_s:.1f} s (offload_param {a.offload_param}), RSS {_rss() / 2**30:.1f} GiB",
          flush=True)

    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, a.vocab, (a.batch, a.prompt_len), generator=g).to(dev)
    mask = torch.ones_like(ids)
    common = dict(attention_mask=mask, do_sample=False, use_cache=True, pad_token_id=0)

    def gen(n):
        return generate(ids, max_new_tokens=n, min_new_tokens=n, **common)

    with oom_exits("the warm-up generation"), torch.no_grad():
        t0 = time.perf_counter()
        gen(a.warmup_tokens)
        sync()
        print(f"warm-up ({a.warmup_tokens} new tokens): {time.perf_counter() - t0:.2f} s", flush=True)
    setup_peak = torch.cuda.max_memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    def over_budget(last: float) -> bool:
        return a.budget_s > 0 and time.perf_counter() - t_start + last > a.budget_s

    prefill, gen_s, out = [], [], None
    with oom_exits("the prefill forward"), torch.no_grad():
        for _ in range(a.runs):
            sync()
            t0 = time.perf_counter()
            fwd(input_ids=ids, attention_mask=mask, use_cache=True)
            sync()
            prefill.append(time.perf_counter() - t0)
            if over_budget(prefill[-1]):
                break
    print(f"prefill ({a.batch} x {a.prompt_len} tokens): " + ", ".join(f"{t:.3f}" for t in prefill) + " s",
          flush=True)
    with oom_exits("generation"), torch.no_grad():
        for i in range(a.runs):
            sync()
            t0 = time.perf_counter()
            out = gen(a.new_tokens)
            sync()
            gen_s.append(time.perf_counter() - t0)
            print(f"run {i}: {a.new_tokens} new tokens x {a.batch} in {gen_s[-1]:.2f} s "
                  f"({a.new_tokens * a.batch / gen_s[-1]:.2f} tokens/s)", flush=True)
            if over_budget(gen_s[-1]):
                break
    new = out[:, a.prompt_len:]
    if new.shape[1] != a.new_tokens:
        raise RuntimeError(f"generate returned {new.shape[1]} new tokens, expected {a.new_tokens}")
    med, pre = statistics.median(gen_s), statistics.median(prefill)
    decode = a.batch * (a.new_tokens - 1) / (med - pre) if a.new_tokens > 1 and med > pre else None
    import transformers
    res = {
        "impl": a.impl, "offload_param": a.offload_param, "pin": not a.no_pin, "dtype": a.dtype,
        "device": str(dev), "gpu_cap_gib": a.gpu_cap if cuda else None,
        "params": nparams, "layers": a.layers, "d_model": a.d_model, "heads": a.heads, "ffn": a.ffn,
        "vocab": a.vocab, "batch": a.batch, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "runs": len(gen_s), "tokens_per_s": round(a.new_tokens * a.batch / med, 3), "gen_s": round(med, 3),
        "gen_s_all": [round(t, 3) for t in gen_s], "prefill_s": round(pre, 4),
        "decode_tokens_per_s": round(decode, 3) if decode else None,
        "peak_alloc_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None,
        "setup_peak_alloc_gib": round(setup_peak / 2**30, 2) if cuda else None,
        "host_peak_rss_gib": round(_peak_rss() / 2**30, 2), "host_rss_gib": round(_rss() / 2**30, 2),
        "build_s": round(build_s, 1), "init_s": round(init_s, 1),
        "stage3": {"persistence": int(a.persistence), "max_live": int(a.max_live), "prefetch": int(a.prefetch)},
        "first_tokens": new[0, :8].tolist(), "tokens_sha1": _digest(new),
        "torch": torch.__version__, "transformers": transformers.__version__, **versions,
        "gpu": torch.cuda.get_device_name(dev) if cuda else None,
    }
    print(f"{a.impl} ({a.offload_param}): {nparams / 1e9:.2f}B params, {res['tokens_per_s']:.2f} tokens/s "
          f"({a.new_tokens} new x batch {a.batch}, median of {len(gen_s)}), prefill {pre:.3f} s, "
          f"decode {res['decode_tokens_per_s']} tokens/s, peak GPU {res['peak_alloc_gib']} GiB allocated, "
          f"host peak {res['host_peak_rss_gib']} GiB")
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
