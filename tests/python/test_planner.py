"""zspeed plan (python/zspeed/planner.py): what fits, per tier, from the engine's own accounting.

The GPU figures are checked against peaks measured on the H200 host (bench/RESULTS.md, the
1.28B GPT of bench/bench_engine.py, batch 8 x 1024, bf16, ZeRO-2 + CPU offload): 17.45 GiB at
ratio 1, 6.15 GiB as the first step's peak with activation checkpointing, and "auto" choosing
0.755 on a 24 GiB cap. The estimate is a formula, so the tolerance is 5% of the measured peak
(the allocator's own rounding and small tensors the formula leaves out)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402

import zspeed  # noqa: E402
from zspeed.planner import Shape, plan  # noqa: E402

GiB = float(1 << 30)


def _gpt_1b():
    from gpt import GPT, GPTConfig
    with torch.device("meta"):
        return GPT(GPTConfig.gpt_1b())


def _row(rep, start):
    return next(c for c in rep.candidates if c.name.startswith(start))


def test_the_gpu_estimate_matches_the_peaks_measured_on_the_h200():
    rep = plan(_gpt_1b(), gpu_memory=24, host_memory=125, batch=8, seq=1024, cpu_seconds_per_element=2.4e-10)
    r1 = _row(rep, "ZeRO-2 + CPU offload, ratio 1")
    assert r1.total("gpu") / GiB == pytest.approx(17.45, rel=0.05)
    assert set(r1.tiers["gpu"]) == {"weights", "gradients (autograd's, whole model)", "activations"}
    # The first step's peak with checkpointing, which sizes "auto" there.
    ck = plan(_gpt_1b(), gpu_memory=24, host_memory=125, batch=8, seq=1024, ckpt=True, cpu_seconds_per_element=1e-9)
    assert _row(ck, "ZeRO-2 + CPU offload, ratio 1").total("gpu") / GiB == pytest.approx(6.15, rel=0.05)
    # "auto" on the 24 GiB cap: the H200 run chose 0.755 (the CPU's share).
    auto = _row(rep, "ZeRO-2 + CPU offload, ratio auto")
    assert auto.cpu_share == pytest.approx(0.755, abs=0.03)
    assert auto.fits and rep.best is auto
    # The CPU step at the given rate: the CPU's share of the elements.
    n = sum(p.numel() for p in dict.fromkeys(_gpt_1b().parameters()))
    assert r1.cpu_step_s == pytest.approx(2.4e-10 * n, rel=1e-6)
    # Without offload the optimizer's fp32 state does not fit 24 GiB (it needs 36.5 GiB on the H200).
    assert not _row(rep, "ZeRO-2, optimizer on the GPU").fits


def test_the_host_tier_is_what_the_engine_itself_reserves():
    """The planner and the engine sum the same components: for a model the engine can build
    here, the planner's host tier equals engine.memory_needs["host"] for each stage."""
    for zero in ({"stage": 2, "offload_optimizer": {"device": "cpu"}},
                 {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}):
        cfg = eh.config(zero_optimization=zero)
        cfg["bf16"] = {"enabled": True}
        e, *_ = zspeed.initialize(model=eh.mlp(), config=cfg)
        rep = plan(eh.mlp(), gpu_memory=24, host_memory=64, cpu_seconds_per_element=1e-9)
        name = "ZeRO-2 + CPU offload, ratio 1" if zero["stage"] == 2 else "ZeRO-3, both offloaded to CPU"
        assert _row(rep, name).tiers["host"] == e.memory_needs["host"], (zero, e.memory_needs)
        e.close()
    assert any("activations are not counted" in n for n in rep.notes)


def test_13b_on_a_24_gib_card_and_64_gib_of_host_memory():
    """The common question: nothing fits in host memory (14 bytes per parameter at ZeRO-3 with
    fp32 states, about 8 with int8: the gradients land in the bf16 shards); with an NVMe disk the
    optimizer goes there."""
    rep = plan(params=13e9, gpu_memory=24, host_memory=64, ckpt=True, cpu_seconds_per_element=1e-9)
    assert rep.best is None and rep.params == pytest.approx(13e9, rel=0.03)
    z3 = _row(rep, "ZeRO-3, both offloaded to CPU")
    assert z3.total("gpu") < 4 * GiB and any("host" in w for w in z3.why)
    assert z3.total("host") == pytest.approx(14 * rep.params, rel=0.01)  # bf16 shards, fp32 masters + moments
    disk = plan(params=13e9, gpu_memory=24, host_memory=64, disk=500, ckpt=True, cpu_seconds_per_element=1e-9)
    best = disk.best
    assert best is not None and best.config["zero_optimization"]["offload_optimizer"]["device"] == "nvme"
    assert best.name.startswith("ZeRO-3, optimizer GPU + host + NVMe")  # less on the disk: the faster step
    whole = _row(disk, "ZeRO-3, parameters CPU, optimizer NVMe")
    # fp32 masters + int8 moments, once (compact swap files: the swappers write into the shards)
    # plus the spare slots: 4 x buffer_count (4) partitions of 2^23 elements
    assert whole.fits and whole.total("nvme") == pytest.approx(6 * (disk.params + 16 * 2 ** 23), rel=0.01)
    assert whole.cpu_step_s is None  # all of it on the disk: its speed, not the CPU's, sets the step
    assert best.total("nvme") < 0.8 * whole.total("nvme")
    assert any("disk's speed" in n for n in disk.notes)
    assert best.step_s is None  # no disk rates given: not predicted
    # Two GPUs on the host: each rank holds half at ZeRO-3; the host holds both halves.
    two = plan(params=13e9, gpu_memory=24, host_memory=64, gpus=2, ckpt=True, cpu_seconds_per_element=1e-9)
    assert _row(two, "ZeRO-3, both offloaded to CPU").total("host") == pytest.approx(z3.total("host") / 2, rel=0.01)
    # The split runs on several ranks too: with "auto" each rank's GPU holds part of its state.
    auto3 = _row(two, "ZeRO-3, both offloaded, ratio auto")
    assert auto3.cpu_share < 1 and auto3.total("host") < _row(two, "ZeRO-3, both offloaded to CPU").total("host")
    assert not any("ratio" in n for n in two.notes)


def _gpt(layers):
    from gpt import GPT, GPTConfig
    with torch.device("meta"):
        return GPT(GPTConfig(vocab_size=32000, max_len=1024, d_model=4096, n_layer=layers, n_head=32))


@pytest.mark.parametrize("layers,state_dtype,measured", [(16, "fp32", 0.645), (32, "int8", 0.829)])
def test_auto_at_zero3_against_the_h200(layers, state_dtype, measured):
    """ZeRO-3 with both offloads on a 24 GiB cap, batch 8 x 1024 with checkpointing (bench/RESULTS.md,
    "The split and overlap_forward at ZeRO-3"): "auto" chose 0.645 (3.36B) and 0.829 (6.58B, int8)
    after step 1. The planner's step-1 estimate leaves out about 2 GiB the run measured (the fp32
    logits and their gradient, the recomputed block), so its share is a little smaller: within 0.05."""
    rep = plan(_gpt(layers), gpu_memory=24, host_memory=125, batch=8, seq=1024, ckpt=True,
               cpu_seconds_per_element=2.5e-10)
    name = "ZeRO-3, both offloaded, " + ("ratio auto" if state_dtype == "fp32" else "int8 states, ratio auto")
    row = _row(rep, name)
    assert row.fits and row.cpu_share == pytest.approx(measured, abs=0.05)
    # The GPU holds the share's fp32 masters, moments and gradients: 16 bytes per element.
    gpu = row.tiers["gpu"]
    n = gpu["fp32 masters and Adam moments of the GPU's share"] // 12
    assert gpu["fp32 gradients of the GPU's share"] == 4 * n and n > 0


def test_shapes_of_a_parameter_count():
    for n in (1.3e9, 7e9, 70e9):
        s = Shape.for_params(n)
        assert 12 * s.layers * s.hidden ** 2 == pytest.approx(n, rel=0.1) and s.hidden % 128 == 0


def test_the_cli():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = lambda *a: subprocess.run([sys.executable, "-m", "zspeed", "plan", *a], capture_output=True, text=True,
                                    env=env, timeout=300)
    r = run("--params", "1.3e9", "--gpu-mem", "24", "--host-mem", "64", "--batch", "4")
    assert r.returncode == 0, r.stderr
    assert "Recommended:" in r.stdout and "GPU GiB" in r.stdout and "ns/element measured here" in r.stdout
    r = run("--params", "13e9", "--gpu-mem", "24", "--host-mem", "64", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["best"] is None
    r = run("--params", "13", "--gpu-mem", "24")
    assert r.returncode == 2 and "give the parameter count itself" in r.stderr
    r = run("--gpu-mem", "24")
    assert r.returncode == 2 and "--params" in r.stderr


def test_a_transformers_config(tmp_path):
    pytest.importorskip("transformers", reason="the --hf-config route needs transformers")
    cfg = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000}
    rep = plan(hf_config=cfg, gpu_memory=8, host_memory=16, batch=2, seq=256, cpu_seconds_per_element=1e-9)
    with torch.device("meta"):
        import transformers
        m = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**dict(cfg)))
    assert rep.params == sum(p.numel() for p in dict.fromkeys(m.parameters()))
    assert rep.best is not None and rep.best.name == "ZeRO-2, optimizer on the GPU"
    act = rep.best.tiers["gpu"]["activations"]
    assert act == 34 * 256 * 2 * 512 * 4  # bytes per layer: 34 x seq x batch x hidden (bf16)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert plan(hf_config=str(path), gpu_memory=8, host_memory=16, batch=2, seq=256,
                cpu_seconds_per_element=1e-9).params == rep.params


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="exactly one of"):
        plan(params=1e9, hf_config={"model_type": "llama"})
    with pytest.raises(ValueError, match="dtype"):
        plan(params=1e9, dtype="int4")
    with pytest.raises(ValueError, match=">= 1"):
        plan(params=1e9, gpus=0)


def test_the_largest_model_per_configuration():
    """--largest bisects the parameter count: at ZeRO-3 with fp32 states the host holds 14 bytes
    per parameter (bf16 shards, which the gradients land in, fp32 masters and two moments) within
    90% of its memory, with int8 states about 8. GPT shapes come in steps (whole layers, hidden sizes in
    multiples of 128), so the answer lies within one step (15%) below the bound."""
    from zspeed.planner import largest
    sizes = largest(gpu_memory=24, host_memory=64, ckpt=True, cpu_seconds_per_element=1e-9)
    bound = 0.9 * 64 * GiB
    z3 = sizes["ZeRO-3, both offloaded to CPU"]
    assert 0.85 * bound / 14 <= z3 <= bound / 14
    z3q = sizes["ZeRO-3, both offloaded, int8 states"]
    assert 0.85 * bound / 8.1 <= z3q <= bound / 7.9
    # ZeRO-2 + offload keeps the weights on the GPU: 14 host bytes per parameter, so on a small
    # host it fits more than ZeRO-3 until the GPU (4 bytes per parameter) is full.
    assert sizes["ZeRO-2, optimizer on the GPU"] < sizes["ZeRO-2 + CPU offload, ratio 1"] <= bound / 14
    assert z3 < z3q
    rep = plan(params=z3, gpu_memory=24, host_memory=64, ckpt=True, cpu_seconds_per_element=1e-9)
    assert rep.params == z3 and _row(rep, "ZeRO-3, both offloaded to CPU").fits
    rep = plan(params=1.02 * bound / 14, gpu_memory=24, host_memory=64, ckpt=True, cpu_seconds_per_element=1e-9)
    assert not _row(rep, "ZeRO-3, both offloaded to CPU").fits


def test_three_tiers_fill_the_gpu_and_the_host_and_put_the_rest_on_the_disk():
    """With a disk the GPU + host + NVMe row sizes ratio from the GPU's room and max_in_cpu from
    the host's (90% of it, less the shards and gradients), so the disk holds only the rest; its
    config is one the engine takes, and it fits larger models than the optimizer wholly on NVMe."""
    from zspeed.planner import largest
    from zspeed.runtime.config import parse_config
    rep = plan(params=20e9, gpu_memory=24, host_memory=125, disk=200, batch=8, ckpt=True,
               cpu_seconds_per_element=1e-9)
    row = next(c for c in rep.candidates if c.name.startswith("ZeRO-3, optimizer GPU + host + NVMe"))
    off = row.config["zero_optimization"]["offload_optimizer"]
    assert 0 < off["ratio"] < 1 and off["max_in_cpu"] > 0 and row.fits
    assert row.total("gpu") <= 24 * GiB and 0.85 * 125 * GiB <= row.total("host") <= 0.9 * 125 * GiB
    assert row.tiers["host"]["fp32 masters (max_in_cpu)"] == 4 * off["max_in_cpu"]
    assert row.cpu_step_s == pytest.approx(1e-9 * off["max_in_cpu"])  # the host's share; the disk's is not CPU time
    on_disk = int(rep.params * off["ratio"]) - off["max_in_cpu"]  # fp32 masters + int8 moments on NVMe, once
    assert row.total("nvme") == pytest.approx(6 * (on_disk + 16 * 2 ** 23), rel=0.01)  # + the spare slots
    parse_config(dict(row.config, zero_optimization={**row.config["zero_optimization"], "offload_optimizer": {
        **off, "nvme_path": "."}}), world_size=1)
    sizes = largest(gpu_memory=24, host_memory=125, disk=64, batch=8, ckpt=True, cpu_seconds_per_element=1e-9)
    three = sizes["ZeRO-3, optimizer GPU + host + NVMe, int8 states"]
    assert three > 1.3 * sizes["ZeRO-3, parameters CPU, optimizer NVMe"]
    # (host memory alone keeps no gradient buffer, the NVMe tier's share still does: docs/ZERO3.md)
    assert three > 1.2 * sizes["ZeRO-3, both offloaded, int8 states, ratio auto"]


# The H200's NVMe runs (bench/RESULTS.md, "Three tiers"): 6.58B int8 states at ZeRO-3, forward and
# backward 0.95 s, the disk's aio rates there (read 1.24, write 2.16 GB/s), the CPU's int8 rate
# 0.164 ns/element, the GPU's AdamW 0.023 ns/element: (GPU, host, NVMe elements, measured step s).
H200_NVME = [(1.14e9, 0, 5.43e9, 37.3), (1.14e9, 2.69e9, 2.75e9, 18.2), (0.99e9, 2.63e9, 2.95e9, 25.96)]


@pytest.mark.parametrize("gpu,host,nvme,measured", H200_NVME)
def test_the_nvme_step_is_the_disk_s_bytes_at_its_rates(gpu, host, nvme, measured):
    """The NVMe rows' prediction: forward+backward, the GPU's and the host's shares, and the NVMe
    share's bytes read then written at the disk's rates. The H200 host's virtual disk served
    1.37-1.84 GB/s in both directions together, so the steps lie within 25% of this serial
    bound (0.86-1.15x in bench/RESULTS.md)."""
    import types
    from zspeed.planner import Candidate, disk_seconds, predicted_step
    local = gpu + host + nvme
    cand = Candidate("three tiers", {}, tiers={"nvme": {"masters and state": 6.03 * nvme}},
                     cpu_share=(host + nvme) / local)
    rp = types.SimpleNamespace(optimizer="split", cpu_tier="nvme", world_size=1, timing="sync")
    got = predicted_step(rp, cand, int(local), 0.95, True, 0.164e-9, 0.023e-9, (1.24, 2.16), int(host))
    want = 0.95 + 0.023e-9 * gpu + 0.164e-9 * host + disk_seconds(6.03 * nvme, 1.24, 2.16)
    assert got == pytest.approx(want, rel=1e-3)
    assert got == pytest.approx(measured, rel=0.25)
    assert predicted_step(rp, cand, int(local), 0.95, True, 0.164e-9, 0.023e-9, None, int(host)) is None
    with pytest.raises(ValueError, match="give both disk_read_gbs and disk_write_gbs"):
        plan(params=1e9, gpu_memory=24, host_memory=64, disk=100, disk_read_gbs=1.0)


# The H200 measurements (bench/RESULTS.md) the step model is checked against: per case the
# forward+backward of one micro-batch at ratio 1 (the run's own "fwd+bwd" column), the CPU Adam
# rate (the ratio-1 run's optimizer step over its parameters), and the steps measured per mode.
H200_STEPS = [
    # (layers, d_model, stage, ckpt, state dtype, fwd+bwd s, CPU s/element, {row: measured step s})
    (24, 2048, 2, False, "fp32", 0.12, 0.24e-9, {"ZeRO-2 + CPU offload, ratio auto": 0.302,
                                                  "ZeRO-2 + CPU offload, ratio 1": 0.410}),
    (16, 4096, 3, True, "fp32", 0.519, 0.256e-9, {"ZeRO-3, both offloaded, ratio auto": 0.853,
                                                   "ZeRO-3, both offloaded to CPU": 1.380}),
    (32, 4096, 3, True, "int8", 0.965, 0.164e-9, {"ZeRO-3, both offloaded, int8 states, ratio auto": 1.672}),
]


@pytest.mark.parametrize("layers,d,stage,ckpt,sd,fb,cpu,steps", H200_STEPS)
def test_the_predicted_steps_are_within_20_percent_of_the_h200s(layers, d, stage, ckpt, sd, fb, cpu, steps):
    """Given the measured forward+backward and CPU rate, the step model (the CPU's share of the
    optimizer during the next forward, then the backward) predicts each mode's measured step
    within 20% (issue 30's bar), on the 24 GiB cap with batch 8 x 1024."""
    from gpt import GPT, GPTConfig
    with torch.device("meta"):
        m = GPT(GPTConfig(vocab_size=32000, max_len=1024, d_model=d, n_layer=layers, n_head=d // 128))
    rep = plan(m, gpu_memory=24, host_memory=125, batch=8, seq=1024, ckpt=ckpt, cpu_seconds_per_element=cpu,
               int8_seconds_per_element=cpu, fwd_bwd_seconds=fb, gpu_seconds_per_element=0.03e-9)
    for row, measured in steps.items():
        got = _row(rep, row).step_s
        assert got == pytest.approx(measured, rel=0.20), (row, got, measured)
    assert "Steps predicted from forward+backward" in str(rep)


def test_the_forward_backward_timing_of_one_block(monkeypatch):
    """measure_fwd_bwd times one block and the output layer (here on the CPU, a tiny shape):
    more layers take longer, checkpointing adds a third of the blocks' time. The formula is
    checked on a clock that advances one second per reading (each timed run then takes exactly
    one second), so a loaded machine cannot turn it around; a real timing is only positive."""
    import time
    from zspeed.planner import measure_fwd_bwd
    s2, s8 = Shape(layers=2, hidden=64, heads=2, vocab=100), Shape(layers=8, hidden=64, heads=2, vocab=100)
    assert measure_fwd_bwd(s2, 2, 16, False, "fp32", device="cpu") > 0
    ticks = iter(range(1, 10**6))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    t2 = measure_fwd_bwd(s2, 2, 16, False, "fp32", device="cpu")
    t8 = measure_fwd_bwd(s8, 2, 16, False, "fp32", device="cpu")
    t8c = measure_fwd_bwd(s8, 2, 16, True, "fp32", device="cpu")
    monkeypatch.undo()
    assert (t2, t8) == (2 * 1.0 + 1.0, 8 * 1.0 + 1.0)  # layers x block + output layer
    assert t8c == pytest.approx(8 * 4 / 3 + 1.0)
    rep = plan(params=1.3e9, gpu_memory=24, host_memory=64, cpu_seconds_per_element=1e-9)
    if not torch.cuda.is_available():  # no GPU and no --fwd-bwd-s: no step is predicted, and it says so
        assert all(c.step_s is None for c in rep.candidates) and "Steps not predicted" in str(rep)


def test_measured_on_the_spot_zero3_rows_add_one_pass_of_weight_fetches(monkeypatch):
    """With forward+backward timed on the spot (here: the timing functions stand in for a GPU),
    the rows whose ZeRO-3 parameters live in host memory get one pass of the 16-bit weights at
    the measured host-to-GPU rate on top; the other rows do not, and a given forward+backward is
    used as it is."""
    import zspeed.planner as planner
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a stand-in GPU")
    monkeypatch.setattr(planner, "measure_fwd_bwd", lambda *a, **k: 0.5)
    monkeypatch.setattr(planner, "measure_h2d_gbs", lambda *a, **k: 40.0)
    kw = dict(params=2e9, gpu_memory=24, host_memory=125, batch=8, cpu_seconds_per_element=0.2e-9,
              int8_seconds_per_element=0.2e-9, gpu_seconds_per_element=0.02e-9)
    spot = plan(**kw)
    given = plan(**kw, fwd_bwd_seconds=0.5)
    fetch = spot.params * 2 / 40e9
    assert spot.machine["fetch_s"] == pytest.approx(fetch) and given.machine["fetch_s"] == 0.0
    assert "weight fetches where ZeRO-3 offloads the parameters" in str(spot)
    for row in ("ZeRO-3, both offloaded to CPU", "ZeRO-2 + CPU offload, ratio 1"):
        a, b = _row(spot, row).step_s, _row(given, row).step_s
        assert a == pytest.approx(b + (fetch if row.startswith("ZeRO-3") else 0.0)), row


def test_the_cpu_rate_is_the_offloaded_steps():
    """The CPU rate the planner and "auto" use is the offloaded step's (16-bit gradients in,
    16-bit weights out): measured and positive for each model dtype (no fp32-only fallback)."""
    from zspeed.runtime.split import measure_rates
    from zspeed.runtime.config import parse_config
    c = parse_config({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, world_size=1)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        cpu_s, gpu_s = measure_rates(torch.device("cpu"), c.optimizer_name, c.optimizer_params, True, 2,
                                     cpu_elems=1 << 16, repeats=3, model_dtype=dt)
        assert cpu_s is not None and 0 < cpu_s < 1e-6 and gpu_s is None, dt


# -- bad input (issue 52, findings 9, 10, 14): one validator for the API and the command line --------
BAD_API = [
    dict(params=float("inf")), dict(params=float("nan")), dict(params=1e30), dict(params=True), dict(params=-5e9),
    dict(params="lots"), dict(gpu_memory=float("inf")), dict(gpu_memory=float("nan")), dict(gpu_memory=-1),
    dict(host_memory=float("inf")), dict(host_memory=0), dict(disk=float("nan")), dict(disk=-1), dict(cores=0),
    dict(cores=-1), dict(cores=2.5), dict(gpus=True), dict(gpus=2.5), dict(gpus=0), dict(batch=1.5),
    dict(batch=0), dict(seq=-3), dict(fwd_bwd_seconds=-1), dict(fwd_bwd_seconds=0),
    dict(fwd_bwd_seconds=float("nan")), dict(fwd_bwd_seconds=float("inf")),
    dict(disk_read_gbs=float("nan"), disk_write_gbs=1.0), dict(disk_read_gbs=1.0, disk_write_gbs=-2.0),
    dict(cpu_seconds_per_element=float("nan")),
]


@pytest.mark.parametrize("bad", BAD_API, ids=lambda d: ",".join(f"{k}={v!r}" for k, v in d.items()))
def test_the_api_refuses_each_bad_value_by_name(bad):
    kw = dict(params=1e9, gpu_memory=24, host_memory=64, cpu_seconds_per_element=1e-9)
    kw.update(bad)
    names = "|".join(k.split("_seconds")[0].split("_gbs")[0] for k, v in bad.items() if v not in (1.0,))
    with pytest.raises(ValueError, match=names):
        plan(**kw)


@pytest.mark.parametrize("text,n", [("7B", 7e9), ("7b", 7e9), ("13e9", 13e9), ("1.5B", 1.5e9), ("350M", 350e6),
                                    ("1T", 1e12), (" 13_000_000_000 ", 13e9)])
def test_parameter_counts_are_read_as_people_write_them(text, n):
    from zspeed.planner import parse_count
    assert parse_count(text) == n
    assert plan(params=text, gpu_memory=80, host_memory=4096, cpu_seconds_per_element=1e-9).params > 0


def _cli(*a):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="0")
    return subprocess.run([sys.executable, "-m", "zspeed", "plan", *a], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("args", [
    ["--params", "inf"], ["--params", "1e30"], ["--params", "7 billion"], ["--gpu-mem", "inf"],
    ["--host-mem", "inf"], ["--cores", "0"], ["--cores", "-1"], ["--disk", "nan"], ["--disk", "-1"],
    ["--fwd-bwd-s", "-1"], ["--fwd-bwd-s", "nan"], ["--disk-read-gbs", "nan", "--disk-write-gbs", "1"],
    ["--gpus", "2.5"], ["--batch", "1.5"]])
def test_the_cli_answers_bad_values_with_one_line_not_a_traceback(args):
    full = (["--params", "1e9"] if "--params" not in args else []) + ["--host-mem", "64"] + args
    r = _cli(*full)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.strip(), r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("zspeed plan"), r.stderr  # (argparse's usage above it)


def test_hf_config_files_are_read_as_named_and_bad_ones_refused(tmp_path):
    pytest.importorskip("transformers", reason="the --hf-config route needs transformers")
    small = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100}
    big = dict(small, hidden_size=512, intermediate_size=1376, num_hidden_layers=6)
    (tmp_path / "config.json").write_text(json.dumps(small))
    (tmp_path / "big.json").write_text(json.dumps(big))
    kw = dict(gpu_memory=8, host_memory=16, cpu_seconds_per_element=1e-9)
    n_small = plan(hf_config=str(tmp_path / "config.json"), **kw).params
    n_big = plan(hf_config=str(tmp_path / "big.json"), **kw).params
    assert n_big > 10 * n_small  # the file named, not the config.json beside it
    assert plan(hf_config=str(tmp_path), **kw).params == n_small  # a folder: its config.json
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "nomodel.json").write_text(json.dumps({"hidden_size": 3}))
    (tmp_path / "empty").mkdir()
    for bad, says in [(tmp_path / "missing.json", "no such file"), ("/dev/zero", "not a regular file"),
                      ("", "empty"), (tmp_path / "junk.json", "not a readable JSON"),
                      (tmp_path / "nomodel.json", "model_type"), (tmp_path / "empty", "no config.json"),
                      ("someone/some-model", "Hub model id")]:
        with pytest.raises(ValueError, match=says):
            plan(hf_config=str(bad), **kw)
    r = _cli("--hf-config", "someone/some-model", "--host-mem", "64")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "huggingface-cli download" in r.stderr, r.stderr


def test_the_readmes_plan_examples_answer():
    """The README's two `zspeed plan` lines (issue 56 #4: its one example answered "Nothing
    fits"): 7B fits a 24 GiB GPU with 64 GiB of host memory; 13B fits there with the NVMe tier
    and not without."""
    import re
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("zspeed plan ")]
    assert len(lines) == 2, lines
    for line in lines:
        args = re.sub(r"\s+#.*", "", line).split()[2:] + ["--cores", "16"]
        r = _cli(*args)
        assert r.returncode == 0 and "Recommended:" in r.stdout, (line, r.stdout[-1500:], r.stderr[-1500:])
    no_disk = re.sub(r"\s+#.*", "", lines[1]).replace("--disk 500", "").split()[2:]
    assert _cli(*no_disk, "--cores", "16").returncode == 1
