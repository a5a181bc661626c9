"""The block ``zspeed.initialize`` logs once, on rank 0: what this run is made of.

DeepSpeed users are used to its start-up lines ("DeepSpeed info: version=...", then the
ZeRO stage, the optimizer, the offload); zspeed gives the same facts in one INFO block::

    [Rank 0] zspeed info: version=0.1.0, git-hash=6ae335c, git-branch=main
      ZeRO stage ........ 2; world size 1 (1 rank on this host, gloo)
      model ............. 0.81M trained parameters on cpu, torch.float32
      optimizer ......... AdamW (run by zspeed CPUAdam), state fp32, step synchronous
      offload ........... optimizer cpu (pinned); parameters none
      CPU optimizer ..... zspeed's C kernels, avx512 SIMD, 2 threads
      I/O backend ....... io_uring (auto) (for NVMe offload; unused here)
      memory ............ no GPU (model on cpu); host 12.38 MiB (gradients 3.09, fp32 masters 3.09, ...)

(the demo's run on a 2-core machine without a GPU, from a wheel built at commit 6ae335c of
main; run from the checkout's ``python/``, the hash and branch read ``unknown``). After ``zspeed.hf.install()`` the first line
reads "DeepSpeed info: version=<the DeepSpeed API version> (zspeed <version> through
zspeed.hf.install()), ...", the line transformers and users look for. With ``offload_optimizer.ratio`` a line
says the CPU's share of the parameters (the number ``ratio`` is that share); on a GPU the
memory line gives what the GPU holds after initialize.

It is built from the engine's public attributes, its parsed config and the native library's
report, and never changes the engine. It goes through the ``logging`` logger
``zspeed.summary``: where the application has configured logging, the usual rules decide
(``logging.basicConfig(level=logging.INFO)`` shows it; a level of WARNING on the ``zspeed``
logger hides it); where it has configured none, it is written to stderr, so that a run says
what it is made of without any set-up (DeepSpeed's own logger has a handler of its own for
that; its default level is WARNING in current releases, INFO in older ones). The config key
``zspeed_summary: false`` turns it off."""
from __future__ import annotations

import json
import logging
import os
import sys

log = logging.getLogger("zspeed.summary")
MiB = 2**20
GiB = 2**30


def _bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def _parts(parts: dict) -> str:
    """``total (kind a, kind b ... unit)``, every part in the total's unit."""
    total = sum(parts.values())
    unit, div = ("GiB", GiB) if total >= GiB else ("MiB", MiB)
    return f"{total / div:.2f} {unit} (" + ", ".join(f"{k} {v / div:.2f}" for k, v in parts.items()) + f" {unit})"


def _count(n: int) -> str:
    for div, at, suffix in ((1e9, 1e9, "B"), (1e6, 1e5, "M"), (1e3, 1e3, "K")):
        if n >= at:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def _native() -> dict:
    """The native library's report (SIMD level, threads, I/O backends), {} if unavailable."""
    try:
        from ..report import native_report
        return json.loads(native_report(as_json=True))
    except Exception:  # noqa: BLE001 - the summary must never stop a run
        return {}


def _logging_configured(logger: logging.Logger) -> bool:
    """Whether the application chose how zspeed's records are shown: a handler or a level on
    the way from ``logger`` to the root (the root's default level does not count)."""
    lg: logging.Logger | None = logger
    while lg is not None:
        if lg.handlers or (lg is not logging.root and lg.level != logging.NOTSET):
            return True
        if not lg.propagate:
            return False
        lg = lg.parent
    return False


def _emit(text: str) -> None:
    if _logging_configured(log):
        log.info(text)
    elif not logging.root.manager.disable >= logging.INFO:
        sys.stderr.write(f"[INFO] {text}\n")
        sys.stderr.flush()


def _get(obj, name, default=None):
    try:
        return getattr(obj, name)
    except Exception:  # noqa: BLE001 - a property that cannot answer is left out
        return default


def _cpu_threads(engine, native: dict) -> str:
    """Threads of this rank's CPU optimizer, by the engine's own rule (cores shared by the
    ranks of a host unless ZSPEED_NUM_THREADS decides)."""
    try:
        from .assemble import host_threads
        n = host_threads()
    except Exception:  # noqa: BLE001
        n = None
    if n is None:
        n = (native.get("threads") or {}).get("default")
    if n is None:
        return "threads unknown"
    why = " (ZSPEED_NUM_THREADS)" if os.environ.get("ZSPEED_NUM_THREADS") else ""
    return f"{n} thread{'' if n == 1 else 's'}{why}"


_HOST_STEP = {"host": True, "nvme": True, "split": True}


def _no_gpu(device, odev) -> str:
    what = {"none": "model and optimizer"}.get(odev, "model")
    return f"no GPU ({what} on {device})"


def _gpu_now(device, odev) -> str:
    import torch
    return f"GPU {_bytes(torch.cuda.memory_allocated(device))} allocated now"


_GPU_NOW = {"cuda": _gpu_now}


def summary_text(engine) -> str:
    """The summary block of ``engine`` (see the module docstring)."""
    from .._version import __git_branch__, __git_hash__, __version__
    from .logs import get_dist_msg
    cfg = engine._config
    native = _native()
    off = getattr(cfg, "offload", {}) or {}
    offp = getattr(cfg, "offload_param", {}) or {}
    stage = engine.zero_optimization_stage()
    world = int(_get(engine, "world_size", 1) or 1)
    try:
        from .. import comm
        local = comm.get_local_world_size()
        backend = comm.get_backend() if comm.is_initialized() else "no process group"
    except Exception:  # noqa: BLE001
        local, backend = 1, "unknown"
    plan = _get(engine, "plan")
    where = {"device": ", collectives on the device", "host": ", collectives on host tensors",
             "staged": ", collectives staged through host memory"}.get(_get(plan, "comm"), "")

    layout = _get(engine, "_layout")
    total = sum(layout.totals) if layout is not None else sum(p.numel() for p in engine.module.parameters())
    device = _get(engine, "device", "cpu")
    dtype = _get(engine, "dtype", "")
    path = _get(engine, "optimizer_path")
    basic = _get(engine, "basic_optimizer")
    params = dict(getattr(cfg, "optimizer_params", {}) or {})
    name = getattr(cfg, "optimizer_name", None) or (type(basic).__name__ if basic is not None else "none")
    state = str(params.get("state_dtype", "fp32"))
    how = _get(plan, "timing")
    timing = {"overlap": "overlap_forward (the CPU step runs during the next forward)",
              "delayed": "delayed_update (one step stale)", "sync": "synchronous"}.get(how, how)
    odev = getattr(cfg, "offload_device", off.get("device", "none"))
    host_step = _HOST_STEP.get(_get(plan, "optimizer"), False)  # a CPU optimizer steps (some of) the state
    pin_asked = bool(off.get("pin_memory")) and host_step
    pin = " (pinned)" if pin_asked else ""

    info = f"zspeed info: version={__version__}"
    hf = sys.modules.get("zspeed.hf")
    if hf is not None and hf.installed():  # standing in for DeepSpeed: the line tools look for, said honestly
        info = f"DeepSpeed info: version={hf.DEEPSPEED_API_VERSION} (zspeed {__version__} through zspeed.hf.install())"
    lines = [get_dist_msg(f"{info}, git-hash={__git_hash__ or 'unknown'}, git-branch={__git_branch__ or 'unknown'}",
                          ranks=[0]) or "",
             f"  ZeRO stage ........ {stage}; world size {world} ({local} rank{'' if local == 1 else 's'} on this "
             f"host, {backend}{where})",
             f"  model ............. {_count(total)} trained parameters on {device}, {dtype}",
             f"  optimizer ......... {name}"
             + (f" (run by {type(basic).__module__.split('.')[0]} {type(basic).__name__})" if basic is not None else "")
             + f", state {state}, step {timing}",
             f"  offload ........... optimizer {odev}{pin}; parameters {offp.get('device', 'none')}"]
    gpu_elems = _get(path, "gpu_elems")
    if gpu_elems is not None:  # offload_optimizer.ratio: the CPU's share of the parameters (of this rank's part)
        share = float(_get(path, "cpu_share"))
        other = {"cuda": "GPU"}.get(getattr(device, "type", ""), str(device))
        lines.append(f"  ratio ............. {share:.3f} (given {off.get('ratio')!r}): the CPU steps {100 * share:.1f}% "
                     f"of the parameters, the {other} {100 * (1 - share):.1f}%")
        kept = _get(path, "kept_in_cpu")
        if kept:  # three tiers: of the CPU's share, max_in_cpu in host memory, the rest on NVMe
            local = sum(path.layout.totals)  # this rank's part
            lines.append(f"  tiers ............. of this rank's {_count(local)} elements, masters and state: "
                         f"{_count(int(gpu_elems))} on the {other}, {_count(int(kept))} in host memory (max_in_cpu "
                         f"{int(off.get('max_in_cpu') or 0):,}), {_count(local - int(gpu_elems) - int(kept))} on NVMe")
    elif off.get("ratio") not in (None, 1, 1.0):
        lines.append(f"  ratio ............. 1 (given {off.get('ratio')!r}): the CPU steps every parameter")
    simd = (native.get("simd") or {}).get("level", "unknown")
    if host_step:
        kernels = "zspeed's C kernels" if type(basic).__module__.startswith("zspeed") else type(basic).__name__
        lines.append(f"  CPU optimizer ..... {kernels}, {simd} SIMD, {_cpu_threads(engine, native)}")
    else:
        lines.append(f"  CPU optimizer ..... not offloaded (the optimizer runs on {device} with the model); SIMD {simd}")
    auto = native.get("io_backend_auto") or {}
    uring = (native.get("io_backends") or {}).get("io_uring") or {}
    io = f"{auto.get('chosen', 'unknown')} (auto)"
    forced = os.environ.get("ZSPEED_AIO_BACKEND")
    if forced and forced != "auto":
        io = f"{forced} (ZSPEED_AIO_BACKEND)"
    if uring and not uring.get("available") and sys.platform.startswith("linux"):
        io += f"; io_uring: {uring.get('why', 'unavailable')}"
    uses_disk = "nvme" in (_get(plan, "optimizer"), _get(plan, "frozen_medium")) or \
        (_get(plan, "optimizer") == "split" and _get(plan, "cpu_tier") == "nvme")
    lines.append(f"  I/O backend ....... {io}" + ("" if uses_disk else " (for NVMe offload; unused here)"))

    # Memory per tier: what the GPU holds now, and what the host and NVMe tiers hold for this rank.
    tiers = []
    try:
        tiers.append(_GPU_NOW.get(getattr(device, "type", str(device)), _no_gpu)(device, odev))
        needs = _get(engine, "memory_needs") or {}
        tiers += [f"{name} {_parts(needs[tier])}" for tier, name in (("host", "host"), ("nvme", "NVMe"))
                  if needs.get(tier)]
    except Exception:  # noqa: BLE001
        pass
    if tiers:
        lines.append(f"  memory ............ {'; '.join(tiers)}")
    return "\n".join(lines)


def log_summary(engine) -> None:
    """Logs the summary block on rank 0 (see the module docstring); nothing on other ranks or
    with ``"zspeed_summary": false`` in the config. Never raises: a summary that cannot be
    made is a debug message, not a failed start."""
    try:
        top = getattr(engine._config, "top", {}) or {}
        if not top.get("zspeed_summary", True) or int(_get(engine, "global_rank", 0) or 0) != 0:
            return
        text = summary_text(engine)
    except Exception as e:  # noqa: BLE001
        log.debug("zspeed: no start-up summary (%s: %s)", type(e).__name__, e)
        return
    _emit(text)
