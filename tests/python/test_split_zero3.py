"""The GPU/CPU optimizer split over a store's local space (runtime/split_store.py): ZeRO-3 on one
rank and on several, and ZeRO stages 1-2 on several ranks (Gloo on the CPU here; on the
CPU-only test machine the "GPU" half runs torch's AdamW on the CPU, tests/gpu runs it on CUDA).

Tolerances: the GPU's half runs torch's AdamW, the CPU's zspeed's kernel; both are AdamW in
fp32 but order their operations differently, so a split run equals the all-CPU run to fp32
rounding (1e-5 relative, 1e-6 absolute after a few steps; bf16/fp16 models to a few ulps of
their dtype, 2e-2), as in test_split.py. Between ranks the same gradients give the same
bits, and an overlapped step equals the synchronous one bit for bit."""
from __future__ import annotations

import os
import re
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402
import test_dp as dp  # noqa: E402
import test_zero3 as z3  # noqa: E402

import zspeed  # noqa: E402

ON_CPU = z3.DEVICE == "cpu"


def _cfg(ratio, param="cpu", precision="fp32", gas=1, state_dtype="fp32", overlap=False, **zero):
    c = z3._cfg(3, opt="cpu", param=param, precision=precision, gas=gas, **zero)
    c["zero_optimization"]["offload_optimizer"].update(ratio=ratio, overlap_forward=overlap)
    if state_dtype != "fp32":
        c["optimizer"]["params"]["state_dtype"] = state_dtype
    return c


def _near(a, b):
    """Steps mixing the two kernels: where a gradient element is near zero, Adam's division by
    sqrt(v) lifts their fp32 rounding in the weight (a few 1e-6 on Linux, 6e-5 with Windows'
    torch build); the tolerance is test_zero3's for the same amplification between ranks."""
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=2e-4, msg=lambda m, k=k: f"{k}: {m}")


def _go_on(engine, steps, start):
    """Trains on the batches a z3._train run of start + steps would reach after ``start``."""
    gas = engine.gradient_accumulation_steps()
    for idx in z3._data((start + steps) * gas)[start * gas:]:
        engine.backward(z3._loss(engine, idx))
        engine.step()


@pytest.mark.parametrize("ratio,param,precision,gas", [(0.3, "cpu", "fp32", 1), (0.7, "none", "fp32", 2),
                                                       (0.5, "cpu", "bf16", 2), (0.5, "cpu", "fp16", 1)])
def test_a_zero3_split_equals_the_cpu_step(ratio, param, precision, gas):
    ref, lr = z3._train(_cfg(1.0, param, precision, gas))
    e, le = z3._train(_cfg(ratio, param, precision, gas))
    path = e.optimizer_path
    assert type(path).__name__ == "StoreSplitPath" and path.dev is not None and path.cpu is not None
    sizes = [u.shard for gp in path.sm.plan.groups for u in gp.units]
    assert abs(path.cpu_share - ratio) <= max(sizes) / sum(sizes)  # whole units: as near as they allow
    assert z3._released(e) == []
    _near(z3._whole(e), z3._whole(ref)) if precision == "fp32" else z3._close(z3._whole(e), z3._whole(ref), precision)
    assert le == pytest.approx(lr, rel=1e-4 if precision == "fp32" else 2e-2, abs=1e-6 if precision == "fp32"
                               else 1e-3)
    assert e.get_global_grad_norm() == pytest.approx(ref.get_global_grad_norm(), rel=1e-4 if precision == "fp32"
                                                     else 5e-2)


def test_the_gpu_share_is_the_first_units_of_each_group():
    e, _ = z3._train(_cfg(0.5), steps=1)
    path = e.optimizer_path
    for gi, gp in enumerate(path.sm.plan.groups):
        k, k2 = path._ks[gi]
        sides = [s for s, _ in path._side_of[gi]]
        assert sides == ["dev"] * sides.count("dev") + ["cpu"] * sides.count("cpu")
        assert 0 <= k <= len(gp.units) and k2 == len(gp.units)  # two tiers: the CPU's runs to the end


def test_zero3_checkpoints_move_between_splits_and_plain_offload(tmp_path):
    a, _ = z3._train(_cfg(0.4), steps=3)
    a.save_checkpoint(str(tmp_path), tag="s")
    c, _ = z3._train(_cfg(1.0), steps=3)
    c.save_checkpoint(str(tmp_path), tag="c")
    want, _ = z3._train(_cfg(1.0), steps=5)
    want = z3._whole(want)
    for tag, ratio in (("s", 1.0), ("c", 0.4), ("s", 0.7), ("s", 0.4)):
        e, _ = z3._train(_cfg(ratio), steps=1)
        e.load_checkpoint(str(tmp_path), tag=tag)
        _go_on(e, 2, 3)
        _near(z3._whole(e), want)
    # The same split resumes bit for bit.
    b, _ = z3._train(_cfg(0.4), steps=1)
    b.load_checkpoint(str(tmp_path), tag="s")
    _go_on(b, 2, 3)
    whole, _ = z3._train(_cfg(0.4), steps=5)
    assert all(torch.equal(x, y) for x, y in zip(z3._whole(b).values(), z3._whole(whole).values()))


def test_zero3_split_with_8bit_states_and_its_checkpoints(tmp_path):
    if not eh.native_ops_available():
        pytest.skip("8-bit Adam states need libzspeed (the native CPU kernels)")
    a, _ = z3._train(_cfg(0.5, state_dtype="int8"), steps=3)
    path = a.optimizer_path
    assert {st["exp_avg"].dtype for st in path.cpu.optimizer.state.values()} == {torch.int8}
    assert {st["exp_avg"].dtype for st in path.dev.optimizer.state.values()} == {torch.float32}
    ref, _ = z3._train(_cfg(1.0, state_dtype="int8"), steps=3)
    z3._close(z3._whole(a), z3._whole(ref), "int8")  # the GPU's share keeps fp32 states: close, not equal
    a.save_checkpoint(str(tmp_path), tag="s")
    b, _ = z3._train(_cfg(0.5, state_dtype="int8"), steps=1)
    b.load_checkpoint(str(tmp_path), tag="s")
    _go_on(b, 2, 3)
    whole, _ = z3._train(_cfg(0.5, state_dtype="int8"), steps=5)
    assert all(torch.equal(x, y) for x, y in zip(z3._whole(b).values(), z3._whole(whole).values()))
    for cfg in (_cfg(1.0), _cfg(0.8, state_dtype="int8")):  # fp32 plain offload; another split
        e, _ = z3._train(cfg, steps=1)
        e.load_checkpoint(str(tmp_path), tag="s")
        _go_on(e, 2, 3)
        assert all(torch.isfinite(v).all() for v in z3._whole(e).values())


@pytest.mark.parametrize("overlap", [False, True])
def test_auto_at_zero3_sizes_the_split_after_step_1(monkeypatch, overlap):
    from zspeed.runtime import split
    limit = 10 << 30
    margin = max(split.MARGIN_MIN, int(split.MARGIN_FRACTION * limit))
    total = sum(p.numel() for p in z3.Model().parameters())
    monkeypatch.setattr(split, "device_memory", lambda device: (limit, limit - margin - 8 * total))  # half fits
    monkeypatch.setattr(split, "measure_rates", lambda *a, **k: (None, None))
    e, _ = z3._train(_cfg("auto", overlap=overlap), steps=1)
    path = e.optimizer_path
    assert type(path).__name__ == "StoreSplitPath" and path.dev is not None and 0.2 < path.cpu_share < 0.8
    if overlap:
        assert path.cpu.sharded.fetcher._gate is not None  # the new CPU half's runner gates the gathers
    _go_on(e, 3, 1)
    ref, _ = z3._train(_cfg(1.0, overlap=overlap), steps=4)
    _near(z3._whole(e), z3._whole(ref))


# -- several ranks ---------------------------------------------------------------------------------
def _z3_ranks(n, ratio, tmp, tag, precision="fp32", gas=1, **kw):
    cfg = dict(_cfg(ratio, precision=precision, gas=gas), train_micro_batch_size_per_gpu=6 // n)
    return z3._ranks(n, cfg, tmp, tag, **kw)


@pytest.mark.skipif(not ON_CPU, reason="the multi-rank cases run on the CPU (Gloo)")
@pytest.mark.parametrize("n,ratio,precision,gas", [(2, 0.5, "fp32", 1), (3, 0.3, "bf16", 2)])
def test_zero3_split_on_ranks_equals_plain_offload(tmp_path, n, ratio, precision, gas):
    ref = _z3_ranks(n, 1.0, tmp_path, "ref", precision, gas)
    got = _z3_ranks(n, ratio, tmp_path, "split", precision, gas)
    for o, r in zip(got, ref):
        assert o["released"] == []
        _near(o["state"], r["state"]) if precision == "fp32" else z3._close(o["state"], r["state"], precision)
    for o in got[1:]:
        assert all(torch.equal(o["state"][k], got[0]["state"][k]) for k in o["state"])


@pytest.mark.skipif(not ON_CPU, reason="the multi-rank cases run on the CPU (Gloo)")
def test_a_zero3_split_checkpoint_moves_across_world_sizes(tmp_path):
    saved = _z3_ranks(2, 0.5, tmp_path, "save", save=str(tmp_path / "ck"))
    loaded = _z3_ranks(3, 0.3, tmp_path, "load", steps=1, load=str(tmp_path / "ck"))
    for o in loaded:
        z3._close(o["state"], saved[0]["state"], "fp32")  # the saved weights (one more step: close)
    e, _ = z3._train(_cfg(1.0), steps=1)  # and into one process without a split
    e.load_checkpoint(tmp_path / "ck", tag="t")
    z3._close(z3._whole(e), saved[0]["state"], "fp32")


def _dp_cfg(stage, ratio, precision="fp32", overlap=False, gas=1, mb=3):
    c = dp._cfg(stage, "cpu", precision, gas=gas, clip=0.5, mb=mb)
    c["zero_optimization"].update(reduce_bucket_size=300, sub_group_size=150)  # several units, chunks
    if stage == 3:
        c["zero_optimization"].update(offload_param={"device": "cpu"}, stage3_param_persistence_threshold=40)
    c["zero_optimization"]["offload_optimizer"].update(ratio=ratio, overlap_forward=overlap)
    return c


@pytest.mark.skipif(not ON_CPU, reason="the multi-rank cases run on the CPU (Gloo)")
@pytest.mark.parametrize("stage,precision", [(1, "fp32"), (2, "bf16"), (3, "fp32")])
def test_split_on_ranks_equals_plain_offload_and_overlaps_exactly(tmp_path, stage, precision):
    """Stages 1-3 on 2 ranks: the split equals ratio 1 (to the split's tolerance); with
    overlap_forward (the CPU step slowed down so that the next forward runs ahead of it) it
    equals the synchronous split bit for bit."""
    kw = dict(groups=True)
    ref = dp._run(2, _dp_cfg(stage, 1.0, precision), tmp_path, "ref", **kw)
    sync = dp._run(2, _dp_cfg(stage, 0.5, precision), tmp_path, "sync", **kw)
    over = dp._run(2, _dp_cfg(stage, 0.5, precision, overlap=True), tmp_path, "over", slow_step=0.02, **kw)
    tol = dict(rtol=1e-5, atol=1e-6) if precision == "fp32" else dict(rtol=2e-2, atol=2e-2)
    for r, s, o in zip(ref, sync, over):
        dp._close(s, r, **tol)
        assert s["norms"] == o["norms"]
        assert all(torch.equal(s["state"][k], o["state"][k]) for k in s["state"]), "overlap changed a bit"


@pytest.mark.skipif(not ON_CPU, reason="the multi-rank cases run on the CPU (Gloo)")
def test_an_fp16_overflow_on_one_rank_skips_the_split_step_everywhere(tmp_path):
    ref = dp._run(2, _dp_cfg(3, 1.0, "fp16"), tmp_path, "ref", inf_at=[2])
    got = dp._run(2, _dp_cfg(3, 0.5, "fp16", overlap=True), tmp_path, "split", inf_at=[2], slow_step=0.01)
    for r, g in zip(ref, got):
        assert g["skipped"] == r["skipped"] == 1 and g["applied"] == r["applied"]
        assert g["loss_scale"] == r["loss_scale"]
        dp._close(g, r, rtol=2e-2, atol=2e-2)


def test_the_trace_shows_each_half_and_the_forwards_waits(tmp_path):
    """The Chrome trace of a ZeRO-3 split with overlap_forward: the GPU half's step, the CPU
    half's chunks on the step's own thread, and the forward's waits for stepped shards."""
    import json
    cfg = _cfg(0.5, overlap=True, sub_group_size=200)
    cfg["zspeed_trace"] = str(tmp_path / "t.json")
    e, _ = z3._train(cfg, steps=3)
    e.close()
    doc = json.loads((tmp_path / "t.json").read_text())
    spans = [ev for ev in doc["traceEvents"] if ev["ph"] == "X"]
    names = {ev["name"] for ev in spans}
    assert {"gpu step (split)", "gpu half: AdamW and new weights", "cpu step (overlapped)"} <= names, names
    tid = {ev["name"]: ev["tid"] for ev in spans}
    assert tid["cpu step (overlapped)"] != tid["forward"]  # the CPU half on its own thread


@pytest.mark.skipif(not ON_CPU, reason="the multi-rank cases run on the CPU (Gloo)")
def test_zero3_overlap_without_a_split_on_ranks_is_exact(tmp_path):
    """overlap_forward at ZeRO-3 on 2 ranks (ratio 1): every rank's gathers wait for its own
    shards, prefetches included, so all issue the same all-gathers; bit for bit the synchronous step."""
    sync = dp._run(2, _dp_cfg(3, 1.0), tmp_path, "sync", groups=True)
    over = dp._run(2, _dp_cfg(3, 1.0, overlap=True), tmp_path, "over", groups=True, slow_step=0.02)
    for s, o in zip(sync, over):
        assert s["norms"] == o["norms"]
        assert all(torch.equal(s["state"][k], o["state"][k]) for k in s["state"])


@pytest.mark.parametrize("state_dtype,precision", [("int8", "bf16"), ("fp32", "fp32")])
def test_a_smaller_cpu_share_moves_without_new_host_memory(tmp_path, state_dtype, precision):
    """resize() to a smaller CPU share (what "auto" does after step 1): the new CPU half takes over
    the old one's buffers and optimizer states, the moving pieces go to the GPU one by one. The
    run then equals, bit for bit, a run at the final ratio loaded from a checkpoint of the moment."""
    if state_dtype == "int8" and not eh.native_ops_available():
        pytest.skip("8-bit Adam states need libzspeed (the native CPU kernels)")
    a, _ = z3._train(_cfg(0.9, precision=precision, state_dtype=state_dtype), steps=2)
    a.save_checkpoint(str(tmp_path), tag="two")
    path = a.optimizer_path
    before = [f.data_ptr() for f in path.buffers._flats]
    states = {id(st) for st in path.cpu.optimizer.state.values()}
    assert path._shrinks(0.4) and path.resize_host_bytes(0.4) < 1 << 20
    path.resize(0.4)
    assert path.dev is not None and path.cpu_share < 0.9
    spans = [(p, p + f.numel() * f.element_size()) for p, f in zip(before, path.buffers._donor._flats)]
    assert all(any(lo <= f.data_ptr() < hi for lo, hi in spans) for f in path.buffers._flats)  # tails of the old
    assert {id(st) for st in path.cpu.optimizer.state.values()} <= states  # the same state objects
    _go_on(a, 3, 2)
    b, _ = z3._train(_cfg(0.4, precision=precision, state_dtype=state_dtype), steps=1)
    b.load_checkpoint(str(tmp_path), tag="two")
    _go_on(b, 3, 2)
    assert all(torch.equal(x, y) for x, y in zip(z3._whole(a).values(), z3._whole(b).values()))
    # And back up (a larger CPU share): the general move.
    assert not path._shrinks(0.95)
    path.resize(0.95)
    _go_on(a, 1, 5)
    assert all(torch.isfinite(v).all() for v in z3._whole(a).values())


def test_a_split_whose_gpu_share_cannot_fit_is_refused_before_allocating(monkeypatch):
    """An explicit ratio whose GPU share (fp32 masters, moments and gradients: 16 bytes per
    element) exceeds what the process may use on the GPU is refused at start with the numbers,
    before anything is allocated; "auto" starts (its first step is all on the CPU)."""
    from zspeed.runtime import memory
    from zspeed.runtime.config import ConfigError
    n = sum(p.numel() for p in z3.Model().parameters())
    seen = []
    real = memory.check_gpu_memory

    def check(need, *a, **k):
        seen.append(dict(need))
        return real(need, *a, **k)
    monkeypatch.setattr(memory, "check_gpu_memory", check)
    monkeypatch.setattr(memory, "gpu_room", lambda dev: 1 << 40)
    zspeed.initialize(model=z3.Model(), config=_cfg(1.0))[0].close()
    base = sum(seen[-1].values())  # the working set of gathered parameters
    monkeypatch.setattr(memory, "gpu_room", lambda dev: base + 8 * n)  # room for about half the share
    with pytest.raises(ConfigError, match=r"this process may use .* Nothing was allocated"):
        zspeed.initialize(model=z3.Model(), config=_cfg(0.2))
    need = seen[-1]
    share = need["fp32 masters and Adam moments of the GPU's share"] // 12
    assert need["fp32 gradients of the GPU's share"] == 4 * share and share >= 0.75 * n
    e, *_ = zspeed.initialize(model=z3.Model(), config=_cfg("auto"))  # "auto" asks for no GPU share at start
    assert "fp32 gradients of the GPU's share" not in seen[-1] or seen[-1]["fp32 gradients of the GPU's share"] == 0
    e.close()


# -- the GPU/NVMe split: the non-GPU share's masters and state in swap files ------------------------
def _nv(ratio, tmp, precision="fp32", state_dtype="fp32", **kw):
    c = _cfg(ratio, precision=precision, state_dtype=state_dtype, **kw)
    c["zero_optimization"]["offload_optimizer"].update(device="nvme", nvme_path=str(tmp))
    return c


@pytest.mark.parametrize("precision,state_dtype", [("fp32", "fp32"), ("bf16", "int8")])
def test_the_nvme_share_steps_exactly_as_the_host_share(tmp_path, precision, state_dtype):
    """offload_optimizer.device "nvme" with a ratio at ZeRO-3: the GPU steps its units, the NVMe
    swapper the rest with the CPU path's kernels, so the run equals the GPU/CPU split bit for bit."""
    if state_dtype == "int8" and not eh.native_ops_available():
        pytest.skip("8-bit Adam states need libzspeed (the native CPU kernels)")
    a, la = z3._train(_nv(0.5, tmp_path, precision, state_dtype), steps=3)
    path = a.optimizer_path
    assert type(path).__name__ == "StoreSplitPath" and type(path.cpu).__name__ == "NVMePath"
    assert any(n.endswith(".swap") for n in os.listdir(tmp_path))  # the NVMe share's masters and state
    n = sum(p.numel() for p in z3.Model().parameters())  # the start-up check counted the share the ratio gives
    per = {"fp32": 12, "int8": 6}[state_dtype]             # the disk: fp32 masters + moments, in two slots
    assert sum(a.memory_needs["nvme"].values()) == pytest.approx(2 * per * n * 0.5, rel=0.02)
    b, lb = z3._train(_cfg(0.5, precision=precision, state_dtype=state_dtype), steps=3)
    assert la == lb
    wa, wb = z3._whole(a), z3._whole(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    a.close()
    assert not any(n.endswith(".swap") for n in os.listdir(tmp_path))


def test_nvme_split_checkpoints_move_to_the_host_split_and_plain_nvme(tmp_path):
    swap = tmp_path / "swap"
    swap.mkdir()
    a, _ = z3._train(_nv(0.5, swap), steps=3)
    a.save_checkpoint(str(tmp_path / "ck"), tag="s")
    want, _ = z3._train(_cfg(0.5), steps=5)
    want = z3._whole(want)
    for cfg in (_cfg(0.5), _nv(0.5, swap), _nv(1.0, swap), _nv(0.7, swap)):
        e, _ = z3._train(cfg, steps=1)
        e.load_checkpoint(str(tmp_path / "ck"), tag="s")
        _go_on(e, 2, 3)
        _near(z3._whole(e), want)
        e.close()


@pytest.mark.skipif(not ON_CPU, reason="the multi-rank cases run on the CPU (Gloo)")
def test_the_nvme_split_on_ranks_equals_the_host_split(tmp_path):
    swap = tmp_path / "swap"
    swap.mkdir()
    cfg = dict(_nv(0.5, swap), train_micro_batch_size_per_gpu=3)
    got = z3._ranks(2, cfg, tmp_path, "nvme")
    ref = _z3_ranks(2, 0.5, tmp_path, "host")
    for g, r in zip(got, ref):
        assert all(torch.equal(g["state"][k], r["state"][k]) for k in g["state"])


def test_the_nvme_split_is_refused_where_it_cannot_run(tmp_path):
    from zspeed.runtime.config import ConfigError
    with pytest.raises(ConfigError, match=r"takes a number here, not \"auto\".*zspeed plan"):
        zspeed.initialize(model=z3.Model(), config=_nv("auto", tmp_path))


# -- three tiers: GPU, host memory (offload_optimizer.max_in_cpu) and NVMe in one path ---------------
def _n_elems():
    return sum(p.numel() for p in z3.Model().parameters())


def _tiers(ratio, tmp, max_in_cpu, **kw):
    c = _nv(ratio, tmp, **kw)
    c["zero_optimization"]["offload_optimizer"]["max_in_cpu"] = max_in_cpu
    return c


def _same_bits(a, b):
    wa, wb = z3._whole(a), z3._whole(b)
    bad = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not bad, f"differ: {bad[:4]}"


@pytest.mark.parametrize("ratio,precision,state_dtype", [(0.6, "fp32", "fp32"), (0.6, "bf16", "int8"),
                                                         (1.0, "fp32", "fp32")])
def test_three_tiers_step_exactly_as_the_host_split(tmp_path, ratio, precision, state_dtype):
    """ratio gives the GPU its units, max_in_cpu the next ones to host memory, the rest go to the
    NVMe swap files: the same kernels on the same elements as the GPU/CPU split (or, at ratio 1,
    plain CPU offload), so the weights are equal bit for bit."""
    if state_dtype == "int8" and not eh.native_ops_available():
        pytest.skip("8-bit Adam states need libzspeed (the native CPU kernels)")
    n = _n_elems()
    a, la = z3._train(_tiers(ratio, tmp_path, n // 4, precision=precision, state_dtype=state_dtype), steps=3)
    path = a.optimizer_path
    assert type(path.cpu).__name__ == "HostPath" and type(path.disk).__name__ == "NVMePath"
    assert (path.dev is not None) == (ratio < 1)
    assert 0 < path.kept_in_cpu <= n // 4
    assert any(f.endswith(".swap") for f in os.listdir(tmp_path))
    per = {"fp32": 12, "int8": 6}[state_dtype]  # the disk: fp32 masters + moments of what max_in_cpu leaves
    on_disk = int(n * path.cpu_share) - path.kept_in_cpu  # of the elements the start-up check counts
    assert sum(a.memory_needs["nvme"].values()) == pytest.approx(2 * per * on_disk, rel=0.02)  # two slots
    assert a.memory_needs["host"]["fp32 masters (max_in_cpu)"] == 4 * path.kept_in_cpu
    b, lb = z3._train(_cfg(ratio, precision=precision, state_dtype=state_dtype), steps=3)
    assert la == lb
    _same_bits(a, b)
    a.close()
    assert not any(f.endswith(".swap") for f in os.listdir(tmp_path))


def test_max_in_cpu_past_the_share_keeps_it_all_in_host_memory(tmp_path):
    n = _n_elems()
    a, _ = z3._train(_tiers(0.5, tmp_path, 10 * n), steps=2)
    path = a.optimizer_path
    assert type(path.cpu).__name__ == "HostPath" and path.disk is None
    assert not any(f.endswith(".swap") for f in os.listdir(tmp_path))
    b, _ = z3._train(_cfg(0.5), steps=2)
    _same_bits(a, b)
    from zspeed.runtime.summary import summary_text
    assert re.search(r"tiers \.+ of this rank's [\d.]+K elements, masters and state: [\d.]+K on the (cpu|GPU), "
                     r"[\d.]+K in host memory \(max_in_cpu [\d,]+\), 0 on NVMe", summary_text(a))


def test_three_tier_checkpoints_move_to_every_other_layout(tmp_path):
    swap = tmp_path / "swap"
    swap.mkdir()
    n = _n_elems()
    a, _ = z3._train(_tiers(0.6, swap, n // 4), steps=3)
    a.save_checkpoint(str(tmp_path / "ck"), tag="s")
    want, _ = z3._train(_cfg(0.6), steps=5)
    want = z3._whole(want)
    for cfg in (_cfg(0.6), _cfg(1.0), _nv(1.0, swap), _nv(0.3, swap), _tiers(1.0, swap, n // 2),
                _tiers(0.6, swap, n // 3)):
        e, _ = z3._train(cfg, steps=1)
        e.load_checkpoint(str(tmp_path / "ck"), tag="s")
        _go_on(e, 2, 3)
        _near(z3._whole(e), want)
        e.close()
    # ... and a host split's checkpoint loads into three tiers
    b, _ = z3._train(_cfg(0.5), steps=3)
    b.save_checkpoint(str(tmp_path / "ck2"), tag="s")
    e, _ = z3._train(_tiers(0.6, swap, n // 4), steps=1)
    e.load_checkpoint(str(tmp_path / "ck2"), tag="s")
    _go_on(e, 2, 3)
    _near(z3._whole(e), z3._whole(z3._train(_cfg(0.5), steps=5)[0]))
    e.close()


def test_an_io_fault_in_the_nvme_tier_leaves_a_step_the_next_call_completes(tmp_path):
    """The GPU's and the host's shares step, the NVMe tier's write fails: the step is not counted,
    the next backward is refused, and step() again steps only the NVMe tier (not the others twice),
    so the run goes on exactly as without the fault."""
    if not eh.native_ops_available():
        pytest.skip("fault injection is libzspeed's (zs_fault_set)")
    from zspeed import NativeError
    from zspeed._native import errcode, lib
    from zspeed.runtime.engine import StepIncompleteError
    n = _n_elems()
    ref, _ = z3._train(_tiers(0.6, tmp_path, n // 4), steps=4)
    e, _ = z3._train(_tiers(0.6, tmp_path, n // 4), steps=2)
    data = z3._data(4)
    e.backward(z3._loss(e, data[2]))
    lib.zs_fault_set(b"swap.write", 1, 1, errcode("ZS_EIO"))  # the NVMe tier's first partition write
    try:
        with pytest.raises(NativeError):
            e.step()
    finally:
        lib.zs_fault_clear()
    assert e.global_steps == 2
    with pytest.raises(StepIncompleteError):
        e.backward(z3._loss(e, data[3]))
    e.step()
    assert e.global_steps == 3
    e.backward(z3._loss(e, data[3]))
    e.step()
    _same_bits(e, ref)
    ref.close()
    e.close()


@pytest.mark.skipif(not ON_CPU, reason="the multi-rank cases run on the CPU (Gloo)")
def test_three_tiers_on_ranks_equal_the_host_split(tmp_path):
    swap = tmp_path / "swap"
    swap.mkdir()
    cfg = dict(_tiers(0.5, swap, _n_elems() // 8), train_micro_batch_size_per_gpu=3)
    got = z3._ranks(2, cfg, tmp_path, "tiers")
    ref = _z3_ranks(2, 0.5, tmp_path, "host")
    for g, r in zip(got, ref):
        assert all(torch.equal(g["state"][k], r["state"][k]) for k in g["state"])


def test_max_in_cpu_is_refused_where_it_cannot_run(tmp_path):
    from zspeed.runtime.config import ConfigError
    c = _cfg(0.5)
    c["zero_optimization"]["offload_optimizer"]["max_in_cpu"] = 1000
    with pytest.raises(ConfigError, match=r"max_in_cpu needs offload_optimizer.device \"nvme\" .*Remove the key"):
        zspeed.initialize(model=z3.Model(), config=c)
    c = _tiers(0.5, tmp_path, -1)
    with pytest.raises(ConfigError, match=r"max_in_cpu.*must be a whole number of elements from 0"):
        zspeed.initialize(model=z3.Model(), config=c)


@pytest.mark.parametrize("stage,precision", [(1, "fp32"), (2, "bf16")])
def test_the_nvme_split_and_three_tiers_run_at_stages_1_2_on_one_rank(tmp_path, stage, precision):
    """An offloaded optimizer steps a store on one rank too (shard degree 1, one parameter per
    unit), so the GPU/NVMe split and max_in_cpu run at stages 1-2 on one rank (until the one-rank
    store they were refused there): each equals the GPU/CPU split of the same ratio bit for bit."""
    n = _n_elems()

    def cfg(**off):
        c = z3._cfg(stage, opt="cpu", precision=precision)
        c["zero_optimization"]["offload_optimizer"].update(ratio=0.6, **off)
        return c
    ref, lr = z3._train(cfg(), steps=3)
    assert type(ref.optimizer_path).__name__ == "StoreSplitPath" and ref.plan.shard_degree == 1
    for extra in ({}, {"max_in_cpu": n // 4}):
        a, la = z3._train(cfg(device="nvme", nvme_path=str(tmp_path), **extra), steps=3)
        path = a.optimizer_path
        assert path.dev is not None and (path.disk is not None) == bool(extra)
        assert type(path.disk or path.cpu).__name__ == "NVMePath"
        assert any(f.endswith(".swap") for f in os.listdir(tmp_path))
        assert la == lr
        _same_bits(a, ref)
        a.close()
