"""zspeed vs DeepSpeed, optimizer state offloaded to NVMe: one training step, side by side.

Same model, batch, optimizer and aio settings for both; each implementation runs in
its own subprocess of this script (one after the other, never at the same time), in
its own fresh folder under ``--folder`` that is deleted afterwards:

- zspeed: ZeRO stage 2, ``offload_optimizer: {device: nvme, nvme_path, pin_memory,
  buffer_count 4}`` (zspeed's C swapper, io_uring or threads);
- DeepSpeed: ZeRO stage 3 (its only stage with NVMe optimizer offload), the same
  offload_optimizer block, ``offload_param`` none, DeepSpeedCPUAdam (what DeepSpeed
  picks for an offloaded "AdamW") and its async_io op (libaio); the variant
  ``deepspeed-pipe`` also sets ``pipeline_read`` / ``pipeline_write`` (DeepSpeed's
  overlap of swap I/O with the optimizer step; zspeed always overlaps).

Model: ``--params`` elements as a stack of square bf16 Linear layers (``--width``,
4096 by default), input ``--tokens`` x width, loss = mean(out^2). AdamW (lr 1e-4,
betas 0.9/0.999, eps 1e-8, weight decay 0.01), fp32 master weights and states,
sub_group_size 2^23, aio block 1 MiB x queue depth 32 x 2 threads. Timed: forward +
backward + step (CUDA synchronized) over ``--steps`` steps after ``--warmup``; printed:
the median, its split (fwd+bwd / step), params/s and tokens/s, peak GPU memory
(allocated, after warm-up), peak RSS of the process, bytes in the swap folder, and
DeepSpeed / zspeed step-time ratios (> 1: zspeed is faster). Compare whole steps: the
split differs by design (DeepSpeed's ZeRO-3 writes the fp32 gradients to the swap
folder from backward hooks, so part of its NVMe traffic lands in "fwd+bwd").

DeepSpeed runs only on a CUDA machine where ``deepspeed`` imports and its async_io op
is compatible (libaio headers + library found: AsyncIOBuilder().is_compatible()) and
builds; otherwise its row says why it was skipped, and zspeed still runs (on the CPU
if there is no GPU). On the H200 host (no libaio, no network) ``bench/gpu_host.sh
ds-nvme`` provides libaio from .debs and DeepSpeed from wheels, then runs:

    python3 bench/bench_ds_nvme.py --params 2^28 --folder /tmp/zs-dsnvme --steps 5

Disk per side at 2^28 params (one side at a time): zspeed 6 GiB (12 B/param of fp32
master+m+v, A/B slots), DeepSpeed 3-4 GiB (12 B/param, plus 4 B/param where it swaps
fp32 gradients). Host RAM: a few GiB per side (printed as peak RSS).
Local smoke test (CPU, no DeepSpeed):

    python3 bench/bench_ds_nvme.py --params 2^20 --width 256 --tokens 64 --steps 2 --warmup 1

Flags: --impl zspeed,deepspeed,deepspeed-pipe (which rows, in that order),
--json (RESULT lines only), --ds-allow-cpu (try DeepSpeed with its CPU accelerator
on a machine without CUDA: a smoke test of this script, not a measurement).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = ("zspeed", "deepspeed", "deepspeed-pipe")


def _count(text: str) -> int:
    text = str(text)
    if "^" in text:
        b, e = text.split("^")
        return int(b) ** int(e)
    return int(float(text))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _disk_bytes(folder: str) -> int:
    n = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                n += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return n


def make_config(impl: str, a, folder: str) -> dict:
    """The DeepSpeed JSON config of one side; the two differ only in the ZeRO stage
    (and the pipeline flags for deepspeed-pipe, which zspeed would accept and ignore)."""
    pipe = impl == "deepspeed-pipe"
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.01}},
        "zero_optimization": {
            "stage": 2 if impl == "zspeed" else 3,
            "sub_group_size": a.sub_group_size,
            "offload_optimizer": {"device": "nvme", "nvme_path": folder, "pin_memory": True,
                                  "buffer_count": 4, "pipeline_read": pipe, "pipeline_write": pipe},
            "offload_param": {"device": "none"},
        },
        "aio": {"block_size": a.block_size, "queue_depth": a.queue_depth,
                "intra_op_parallelism": a.aio_threads, "single_submit": False, "overlap_events": True,
                "use_gds": False},
    }


def _skip(impl: str, reason: str) -> int:
    print(f"SKIP {impl}: {reason}", flush=True)
    print("RESULT " + json.dumps({"impl": impl, "skipped": reason}), flush=True)
    return 0


def _deepspeed_preflight(impl: str, a) -> str | None:
    """None when DeepSpeed can run here, else the reason it cannot."""
    import torch
    if not torch.cuda.is_available() and not a.ds_allow_cpu:
        return ("no CUDA device: DeepSpeed's ZeRO-3 NVMe offload is measured on the GPU only "
                "(--ds-allow-cpu tries its CPU accelerator)")
    try:
        import deepspeed  # noqa: F401
        from deepspeed.accelerator import get_accelerator
    except Exception as e:  # noqa: BLE001
        return f"deepspeed does not import: {type(e).__name__}: {e}"
    try:
        b = get_accelerator().create_op_builder("AsyncIOBuilder")
        ok = b is not None and b.is_compatible(verbose=True)
    except Exception as e:  # noqa: BLE001 - e.g. no distutils (Python 3.12 without setuptools)
        traceback.print_exc()
        return f"AsyncIOBuilder().is_compatible() failed: {type(e).__name__}: {e}"
    if not ok:
        return ("DeepSpeed's async_io op is not compatible here: it needs libaio's header and "
                "library (AsyncIOBuilder.is_compatible() compiles and links a call to io_submit "
                "with -laio); on the H200 host run bench/gpu_host.sh ds-nvme with ZS_HOST_DEBS "
                "holding libaio1/libaio-dev .debs, elsewhere set CPATH, LIBRARY_PATH and "
                "LD_LIBRARY_PATH to a libaio install")
    t0 = time.perf_counter()
    try:
        b.load(verbose=False)  # JIT build (first time) + import, with its pin_memory op
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return f"DeepSpeed's async_io op does not build or load: {type(e).__name__}: {str(e)[-400:]}"
    print(f"{impl}: async_io op loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    try:  # built here too, so that the engine's init time below is not a JIT build
        get_accelerator().create_op_builder("CPUAdamBuilder").load(verbose=False)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return f"DeepSpeed's cpu_adam op does not build or load: {type(e).__name__}: {str(e)[-400:]}"
    print(f"{impl}: cpu_adam op loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    return None


def run_one(impl: str, a) -> int:
    """One side, in this process: prints progress and one RESULT line."""
    import torch
    if impl != "zspeed":
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                     ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(_free_port())),
                     ("NCCL_NVLS_ENABLE", "0")):
            os.environ.setdefault(k, v)
        reason = _deepspeed_preflight(impl, a)
        if reason:
            return _skip(impl, reason)
    cuda = torch.cuda.is_available()
    os.makedirs(a.folder, exist_ok=True)
    need = (24 if impl == "zspeed" else 16) * a.params + (1 << 30)
    free = shutil.disk_usage(a.folder).free
    if free < need:
        return _skip(impl, f"{a.folder} has {free / 2**30:.1f} GiB free, this side needs about "
                           f"{need / 2**30:.1f} GiB")
    folder = tempfile.mkdtemp(prefix=f"zs-dsnvme-{impl}-", dir=a.folder)
    try:
        return _run_in(impl, a, folder, cuda)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_in(impl: str, a, folder: str, cuda: bool) -> int:
    import torch
    width = a.width
    layers = max(1, a.params // (width * width))
    nparams = layers * width * width
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    cfg = make_config(impl, a, folder)
    t_init = time.perf_counter()
    if impl == "zspeed":
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import zspeed as ds
    else:
        import deepspeed as ds
    engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    dev = engine.device if impl == "zspeed" else torch.device(engine.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t_init = time.perf_counter() - t_init
    print(f"{impl}: {layers} x {width}x{width} = {nparams} params on {dev}, initialized in {t_init:.1f} s",
          flush=True)
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(a.tokens, width, generator=g).to(dev, torch.bfloat16)
    times, fb, st = [], [], []
    disk = 0
    for i in range(a.warmup + a.steps):
        if i == a.warmup and dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if i == a.warmup and impl == "zspeed":
            engine.nvme_stats(reset=True)  # count the timed steps only
        sync()
        t0 = time.perf_counter()
        loss = engine(x).float().square().mean()
        engine.backward(loss)
        sync()
        t1 = time.perf_counter()
        engine.step()
        sync()
        t2 = time.perf_counter()
        if i >= a.warmup:
            times.append(t2 - t0)
            fb.append(t1 - t0)
            st.append(t2 - t1)
        if i == 0:
            disk = _disk_bytes(folder)
        print(f"{impl}: step {i:2d} {t2 - t0:7.3f} s (fwd+bwd {t1 - t0:.3f} s, step {t2 - t1:.3f} s)"
              f"{'  warm-up' if i < a.warmup else ''}", flush=True)
    med = statistics.median(times)
    res = {
        "impl": impl, "params": nparams, "layers": layers, "width": width, "tokens": a.tokens,
        "device": str(dev), "steps": a.steps, "warmup": a.warmup,
        "step_s": round(med, 4), "fwd_bwd_s": round(statistics.median(fb), 4),
        "opt_step_s": round(statistics.median(st), 4), "min_step_s": round(min(times), 4),
        "max_step_s": round(max(times), 4),
        "params_per_s": round(nparams / med), "tokens_per_s": round(a.tokens / med, 1),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev.type == "cuda" else None,
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "swap_disk_gib": round(disk / 2**30, 2), "init_s": round(t_init, 1),
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else None,
    }
    if impl == "zspeed":
        s = engine.nvme_stats()
        k = max(1, s[0].get("steps", 0)) if s else 1
        res["zspeed_nvme_ms_per_step"] = {key: round(sum(d[key] for d in s) / k / 1e6, 1)
                                          for key in ("compute_ns", "read_wait_ns", "write_wait_ns")}
        res["zspeed_mb_moved_per_step"] = round(sum(d["bytes_read"] + d["bytes_written"] for d in s) / k / 2**20)
        engine.close()
    else:
        import deepspeed
        res["deepspeed"] = deepspeed.__version__
        zo = engine.optimizer  # the ZeRO-3 optimizer: its CPU optimizer and NVMe swapper, as evidence
        res["ds_optimizer"] = f"{type(zo).__name__}/{type(getattr(zo, 'optimizer', None)).__name__}"
        res["ds_swapper"] = type(getattr(zo, "optimizer_swapper", None)).__name__
    print("RESULT " + json.dumps(res), flush=True)
    return 0


def _fmt(r: dict, base: dict | None) -> str:
    if "skipped" in r:
        return f"| {r['impl']} | skipped: {r['skipped']} |"
    ratio = f"{r['step_s'] / base['step_s']:.2f}x" if base and "step_s" in base else "-"
    gpu = f"{r['peak_gpu_gib']:.2f}" if r.get("peak_gpu_gib") is not None else "-"
    return (f"| {r['impl']} | {r['params']} | {r['step_s']:.3f} | {r['fwd_bwd_s']:.3f} | {r['opt_step_s']:.3f} | "
            f"{r['params_per_s'] / 1e6:.1f} | {r['tokens_per_s']:,.0f} | {gpu} | {r['peak_rss_gib']:.1f} | "
            f"{r['swap_disk_gib']:.2f} | {ratio} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="2^28", help="parameters (e.g. 2^28 or 3e8)")
    ap.add_argument("--width", type=int, default=4096, help="Linear layer width (layers = params / width^2)")
    ap.add_argument("--tokens", type=int, default=4096, help="rows of the input batch")
    ap.add_argument("--folder", default=tempfile.gettempdir(), help="parent of the nvme_path folders")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--impl", default="zspeed,deepspeed,deepspeed-pipe",
                    help="comma-separated, from " + ", ".join(IMPLS))
    ap.add_argument("--sub-group-size", type=int, default=1 << 23)
    ap.add_argument("--block-size", type=int, default=1 << 20)
    ap.add_argument("--queue-depth", type=int, default=32)
    ap.add_argument("--aio-threads", type=int, default=2)
    ap.add_argument("--ds-allow-cpu", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print only the RESULT lines")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.params = _count(a.params)
    impls = [s.strip() for s in a.impl.split(",") if s.strip()]
    bad = [s for s in impls if s not in IMPLS]
    if bad:
        ap.error(f"unknown --impl {bad}; choose from {IMPLS}")
    if a.child:
        return run_one(impls[0], a)

    results = []
    for impl in impls:
        # argparse keeps the last --impl: the child runs just this one
        cmd = [sys.executable, os.path.abspath(__file__)] + [x for x in sys.argv[1:] if x != "--json"] + \
            ["--child", "--impl", impl]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        res = None
        for line in p.stdout:
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
                print(line, end="", flush=True)
            elif not a.json:
                print("    " + line, end="", flush=True)
        rc = p.wait()
        if res is None:
            res = {"impl": impl, "skipped": f"the {impl} subprocess failed (exit status {rc}); see its output above"}
            print("RESULT " + json.dumps(res), flush=True)
        results.append(res)
    if a.json:
        return 0
    base = next((r for r in results if r["impl"] == "zspeed" and "step_s" in r), None)
    print()
    print(f"params {a.params} ({a.width}-wide bf16 Linear layers), {a.tokens} tokens/step, AdamW fp32 state on "
          f"NVMe under {a.folder}, median of {a.steps} steps after {a.warmup} warm-up")
    print("| impl | params | step s | fwd+bwd s | opt step s | Mparams/s | tokens/s | peak GPU GiB "
          "| peak RSS GiB | swap folder GiB | step / zspeed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(_fmt(r, base))
    z = base.get("zspeed_nvme_ms_per_step") if base else None
    if z:
        print(f"zspeed swapper per step: compute {z['compute_ns']:.0f} ms, read wait {z['read_wait_ns']:.0f} ms, "
              f"write wait {z['write_wait_ns']:.0f} ms, {base['zspeed_mb_moved_per_step']} MB moved")
    for r in results:
        if r["impl"] != "zspeed" and base and "step_s" in r:
            print(f"{r['impl']} / zspeed step time: {r['step_s'] / base['step_s']:.2f}x "
                  f"(DeepSpeed {r.get('deepspeed')}: {r.get('ds_optimizer')}, swapper {r.get('ds_swapper')})")
    return 0 if all("step_s" in r or "skipped" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
