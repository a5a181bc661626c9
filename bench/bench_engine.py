"""GPU benchmark of the offloaded training step: a ~1.3B-parameter GPT with ZeRO-2 + CPU offload.

Default shape (the issue's reference): 24 layers, d_model 2048, 16 heads, vocab 32000,
batch 8 x 1024 tokens, bf16 -> 1.34B parameters. Prints the median step time, its
split (forward+backward / optimizer step incl. copies), tokens/s and peak GPU memory,
then one machine-readable line starting with RESULT.

  python bench/bench_engine.py                          # zspeed, offload cpu, native CPUAdam
  python bench/bench_engine.py --impl torch             # GPU-only reference (torch fused AdamW)
  python bench/bench_engine.py --impl deepspeed         # DeepSpeed ZeRO-2 + offload (if installed)
  python bench/bench_engine.py --layers 2 --d-model 512 --seq 256 --steps 5   # shrunk smoke run
  torchrun --nproc_per_node 2 bench/bench_engine.py     # data parallel: batch 8 x 1024 per rank,
                                                        # tokens/s over all ranks, memory per rank
Flags: --torch-adam (torch AdamW on the CPU instead of zspeed.ops), --state-dtype bf16|int8,
--no-pin, --offload none, --dtype fp16|bf16, --threads N (CPU optimizer threads).

The offloaded step's modes (issue 16): --ratio R|auto (offload_optimizer.ratio: the GPU steps
the first 1-R of the parameters), --overlap-forward (the CPU step runs during the next forward,
exact), --delayed-update (one step stale), --trace FILE (a Chrome trace of the engine's phases),
and DeepSpeed's ZenFlow side by side (--impl deepspeed --zenflow). With a step in the background,
"optimizer" is the time engine.step() takes to start it; the waits land in the next fwd+bwd, and
the step total (median and mean) is what to compare.

ZeRO-3 (models larger than the GPU): --stage 3 --offload-param cpu, with --gpu-cap GiB
(torch.cuda.set_per_process_memory_fraction: a consumer card's memory), --ckpt (activation
checkpointing per block), --init (build the model under zero.Init in the training dtype),
--model llama (a Llama-architecture model from transformers, random weights). Peak host
memory (ru_maxrss) is reported with the result:

  python bench/bench_engine.py --stage 3 --offload-param cpu --gpu-cap 24 --ckpt --init \
      --d-model 4096 --heads 32 --layers 16 --batch 1          # 3.36B, as DeepSpeed's anchor

Activation checkpointing through DeepSpeed's API (GPT model only): --ckpt-impl zspeed
(zspeed.checkpointing.checkpoint per block) or --ckpt-impl deepspeed (with --impl deepspeed:
deepspeed.checkpointing.checkpoint), configured from the config's activation_checkpointing
section; --cpu-ckpt sets its cpu_checkpointing (the saved block inputs wait in pinned host
memory). Either option implies --ckpt. Running out of GPU memory in the training loop prints
the single line "OOM at seq N" and exits with code 3, so that a shell loop over --seq finds
the longest sequence that trains:

  for s in 2048 4096 8192 16384; do
    python bench/bench_engine.py --stage 3 --offload-param cpu --gpu-cap 24 --d-model 4096 --heads 32 \
        --layers 16 --batch 1 --steps 3 --warmup 1 --ckpt-impl zspeed --cpu-ckpt --seq $s || break
  done
"""
import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from gpt import GPT, GPTConfig  # noqa: E402


def _union(spans: list) -> float:
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def gpu_busy(run, n: int = 2) -> dict:
    """Runs ``run`` (one training step) ``n`` times under torch.profiler and returns the share of
    their wall time (from the first step's start to the GPU's end of the last) covered by CUDA
    kernels, and by kernels or copies."""
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            with record_function("zs_bench_step"):
                run()
                torch.cuda.synchronize()
    evs = prof.events()
    steps = [(e.time_range.start, e.time_range.end) for e in evs if e.name == "zs_bench_step"]
    lo, hi = min(s for s, _ in steps), max(e for _, e in steps)
    # The GPU's own work: kernels and copies, not the ranges record_function marks on the GPU's
    # timeline (their names are those of CPU-side events).
    host_names = {e.name for e in evs if e.device_type != torch.autograd.DeviceType.CUDA}
    dev = [e for e in evs if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in host_names]
    clip = [(max(lo, e.time_range.start), min(hi, e.time_range.end)) for e in dev]
    copies = [c for c, e in zip(clip, dev) if e.name.lower().startswith(("memcpy", "memset"))]
    kernels = [c for c, e in zip(clip, dev) if not e.name.lower().startswith(("memcpy", "memset"))]
    wall = max(1e-9, hi - lo)
    return {"kernels": round(_union([c for c in kernels if c[1] > c[0]]) / wall, 4),
            "with_copies": round(_union([c for c in kernels + copies if c[1] > c[0]]) / wall, 4),
            "wall_s": round(wall / 1e6 / n, 4)}


def ds_config(a):
    opt_params = {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    c = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
         "gradient_clipping": getattr(a, "clip", 1.0), "optimizer": {"type": "AdamW", "params": opt_params},
         "zero_optimization": {"stage": a.stage, "contiguous_gradients": True, "overlap_comm": True,
                               "reduce_bucket_size": 50_000_000},
         "steps_per_print": 1000000}
    if a.stage == 3 and a.offload_param != "none":
        c["zero_optimization"]["offload_param"] = {"device": a.offload_param, "pin_memory": not a.no_pin}
        if a.impl == "zspeed" and getattr(a, "grads_in_shards", "on") == "off":  # zspeed's key (DeepSpeed's configs do not have it)
            c["zero_optimization"]["offload_param"]["grads_in_shards"] = False
    c["bf16" if a.dtype == "bf16" else "fp16"] = {"enabled": True}
    if a.offload == "cpu":
        c["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": not a.no_pin}
    if a.offload == "nvme":
        c["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "pin_memory": not a.no_pin,
                                                       "nvme_path": a.nvme_path}
        if a.impl == "zspeed" and a.max_in_cpu:
            c["zero_optimization"]["offload_optimizer"]["max_in_cpu"] = int(a.max_in_cpu)
    if a.ckpt and a.ckpt_impl != "torch":
        c["activation_checkpointing"] = checkpoint_section(a)
    if a.impl == "zspeed" and getattr(a, "ratio", None) is not None:
        c["zero_optimization"]["offload_optimizer"]["ratio"] = a.ratio if a.ratio == "auto" else float(a.ratio)
    if a.impl == "deepspeed" and getattr(a, "zenflow", False):
        # DeepSpeed's ZenFlow as the issue runs it: the top 5% of gradient columns step on the
        # GPU every step, the rest on the CPU every 4 steps, overlapped with the next steps.
        c["zero_optimization"]["zenflow"] = {"topk_ratio": 0.05, "update_interval": 4, "overlap_step": True}
    if a.impl == "zspeed" and getattr(a, "delayed_update", False):
        c["zero_optimization"]["offload_optimizer"]["delayed_update"] = True
    if a.impl == "zspeed" and getattr(a, "overlap_forward", False):
        c["zero_optimization"]["offload_optimizer"]["overlap_forward"] = True
    if a.impl == "zspeed" and getattr(a, "trace", None):
        c["zspeed_trace"] = a.trace
    if a.impl == "zspeed":
        opt_params["torch_adam"] = a.torch_adam
        if a.state_dtype != "fp32":
            opt_params["state_dtype"] = a.state_dtype
    return c


def checkpoint_args(a):
    """Resolves --ckpt-impl / --cpu-ckpt (either implies --ckpt); returns why the combination
    cannot run, or None."""
    if a.cpu_ckpt or a.ckpt_impl != "torch":
        a.ckpt = True
    if a.cpu_ckpt and a.ckpt_impl == "torch":
        return "--cpu-ckpt needs --ckpt-impl zspeed or deepspeed (torch.utils.checkpoint keeps the inputs on the GPU)"
    if a.ckpt_impl == "deepspeed" and a.impl != "deepspeed":
        return "--ckpt-impl deepspeed runs with --impl deepspeed only (DeepSpeed's checkpointing needs its engine)"
    if a.ckpt_impl == "zspeed" and a.impl == "deepspeed":
        return "--ckpt-impl zspeed runs with --impl zspeed or torch; use --ckpt-impl deepspeed with --impl deepspeed"
    if getattr(a, "zenflow", False) and (a.impl != "deepspeed" or a.stage != 2 or a.offload != "cpu"):
        return "--zenflow is DeepSpeed's ZenFlow: it runs with --impl deepspeed, --stage 2 and --offload cpu"
    if a.model == "llama" and a.ckpt_impl != "torch":
        return ("--model llama checkpoints through transformers' gradient checkpointing (torch); "
                "--ckpt-impl zspeed/deepspeed and --cpu-ckpt wrap the GPT model's blocks (--model gpt)")
    return None


def checkpoint_section(a) -> dict:
    """The config's activation_checkpointing section for --ckpt-impl zspeed/deepspeed."""
    return {"partition_activations": False, "cpu_checkpointing": a.cpu_ckpt, "contiguous_memory_optimization": False}


def checkpoint_function(impl: str):
    """``checkpoint(function, x)`` of the chosen implementation: torch.utils.checkpoint (non-
    reentrant), or the ``checkpointing.checkpoint`` of zspeed or DeepSpeed."""
    if impl == "torch":
        from torch.utils.checkpoint import checkpoint
        return lambda f, x: checkpoint(f, x, use_reentrant=False)
    if impl == "zspeed":
        from zspeed import checkpointing as ckpt
    else:
        from deepspeed import checkpointing as ckpt
    return ckpt.checkpoint


def checkpoint_blocks(blocks, checkpoint) -> None:
    """Makes each block's forward run through ``checkpoint(forward, x)``."""
    for blk in blocks:
        blk.forward = (lambda f: (lambda x: checkpoint(f, x)))(blk.forward)


def configure_checkpointing(a, config: dict) -> None:
    """zspeed's or DeepSpeed's checkpointing.configure from the config (after initialize: DeepSpeed
    reads its process group), with checkpoint_in_cpu from --cpu-ckpt."""
    if a.ckpt_impl == "zspeed":
        from zspeed import checkpointing as ckpt
    elif a.ckpt_impl == "deepspeed":
        from deepspeed import checkpointing as ckpt
    else:
        return
    ckpt.configure(None, deepspeed_config=config, checkpoint_in_cpu=a.cpu_ckpt)


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e).lower())


@contextlib.contextmanager
def exit_on_oom(line: str):
    """Running out of GPU memory inside prints ``line`` alone on stdout (the error's first line
    goes to stderr) and exits with code 3; other errors pass through."""
    try:
        yield
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
        if not _is_oom(e):
            raise
        print(f"({type(e).__name__}: {(str(e).splitlines() or [''])[0]})", file=sys.stderr, flush=True)
        print(line, flush=True)
        raise SystemExit(3) from None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=["zspeed", "deepspeed", "torch"], default="zspeed")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--offload", choices=["cpu", "nvme", "none"], default="cpu")
    ap.add_argument("--nvme-path", default=None, help="--offload nvme: the folder of the swap files (default: a "
                    "fresh folder under the temporary directory)")
    ap.add_argument("--max-in-cpu", type=float, default=None, help="zspeed, --offload nvme: offload_optimizer."
                    "max_in_cpu (elements of the optimizer's share kept in host memory; the rest on NVMe)")
    ap.add_argument("--gpu-busy", action="store_true", help="after the timed steps, profile two more with "
                    "torch.profiler and print the share of their wall time the GPU ran kernels")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--torch-adam", action="store_true")
    ap.add_argument("--state-dtype", choices=["fp32", "bf16", "int8"], default="fp32")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the CPU step")
    ap.add_argument("--stage", type=int, choices=[2, 3], default=2)
    ap.add_argument("--ratio", default=None, help="zspeed, --offload cpu: offload_optimizer.ratio (the CPU's "
                    "share of the optimizer; the rest steps on the GPU), a number in (0, 1] or auto")
    ap.add_argument("--delayed-update", action="store_true",
                    help="zspeed, --offload cpu: offload_optimizer.delayed_update (one-step-stale overlapped CPU step)")
    ap.add_argument("--overlap-forward", action="store_true",
                    help="zspeed, --offload cpu: offload_optimizer.overlap_forward (the CPU step runs during the "
                         "next forward, which waits per module for its weights; exact)")
    ap.add_argument("--clip", type=float, default=1.0, help="gradient_clipping (0: off)")
    ap.add_argument("--trace", default=None, help="zspeed: write a Chrome trace of the engine's phases to this file")
    ap.add_argument("--zenflow", action="store_true",
                    help="--impl deepspeed: DeepSpeed's ZenFlow (topk_ratio 0.05, update_interval 4, overlap_step)")
    ap.add_argument("--offload-param", choices=["cpu", "none"], default="none")
    ap.add_argument("--grads-in-shards", choices=["on", "off"], default="on",
                    help="zspeed, stage 3 with --offload-param cpu: offload_param.grads_in_shards (the gradients "
                         "in the host parameter shards; off: a separate host gradient buffer)")
    ap.add_argument("--gpu-cap", type=float, default=None, help="GiB of GPU memory this process may use")
    ap.add_argument("--ckpt", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--ckpt-impl", choices=["torch", "zspeed", "deepspeed"], default="torch",
                    help="whose checkpoint() wraps each block (zspeed/deepspeed imply --ckpt; GPT model only)")
    ap.add_argument("--cpu-ckpt", action="store_true",
                    help="activation_checkpointing.cpu_checkpointing: saved block inputs in pinned host memory")
    ap.add_argument("--init", action="store_true", help="build the model under zero.Init")
    ap.add_argument("--model", choices=["gpt", "llama"], default="gpt")
    ap.add_argument("--save-load", default=None, metavar="DIR",
                    help="zspeed: after the steps, save a checkpoint into DIR and load it back, timing both and "
                         "sampling the process's resident memory (anonymous and file-backed) meanwhile; DIR's "
                         "tag is removed afterwards")
    ap.add_argument("--ffn", type=int, default=None, help="llama: intermediate size (default 8/3 d, rounded)")
    a = ap.parse_args()
    why = checkpoint_args(a)
    if why:
        ap.error(why)
    if not torch.cuda.is_available():
        sys.exit("bench_engine.py needs a CUDA GPU")
    if a.offload == "nvme" and a.nvme_path is None:
        import tempfile
        a.nvme_path = tempfile.mkdtemp(prefix="zs_bench_nvme_")
    if a.threads:
        torch.set_num_threads(a.threads)
    # Under torchrun every rank drives the GPU LOCAL_RANK and reads its own batches.
    local = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and a.impl == "torch":
        sys.exit("--impl torch is the one-GPU reference; run it without torchrun")
    # ZSPEED_DEVICE=cuda:0 puts every rank on one GPU (with ZSPEED_DIST_BACKEND=gloo: NCCL
    # needs one GPU per rank), as on a one-GPU machine.
    dev = torch.device(os.environ.get("ZSPEED_DEVICE") or f"cuda:{local}")
    torch.cuda.set_device(dev)
    if a.gpu_cap:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.gpu_cap * 2**30 / total), dev)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    t_init = time.perf_counter()
    if a.impl != "torch":
        import zspeed
        ds = zspeed if a.impl == "zspeed" else __import__("deepspeed")
    if a.init and a.impl != "torch":
        with ds.zero.Init(config_dict_or_path=ds_config(a)):
            model = build_model(a)
    else:
        model = build_model(a)
    nparams = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    print(f"model built in {time.perf_counter() - t_init:.1f}s", flush=True)
    if a.model == "llama":
        inner = model

        class LM(torch.nn.Module):  # (ids, targets) -> loss, like the repo's GPT
            def __init__(self):
                super().__init__()
                self.m = inner

            def forward(self, ids, targets):
                return self.m(input_ids=ids, labels=targets).loss
        model = LM()
    if a.impl == "torch":
        if a.ckpt_impl == "zspeed":
            configure_checkpointing(a, {"train_micro_batch_size_per_gpu": a.batch,
                                        "activation_checkpointing": checkpoint_section(a)})
        model = model.to(dev, dtype)
        masters = [p.detach().float() for p in model.parameters()]
        opt = torch.optim.AdamW(masters, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

        def fwd_bwd(x, y):
            loss = model(x, y)
            loss.backward()
            return loss

        def step():
            for m, p in zip(masters, model.parameters()):
                m.grad = p.grad.float()
                p.grad = None
            if a.clip:
                torch.nn.utils.clip_grad_norm_(masters, a.clip)
            opt.step()
            with torch.no_grad():
                torch._foreach_copy_(list(model.parameters()), masters)
    else:
        engine, _, _, _ = ds.initialize(model=model, model_parameters=model.parameters(), config=ds_config(a))
        configure_checkpointing(a, ds_config(a))

        def fwd_bwd(x, y):
            loss = engine(x, y)
            engine.backward(loss)
            return loss

        def step():
            engine.step()
    torch.cuda.synchronize()
    t_init = time.perf_counter() - t_init
    print(f"initialized in {t_init:.1f}s", flush=True)
    rank = int(os.environ.get("RANK", "0"))
    g = torch.Generator(device=dev).manual_seed(rank)
    times, fb, st = [], [], []
    # A shell loop over --seq looks for this line (and exit code 3) to find the longest that trains.
    with exit_on_oom(f"OOM at seq {a.seq}"):
        for i in range(a.warmup + a.steps):
            x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=g)
            y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=g)
            if i == a.warmup:
                torch.cuda.reset_peak_memory_stats()
                for sw in _swappers(engine if a.impl == "zspeed" else None):
                    sw.stats(reset=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = fwd_bwd(x, y)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i >= a.warmup:
                times.append(t2 - t0)
                fb.append(t1 - t0)
                st.append(t2 - t1)
            extra = ""
            if a.impl != "torch":
                extra = (f"  grad norm {engine.get_global_grad_norm()}"
                         f"  skipped {getattr(engine, 'skipped_steps', '?')}")
            print(f"step {i:3d}  {t2 - t0:.3f}s  (fwd+bwd {t1 - t0:.3f}s, step {t2 - t1:.3f}s)  "
                  f"loss {loss.item():.4f}{extra}", flush=True)
    med = statistics.median(times)
    busy = None
    if a.gpu_busy:
        def one():
            x = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=g)
            y = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=g)
            fwd_bwd(x, y)
            step()
        busy = gpu_busy(one)
        print(f"GPU busy {100 * busy['kernels']:.1f}% of two profiled steps' wall time ({busy['wall_s']:.3f} s per step; "
              f"idle {100 * (1 - busy['kernels']):.1f}%; with copies {100 * busy['with_copies']:.1f}%)", flush=True)
    if a.impl == "zspeed" and a.trace:
        engine.close()  # writes the trace (and finishes a step still running in the background)
    bound, peak_rss = None, _peak_rss()  # (before the bound's timings allocate)
    if a.impl == "zspeed" and a.offload == "nvme" and world == 1:
        peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
        torch.cuda.set_per_process_memory_fraction(1.0, dev)  # the timings below are not the run's
        try:
            bound = step_bound(a, engine, nparams, med, statistics.median(fb), len(times))
        except Exception as e:  # noqa: BLE001 - the bound informs; the run's result stands
            import traceback
            traceback.print_exc()
            bound = {"error": f"{type(e).__name__}: {e}"}
    else:
        peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    save_load = _save_load(a, engine) if a.impl == "zspeed" and a.save_load else None
    mine = {"peak_alloc_gib": round(peak[0] / 2**30, 2),
            "peak_reserved_gib": round(peak[1] / 2**30, 2),
            "host_rss_gib": round(_rss() / 2**30, 2), "step_s": round(med, 4)}
    per_rank = [mine]
    if world > 1:
        import torch.distributed as td
        per_rank = [None] * world
        td.all_gather_object(per_rank, mine)
        if rank != 0:
            return
    res = {
        "impl": a.impl, "offload": a.offload, "stage": a.stage, "offload_param": a.offload_param,
        "gpu_cap_gib": a.gpu_cap, "ckpt": a.ckpt, "grads_in_shards": getattr(a, "grads_in_shards", "on"), "delayed_update": getattr(a, "delayed_update", False), "ratio": getattr(a, "ratio", None), "ckpt_impl": a.ckpt_impl if a.ckpt else None,
        "cpu_ckpt": a.cpu_ckpt, "init": a.init, "model": a.model,
        "host_peak_rss_gib": round(peak_rss / 2**30, 2),
        "params": nparams, "layers": a.layers, "d_model": a.d_model,
        "batch": a.batch, "seq": a.seq, "dtype": a.dtype, "torch_adam": a.torch_adam,
        "state_dtype": a.state_dtype, "pin": not a.no_pin, "world_size": world,
        "step_s": round(med, 4), "fwd_bwd_s": round(statistics.median(fb), 4),
        "gpu_busy": busy, "max_in_cpu": a.max_in_cpu, "bound": bound, "save_load": save_load,
        "opt_step_s": round(statistics.median(st), 4),
        "step_mean_s": round(statistics.fmean(times), 4), "final_loss": round(float(loss.item()), 4),
        "zenflow": getattr(a, "zenflow", False), "overlap_forward": getattr(a, "overlap_forward", False),
        "tokens_per_s": round(world * a.batch * a.seq / max(r["step_s"] for r in per_rank), 1),
        "peak_alloc_gib": max(r["peak_alloc_gib"] for r in per_rank),
        "peak_reserved_gib": max(r["peak_reserved_gib"] for r in per_rank),
        "host_rss_gib_per_rank": [r["host_rss_gib"] for r in per_rank],
        "init_s": round(t_init, 1), "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
        "cpu_threads": torch.get_num_threads(),
        "cpu_share": getattr(getattr(engine, "optimizer_path", None), "cpu_share", None) if a.impl == "zspeed" else None,
    }
    print(f"{a.impl}: {nparams / 1e9:.2f}B params, median step {med:.3f}s (mean {res['step_mean_s']:.3f}s) "
          f"(fwd+bwd {res['fwd_bwd_s']:.3f}s + optimizer {res['opt_step_s']:.3f}s), "
          f"{res['tokens_per_s']:,.0f} tokens/s over {world} rank(s), peak GPU {res['peak_alloc_gib']:.2f} GiB "
          f"allocated per rank, seq {a.seq}"
          + (f", checkpointing {a.ckpt_impl}{' with cpu_checkpointing' if a.cpu_ckpt else ''}" if a.ckpt else ""))
    print("RESULT " + json.dumps(res))


def _swappers(engine) -> list:
    """The NVMe swappers of a zspeed engine's optimizer path (and of its tiers)."""
    if engine is None:
        return []
    from zspeed.runtime.nvme import nvme_tiers
    return [sw for t in nvme_tiers(engine.optimizer_path) for sw in t.swappers]


def step_bound(a, engine, nparams: int, step_s: float, fwd_bwd_s: float, steps: int) -> dict:
    """The step's bound from what each tier moves per step, each timed in this process: NVMe
    (the swap files' own I/O pass: every image read and as many bytes written), PCIe (the 16-bit
    parameters fetched for the forward and again for the backward, and the gradients sent back,
    at the pinned host-to-GPU rate), the GPU (a forward and backward of the same GPT without
    offload, from one block, as zspeed plan times it), the host's CPU Adam share (its measured
    rate x the elements max_in_cpu keeps), and the GPU's share of the optimizer. ``serial``:
    their sum as this engine's step orders them (the forward and backward bound by max(GPU,
    PCIe), then the optimizer's tiers one after the other); ``overlapped``: the largest alone."""
    from zspeed import planner
    sws = _swappers(engine)
    moved = sum(sw.stats()["bytes_read"] + sw.stats()["bytes_written"] for sw in sws) / max(1, steps)
    disk_s = sum(sw.io_pass() for sw in sws)
    disk_bytes = 2 * sum(sw.file_bytes for sw in sws)  # read and written; spares included (an upper bound)
    shape = planner.Shape(layers=a.layers, hidden=a.d_model, heads=a.heads, vocab=a.vocab)
    gpu_s = planner.measure_fwd_bwd(shape, a.batch, a.seq, a.ckpt)
    h2d = planner.measure_h2d_gbs()
    pcie_bytes = 2 * nparams * (3 if a.offload_param == "cpu" else 1)
    pcie_s = pcie_bytes / (h2d * 1e9)
    cpu_rate, gpu_rate = planner._adam_rates("cuda", a.state_dtype)
    host = engine.memory_needs.get("host", {})
    kept = host.get("fp32 masters (max_in_cpu)", 0) // 4
    share = getattr(engine.optimizer_path, "cpu_share", 1.0)
    cpu_s = (cpu_rate or 0.0) * kept
    gpu_opt_s = (gpu_rate or 0.0) * nparams * (1 - share)
    serial = max(gpu_s, pcie_s) + gpu_opt_s + cpu_s + disk_s
    over = max(gpu_s, pcie_s, gpu_opt_s, cpu_s, disk_s)
    out = {"nvme_s": round(disk_s, 2), "nvme_gb_per_step": round(moved / 1e9, 2),
           "nvme_gbs": round(disk_bytes / 1e9 / disk_s, 2) if disk_s else None,
           "pcie_s": round(pcie_s, 2), "pcie_gbs": round(h2d, 1), "gpu_fwd_bwd_s": round(gpu_s, 2),
           "cpu_adam_s": round(cpu_s, 2), "cpu_elems": int(kept), "gpu_opt_s": round(gpu_opt_s, 2),
           "serial_s": round(serial, 2), "overlapped_s": round(over, 2),
           "step_over_serial": round(step_s / serial, 2), "step_over_overlapped": round(step_s / over, 2),
           "fwd_bwd_over_bound": round(fwd_bwd_s / max(gpu_s, pcie_s), 2)}
    print(f"bound: NVMe {disk_s:.1f}s ({moved / 1e9:.1f} GB moved per step, the files' I/O pass at "
          f"{out['nvme_gbs']} GB/s), PCIe {pcie_s:.1f}s ({pcie_bytes / 1e9:.1f} GB at {h2d:.1f} GB/s), GPU fwd+bwd "
          f"{gpu_s:.1f}s, CPU Adam {cpu_s:.1f}s ({kept / 1e9:.2f}B elements), GPU Adam {gpu_opt_s:.1f}s -> serial "
          f"{serial:.1f}s, overlapped {over:.1f}s; measured step {step_s:.1f}s = {step_s / serial:.2f}x serial, "
          f"{step_s / over:.2f}x overlapped", flush=True)
    return out


def build_model(a):
    if a.model == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        ffn = a.ffn or 256 * round(8 * a.d_model / 3 / 256)
        cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=ffn,
                          num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
                          max_position_embeddings=a.seq, tie_word_embeddings=False, attn_implementation="sdpa")
        m = LlamaForCausalLM(cfg)
        if a.ckpt:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return m
    cfg = GPTConfig(vocab_size=a.vocab, max_len=a.seq, d_model=a.d_model, n_layer=a.layers, n_head=a.heads)
    m = GPT(cfg)
    if a.ckpt:
        checkpoint_blocks(m.blocks, checkpoint_function(a.ckpt_impl))
    return m


def _rss_parts() -> dict:
    """This process's resident memory by kind (bytes): RssAnon (what a save or load allocates)
    and RssFile (file pages mapped, e.g. a checkpoint being read; the kernel can drop them)."""
    out = {"anon": 0, "file": 0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                for key, name in (("RssAnon:", "anon"), ("RssFile:", "file")):
                    if line.startswith(key):
                        out[name] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def _save_load(a, engine) -> dict:
    """--save-load: save_checkpoint and load_checkpoint of the trained engine, each timed, with
    its resident memory sampled every 20 ms (peaks against the steady state before it)."""
    import shutil
    import threading
    out = {}
    tag = "bench_save_load"
    for what, call in (("save", lambda: engine.save_checkpoint(a.save_load, tag=tag)),
                       ("load", lambda: engine.load_checkpoint(a.save_load, tag=tag))):
        gc.collect()
        before = _rss_parts()
        peak = dict(before)
        stop = threading.Event()

        def watch():
            while not stop.wait(0.02):
                for k, v in _rss_parts().items():
                    peak[k] = max(peak[k], v)
        w = threading.Thread(target=watch, daemon=True)
        w.start()
        t0 = time.perf_counter()
        call()
        dt = time.perf_counter() - t0
        stop.set()
        w.join()
        out[what] = {"s": round(dt, 1), "anon_before_gib": round(before["anon"] / 2**30, 2),
                     "anon_peak_gib": round(peak["anon"] / 2**30, 2),
                     "anon_peak_over_before": round(peak["anon"] / max(before["anon"], 1), 3),
                     "file_peak_gib": round(peak["file"] / 2**30, 2)}
        print(f"{what}: {dt:.1f} s, anonymous RSS {before['anon'] / 2**30:.2f} GiB before, "
              f"{peak['anon'] / 2**30:.2f} GiB peak ({peak['anon'] / max(before['anon'], 1):.3f}x); "
              f"file-backed peak {peak['file'] / 2**30:.2f} GiB", flush=True)
    d = os.path.join(a.save_load, tag)
    out["bytes"] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"checkpoint {out['bytes'] / 2**30:.2f} GiB", flush=True)
    shutil.rmtree(d)
    return out


def _peak_rss() -> int:
    """Peak resident memory of this process (bytes); 0 where resource is missing (Windows)."""
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        return 0


def _rss() -> int:
    """Resident memory of this process (bytes); 0 where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


if __name__ == "__main__":
    main()
