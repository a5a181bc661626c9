"""The same training runs on Windows CPython (under Wine) and on Linux, compared.

  python scripts/windows_parity.py run OUT         # every run below with this interpreter
  python scripts/windows_parity.py compare A B     # A/results.json against B/results.json

`make test-windows-python` runs `run` twice, once with the Linux venv's Python and once with
Windows CPython (scripts/wine-python.sh), then `compare`. Each run trains one small model,
on the CPU, from weights and data made with numpy's PCG64 generator (the same numbers on
every platform, whatever torch's generators do), and records the losses and a SHA-256 of
every final tensor:

  zero2_cpu     ZeRO-2, AdamW state offloaded to CPU memory (zspeed's C optimizer)
  zero2_nvme    the same with the state in a swap file (IOCP on Windows, io_uring or the
                thread pool on Linux): equal to zero2_cpu bit for bit on the same machine
  zero3         ZeRO-3 with offload_param and offload_optimizer on cpu
  resume        3 steps, save_checkpoint, a new engine load_checkpoint, 3 more steps: equal
                to 6 steps in one go; then `zspeed to-fp32` of the checkpoint
  report        `zspeed report --json`: the library loads, its version, the I/O backend
  launch2       `zspeed launch --num_gpus 2` on the CPU (Gloo): ZeRO-2 with CPU offload on
                two ranks, each rank's digest (they must agree)

  optimizer     ZeRO-2 + CPU offload where each step's gradients are numbers from PCG64 (the
                loss is sum(p * G), so backward hands G over unchanged): only zspeed's C
                optimizer and copies decide the weights
  torch_grads   the plain torch model's gradients of each batch (no zspeed): whether torch's
                CPU forward and backward give the same bits on both builds

What must be equal across the two platforms (``compare``; a check that fails makes it exit 1):
the optimizer run always, bit for bit (zspeed's own kernels: the same C source built by GCC
and by MinGW GCC); the training runs bit for bit whenever torch_grads are equal. Where torch's
kernels give other gradient bits on the two builds (its matmul picks another code path: seen
on an AMD EPYC, where they differed by up to about 3e-8), those runs cannot be bit-identical
and must agree to within 1e-5 (absolute, on weights of order 0.1-1 after 6 AdamW steps at
lr 2e-2: a gradient difference of 1e-7 moves an Adam update by far less); the report says
which case it is.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

D_IN, HIDDEN, D_OUT, BATCH = 13, 37, 5, 6


def _arrays(seed: int):
    import numpy as np
    rng = np.random.Generator(np.random.PCG64(seed))
    w = {"0.weight": rng.standard_normal((HIDDEN, D_IN)) * 0.3, "0.bias": rng.standard_normal(HIDDEN) * 0.1,
         "2.weight": rng.standard_normal((D_OUT, HIDDEN)) * 0.2, "2.bias": rng.standard_normal(D_OUT) * 0.1}
    proj = rng.standard_normal((D_IN, D_OUT))
    data = []
    for _ in range(8):
        x = rng.standard_normal((BATCH, D_IN))
        data.append((x, x @ proj + 0.01 * rng.standard_normal((BATCH, D_OUT))))
    return w, data


def _model():
    import torch
    w, _ = _arrays(0)
    m = torch.nn.Sequential(torch.nn.Linear(D_IN, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, D_OUT))
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.from_numpy(w[name].astype("float32")))
    return m


def _data():
    import torch
    _, data = _arrays(0)
    return [(torch.from_numpy(x.astype("float32")), torch.from_numpy(y.astype("float32"))) for x, y in data]


def _config(zero: dict) -> dict:
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.01}},
            "gradient_clipping": 1.0, "zero_optimization": zero}


def _digest(tensors: dict) -> dict:
    import numpy as np
    out = {}
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name].detach().float().cpu().numpy())
        out[name] = {"sha256": hashlib.sha256(a.tobytes()).hexdigest(), "values": a.ravel().tolist()}
    return out


def _train(engine, data, steps: int, start: int = 0) -> list:
    import torch
    losses = []
    for i in range(start, start + steps):
        x, y = data[i % len(data)]
        loss = torch.nn.functional.mse_loss(engine(x).float(), y)
        losses.append(loss.item())
        engine.backward(loss)
        engine.step()
    return losses


def _engine(zero: dict):
    import zspeed
    engine, *_ = zspeed.initialize(model=_model(), config=_config(zero))
    return engine


def _result(engine, losses) -> dict:
    return {"losses": [float.hex(v) for v in losses], "params": _digest(dict(engine.module.named_parameters()))}


def _torch_grads(data) -> dict:
    """The plain model's gradients of every batch at the starting weights (torch alone)."""
    import torch
    m = _model()
    grads = {}
    for i, (x, y) in enumerate(data):
        m.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        grads.update({f"batch{i}.{n}": p.grad.clone() for n, p in m.named_parameters()})
    return _digest(grads)


def _optimizer_run(steps: int = 6) -> dict:
    """ZeRO-2 + CPU offload with gradients from PCG64: loss = sum(p * G) gives p.grad = G exactly,
    whatever torch's kernels; G is scaled so that the gradient norm stays under the clipping
    threshold (1.0), which then leaves it unscaled. Only zspeed decides the weights."""
    import numpy as np
    import torch
    e = _engine({"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}})
    rng = np.random.Generator(np.random.PCG64(7))
    named = list(e.module.named_parameters())
    for _ in range(steps):
        gs = {n: torch.from_numpy((rng.standard_normal(tuple(p.shape)) * 0.02).astype("float32")) for n, p in named}
        loss = sum((p * gs[n]).sum() for n, p in named)
        e.backward(loss)
        e.step()
    res = _result(e, [])
    e.close()
    return res


def run_all(out: Path) -> dict:
    import zspeed
    os.environ.setdefault("ZSPEED_DEVICE", "cpu")
    data = _data()
    res = {"platform": sys.platform}
    res["torch_grads"] = _torch_grads(data)
    res["optimizer"] = _optimizer_run()
    cpu = {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    e = _engine(cpu)
    res["zero2_cpu"] = _result(e, _train(e, data, 6))
    e.close()
    with tempfile.TemporaryDirectory(dir=out) as swap:
        e = _engine({"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": swap, "buffer_count": 2}})
        res["zero2_nvme"] = _result(e, _train(e, data, 6))
        e.close()
    e = _engine({"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}})
    losses = _train(e, data, 6)
    import zspeed.runtime.zero as zero
    with zero.GatheredParameters(list(e.module.parameters())):
        res["zero3"] = _result(e, losses)
    e.close()
    # Save after 3 steps, resume in a new engine, 3 more: the same as 6 in one go (zero2_cpu).
    ckpt = out / "ckpt"
    e = _engine(cpu)
    first = _train(e, data, 3)
    e.save_checkpoint(str(ckpt), tag="step3")
    e.close()
    e = _engine(cpu)
    e.load_checkpoint(str(ckpt), tag="step3")
    res["resume"] = _result(e, first + _train(e, data, 3, start=3))
    e.close()
    fp32 = out / "model_fp32.safetensors"
    r = subprocess.run([sys.executable, "-m", "zspeed", "to-fp32", str(ckpt), str(fp32)], capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"zspeed to-fp32 failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    from safetensors.numpy import load_file
    import torch
    res["to_fp32"] = _digest({k: torch.from_numpy(v) for k, v in load_file(str(fp32)).items()})
    r = subprocess.run([sys.executable, "-m", "zspeed", "report", "--json"], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"zspeed report --json failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    rep = json.loads(r.stdout)
    res["report"] = {"version": rep.get("version"), "zspeed_version": zspeed.__version__,
                     "aio_auto": (rep.get("io_backend_auto") or {}).get("chosen"),
                     "simd": (rep.get("simd") or {}).get("level")}
    # Two ranks through `zspeed launch` (torchrun's agent, Gloo on the CPU).
    ranks = out / "ranks"
    ranks.mkdir(exist_ok=True)
    env = dict(os.environ, ZSPEED_DEVICE="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "zspeed", "launch", "--num_gpus", "2", "--master_port",
                        str(_free_port()), os.path.abspath(__file__), "rank", str(ranks)],
                       capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0:
        raise SystemExit(f"zspeed launch failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    res["launch2"] = [json.loads((ranks / f"rank{k}.json").read_text()) for k in range(2)]
    (out / "results.json").write_text(json.dumps(res, indent=1))
    return res


def _free_port() -> int:
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(out: Path) -> None:
    """One rank of launch2: ZeRO-2 + CPU offload over 2 ranks, each rank its half of every batch."""
    import torch.distributed as dist
    e = _engine({"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}})
    data = [(x[e.global_rank::2], y[e.global_rank::2]) for x, y in _data()]
    losses = _train(e, data, 6)
    res = _result(e, losses)
    res.update(rank=e.global_rank, world_size=e.world_size, backend=dist.get_backend())
    (out / f"rank{e.global_rank}.json").write_text(json.dumps(res))
    e.close()


def _first_difference(a: dict, b: dict) -> str:
    """'' when the params digests are equal, else the first tensor that differs and by how much."""
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            return f"{name}: only on one side"
        if a[name]["sha256"] != b[name]["sha256"]:
            diff = max(abs(x - y) for x, y in zip(a[name]["values"], b[name]["values"]))
            n = sum(x != y for x, y in zip(a[name]["values"], b[name]["values"]))
            return f"{name}: {n} of {len(a[name]['values'])} values differ, largest difference {diff:.3g}"
    return ""


TOLERANCE = 1e-5  # a training run's weights where torch's gradients differ (the module docstring)


def _largest_difference(a: dict, b: dict) -> float:
    return max((abs(x - y) for name in set(a) & set(b) for x, y in zip(a[name]["values"], b[name]["values"])),
               default=float("inf"))


def compare(a_dir: Path, b_dir: Path) -> int:
    """Checks each platform's runs among themselves (exact), then the two platforms against each
    other: the optimizer run exactly; the training runs exactly where torch's gradients agree,
    else to within TOLERANCE (the module docstring)."""
    a = json.loads((a_dir / "results.json").read_text())
    b = json.loads((b_dir / "results.json").read_text())
    fails, lines = [], []
    for side in (a, b):
        p = side["platform"]
        # Within one platform: NVMe trains bit for bit like CPU offload; a resumed run equals
        # an uninterrupted one; to-fp32 holds the weights training ended with; both ranks agree.
        for what, x, y in (("zero2_nvme vs zero2_cpu", side["zero2_nvme"], side["zero2_cpu"]),
                           ("resume vs zero2_cpu", side["resume"], side["zero2_cpu"])):
            d = _first_difference(x["params"], y["params"])
            if d or x["losses"] != y["losses"]:
                fails.append(f"{p}: {what}: {d or 'losses differ'}")
        # to-fp32 holds the weights of the checkpoint (after step 3): every tensor is there;
        # its values are compared with the other platform's below.
        if set(side["to_fp32"]) != set(side["zero2_cpu"]["params"]):
            fails.append(f"{p}: to-fp32 tensors {sorted(side['to_fp32'])}")
        r0, r1 = side["launch2"]
        d = _first_difference(r0["params"], r1["params"])
        if d or r0["world_size"] != 2 or r1["world_size"] != 2 or r0["backend"] != "gloo":
            fails.append(f"{p}: launch2 ranks disagree or not 2 Gloo ranks: {d or (r0['world_size'], r0['backend'])}")
        if side["report"]["version"] != side["report"]["zspeed_version"]:
            fails.append(f"{p}: report version {side['report']}")
    torch_same = not _first_difference(a["torch_grads"], b["torch_grads"])
    lines.append("torch_grads " + ("bit-identical: torch's CPU forward and backward give the same bits on both "
                                   "builds" if torch_same else
                                   f"differ: {_first_difference(a['torch_grads'], b['torch_grads'])} (torch's "
                                   f"CPU kernels take other code paths on the two builds here)"))
    d = _first_difference(a["optimizer"]["params"], b["optimizer"]["params"])
    lines.append(f"{'optimizer':<11} " + (f"bit-identical ({a['platform']} and {b['platform']}): zspeed's C "
                                          f"optimizer" if not d else f"differs: {d}"))
    if d:
        fails.append(f"optimizer: zspeed's C optimizer gave other bits on the two builds from the same "
                     f"gradients: {d}")
    for run in ("zero2_cpu", "zero2_nvme", "zero3", "resume", "to_fp32", "launch2"):
        x, y = a[run], b[run]
        if run == "launch2":
            x, y = x[0], y[0]
        px, py = (x, y) if run == "to_fp32" else (x["params"], y["params"])
        d = _first_difference(px, py)
        same_losses = run == "to_fp32" or x["losses"] == y["losses"]
        if not d and same_losses:
            lines.append(f"{run:<11} bit-identical ({a['platform']} and {b['platform']})")
            continue
        first_loss = "" if same_losses else next(
            f"; losses first differ at step {i + 1} ({float.fromhex(u)!r} vs {float.fromhex(v)!r})"
            for i, (u, v) in enumerate(zip(x["losses"], y["losses"])) if u != v)
        lines.append(f"{run:<11} differs: {d or 'params equal'}{first_loss}")
        if torch_same:
            fails.append(f"{run}: torch's gradients are bit-identical on both builds, so the run must be too: "
                         f"{d or 'losses differ'}{first_loss}")
        elif (largest := _largest_difference(px, py)) > TOLERANCE:
            fails.append(f"{run}: differs by {largest:.3g} > {TOLERANCE:g} (torch's gradients "
                         f"differ, but not by that much)")
    print("\n".join(lines))
    if fails:
        print("FAILED:\n  " + "\n  ".join(fails))
        return 1
    return 0


def main(argv=None) -> int:
    argv = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("--local_rank=")]
    if len(argv) == 2 and argv[0] == "run":
        out = Path(argv[1])
        out.mkdir(parents=True, exist_ok=True)
        run_all(out.resolve())
        print(f"windows_parity: {sys.platform} results in {out / 'results.json'}")
        return 0
    if len(argv) == 2 and argv[0] == "rank":  # started by zspeed launch (--local_rank=N left out above)
        rank_main(Path(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        return compare(Path(argv[1]), Path(argv[2]))
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
