"""ZeRO-3's gradients in the host parameter shards (offload_param.grads_in_shards, on by default
where it applies: docs/ZERO3.md): the boundary's reduced gradients land in the shards, the CPU
kernel turns them into the new weights in place, and no separate host gradient buffer exists.

Every case is compared with the same run keeping a separate gradient buffer
(``grads_in_shards`` false): the arithmetic is the same kernel on the same values, so the
results must be equal bit for bit (no tolerance)."""
from __future__ import annotations

import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402
import test_zero3 as z3  # noqa: E402

import zspeed  # noqa: E402


def _cfg(precision="bf16", on=True, gas=1, state_dtype=None, overlap=False, **zero):
    c = z3._cfg(3, opt="cpu", param="cpu", precision=precision, gas=gas, **zero)
    c["zero_optimization"]["offload_param"]["grads_in_shards"] = on
    c["zero_optimization"]["offload_optimizer"]["overlap_forward"] = overlap
    if state_dtype:
        c["optimizer"]["params"]["state_dtype"] = state_dtype
    return c


def _equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _in_shards(engine) -> bool:
    """Whether the engine's host gradient buffers are its parameter shards."""
    buf = engine.optimizer_path.buffers
    return all(g.data_ptr() == f.data_ptr() for g, f in zip(buf.flat_grads, buf.sm.flat))


@pytest.mark.parametrize("precision,state_dtype,overlap", [("bf16", None, False), ("fp16", None, False),
                                                          ("bf16", "int8", False), ("bf16", None, True)])
def test_training_equals_a_separate_gradient_buffer_bit_for_bit(precision, state_dtype, overlap):
    ref, lr = z3._train(_cfg(precision, False, state_dtype=state_dtype, overlap=overlap), steps=5)
    e, le = z3._train(_cfg(precision, True, state_dtype=state_dtype, overlap=overlap), steps=5)
    assert _in_shards(e) and not _in_shards(ref)
    assert le == lr
    _equal(z3._whole(e), z3._whole(ref))  # (which waits for a step in the background)
    assert e.optimizer_path.buffers.grads_in.held == set()  # between steps the shards hold weights
    assert e.get_global_grad_norm() == ref.get_global_grad_norm()
    # The memory the estimate no longer counts is really not allocated.
    assert "gradients" not in e.memory_needs["host"] and "gradients" in ref.memory_needs["host"]


def test_an_overflow_skip_puts_the_weights_back_from_the_masters():
    cfg = _cfg("fp16")
    cfg["fp16"]["initial_scale_power"] = 30  # the first steps overflow and are skipped
    ref, lr = z3._train(dict(cfg, zero_optimization={**cfg["zero_optimization"], "offload_param": {
        **cfg["zero_optimization"]["offload_param"], "grads_in_shards": False}}), steps=4)
    e, le = z3._train(cfg, steps=4)
    assert e.skipped_steps == ref.skipped_steps >= 1
    buf = e.optimizer_path.buffers
    assert buf.grads_in.held == set()  # the skipped steps' gradients were replaced by the weights
    for gi, f in enumerate(buf.sm.flat):
        assert torch.equal(f, _all_masters(buf.grads_in, gi, f.numel()).to(f.dtype))
    assert le == lr
    _equal(z3._whole(e), z3._whole(ref))


def _all_masters(grads_in, gi: int, n: int) -> torch.Tensor:
    """Group gi's fp32 masters over its whole local space, read through the readers the paths gave."""
    out = torch.full((n,), float("nan"))
    for (lo, hi), read in grads_in.masters[gi].items():
        out[lo:hi] = read(lo, hi - lo, {})
    assert not out.isnan().any()
    return out


def _backward_only(engine, idx):
    loss = z3._loss(engine, idx)
    engine.backward(loss)
    return loss.item()


def test_reads_between_backward_and_step_see_the_weights_and_change_nothing():
    torch.manual_seed(0)
    ref, _ = z3._train(_cfg(on=False), steps=3)
    e, _ = z3._train(_cfg(), steps=2)
    data = z3._data(3)
    before = z3._whole(e)
    with torch.no_grad():
        eval_before = z3._loss(e, data[0]).item()
    _backward_only(e, data[2])
    assert e.optimizer_path.buffers.grads_in.held  # the shards hold gradients now
    _equal(z3._whole(e), before)                    # GatheredParameters reads the weights
    with torch.no_grad():                           # and so does a forward
        assert z3._loss(e, data[0]).item() == eval_before
    e.step()
    _equal(z3._whole(e), z3._whole(ref))


def test_a_second_backward_before_the_step_accumulates_as_with_a_buffer():
    out = []
    for on in (False, True):
        e, _ = z3._train(_cfg(on=on), steps=1)
        data = z3._data(3)
        _backward_only(e, data[1])
        _backward_only(e, data[2])  # reads the held units' weights from the masters
        e.step()
        out.append(z3._whole(e))
    _equal(out[1], out[0])


def test_edits_between_backward_and_step_are_refused_and_lose_nothing(tmp_path):
    ref, _ = z3._train(_cfg(on=False), steps=3)
    e, _ = z3._train(_cfg(), steps=2)
    e.save_checkpoint(tmp_path, tag="s")
    _backward_only(e, z3._data(3)[2])
    w = e.module.emb.weight
    with pytest.raises(RuntimeError, match=r"between backward and step.*grads_in_shards false"):
        with zspeed.zero.GatheredParameters([w], modifier_rank=0):
            w.data.fill_(1.0)
    with pytest.raises(RuntimeError, match=r"between backward and step.*Call engine.step\(\) first"):
        e.load_checkpoint(tmp_path, tag="s")
    e.step()  # the gradients were kept: the step is the one of a run without the attempt
    _equal(z3._whole(e), z3._whole(ref))


def test_a_step_failing_partway_is_completed_or_abandoned_as_with_a_buffer(tmp_path, monkeypatch):
    """sub_group_size cuts the CPU step into chunks; the second chunk's kernel fails once. A
    forward then sees the torn step's weights (its first chunk stepped, the rest not) as with a
    buffer, a retry completes the step (each chunk stepped once), and an abandoned step
    (load_checkpoint) leaves every shard holding weights again."""
    from zspeed.runtime.optimizers import HostOptimizer
    real = HostOptimizer.step
    results = {}
    for on in (False, True):
        for how in ("retry", "abandon"):
            e, _ = z3._train(_cfg(on=on, sub_group_size=300), steps=2)
            assert len(e.optimizer_path.chunks) > 2
            e.save_checkpoint(tmp_path / f"{on}{how}", tag="s")
            calls = []

            def failing(self, *a, **k):
                calls.append(1)
                if len(calls) == 2:
                    raise RuntimeError("injected kernel failure")
                return real(self, *a, **k)
            monkeypatch.setattr(HostOptimizer, "step", failing)
            _backward_only(e, z3._data(3)[2])
            with pytest.raises(RuntimeError, match="injected"):
                e.step()
            results[on, how, "torn"] = z3._loss(e, z3._data(3)[0]).item()  # a training forward, no backward
            if how == "retry":
                e.step()
            else:
                e.load_checkpoint(tmp_path / f"{on}{how}", tag="s")
            monkeypatch.setattr(HostOptimizer, "step", real)
            if on:
                assert e.optimizer_path.buffers.grads_in.held == set()
            _backward_only(e, z3._data(4)[3])
            e.step()
            results[on, how] = z3._whole(e)
    for how in ("retry", "abandon"):
        _equal(results[True, how], results[False, how])
        assert results[True, how, "torn"] == results[False, how, "torn"]


def test_where_it_does_not_apply_a_separate_buffer_is_kept():
    for cfg in (_cfg(gas=2), _cfg("fp32"), dict(_cfg(), zero_optimization={**_cfg()["zero_optimization"],
                                                                           "offload_param": {"device": "none"}})):
        e = zspeed.initialize(model=z3.Model(), config=cfg)[0]
        assert not e.optimizer_path.buffers.__dict__.get("grads_in"), cfg


@pytest.mark.skipif(z3.DEVICE != "cpu", reason="the multi-rank cases run on the CPU (Gloo)")
def test_two_ranks_equal_a_separate_gradient_buffer(tmp_path):
    outs = {}
    for on in (False, True):
        cfg = dict(_cfg(on=on), train_micro_batch_size_per_gpu=3)
        outs[on] = z3._ranks(2, cfg, tmp_path, f"g{on}")
    for r in range(2):
        _equal(outs[True][r]["state"], outs[False][r]["state"])


def _split(ratio, **kw):
    c = _cfg(**kw)
    c["zero_optimization"]["offload_optimizer"]["ratio"] = ratio
    return c


@pytest.mark.parametrize("precision,overlap", [("bf16", False), ("fp16", False), ("bf16", True)])
def test_a_gpu_cpu_split_lands_the_cpu_share_in_the_shards_bit_for_bit(precision, overlap):
    """With ratio < 1 (the "GPU" half runs on the CPU here, tests/gpu on CUDA) the CPU share's
    gradients land in its shards, the GPU share's in its own fp32 buffer; the GPU's units never
    count as held, so their weights are read from the shards."""
    runs = {}
    for on in (False, True):
        cfg = _split(0.5, precision=precision, on=on, overlap=overlap)
        if precision == "fp16":
            cfg["fp16"]["initial_scale_power"] = 30  # overflow skips first
        e, losses = z3._train(cfg, steps=5)
        runs[on] = (e, losses, z3._whole(e))
    (ref, lr, wr), (e, le, we) = runs[False], runs[True]
    path = e.optimizer_path
    assert type(path).__name__ == "StoreSplitPath" and path.dev is not None
    grads = path.buffers.flat_grads
    assert all(any(g.data_ptr() >= f.data_ptr() and g.data_ptr() < f.data_ptr() + f.numel() * f.element_size()
                   for f in path.sm.flat) for g in grads)  # the CPU half's gradient buffers are in the shards
    assert path.grads_in.held == set() and e.skipped_steps == ref.skipped_steps
    assert le == lr
    _equal(we, wr)


def test_a_split_that_moves_keeps_the_gradients_in_the_shards():
    """resize() as "auto" does it (a smaller CPU share, taking over the old half's buffers), then
    back up (the general move): each equals the run with a gradient buffer."""
    out = {}
    for on in (False, True):
        e, _ = z3._train(_split(0.9, on=on), steps=2)
        e.optimizer_path.resize(0.4)
        for idx in z3._data(6)[2:4]:
            e.backward(z3._loss(e, idx))
            e.step()
        e.optimizer_path.resize(0.95)
        for idx in z3._data(6)[4:6]:
            e.backward(z3._loss(e, idx))
            e.step()
        out[on] = z3._whole(e)
        if on:
            assert e.optimizer_path.grads_in is not None and e.optimizer_path.buffers.grads_in is not None
    _equal(out[True], out[False])


# -- offload_optimizer nvme: the swappers step the shards in place, resumably -----------------------
def _nvme(tmp, precision="bf16", on=True, state_dtype=None, **zero):
    """The fp32 masters and Adam's state in swap files under ``tmp``; sub_group_size 300 cuts each
    group into several swapper partitions, so that a fault can stop a step between them."""
    c = _cfg(precision, on, state_dtype=state_dtype, sub_group_size=300, **zero)
    c["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": str(tmp), "pin_memory": True}
    return c


def _shards_are_the_outs(engine) -> bool:
    path = engine.optimizer_path
    return all(o.data_ptr() == f.data_ptr() for o, f in zip(path._out_flat, path.buffers.sm.flat))


@pytest.mark.parametrize("precision,state_dtype", [("bf16", None), ("fp16", None), ("bf16", "int8")])
def test_nvme_optimizer_steps_the_shards_as_host_offload_bit_for_bit(tmp_path, precision, state_dtype):
    """With the optimizer on NVMe the gradients land in the shards and the swappers write the new
    weights there too: host memory holds neither a gradient buffer nor a weight buffer, and the
    run equals offload_optimizer cpu with a separate gradient buffer bit for bit (fp16: with the
    overflow skips of a huge initial scale, whose weights come back from the masters on disk)."""
    def cfg(c):
        if precision == "fp16":
            c["fp16"]["initial_scale_power"] = 30
        return c
    ref, lr = z3._train(cfg(_cfg(precision, False, state_dtype=state_dtype, sub_group_size=300)), steps=5)
    runs = {on: z3._train(cfg(_nvme(tmp_path, precision, on, state_dtype)), steps=5) for on in (False, True)}
    for on, (e, le) in runs.items():
        assert le == lr and e.skipped_steps == ref.skipped_steps
        assert e.skipped_steps >= (1 if precision == "fp16" else 0)
        _equal(z3._whole(e), z3._whole(ref))
        assert _shards_are_the_outs(e) and _in_shards(e) == on
        host = e.memory_needs["host"]
        assert "weights out" not in host and ("gradients" in host) != on
    e = runs[True][0]
    assert len(e.optimizer_path.swappers[0].sizes) > 2 and e.optimizer_path.buffers.grads_in.held == set()
    for sw in e.optimizer_path.swappers:  # compact swap files: each slot once, plus per slot size
        slots = [-(-len(sw.read_image(i)) // 4096) * 4096 for i in range(len(sw.sizes))]  # min(count, 4) spares
        spares = sum(min(slots.count(b), 4) * b for b in set(slots))
        assert sw.compact and os.path.getsize(sw.file_path) == sw.file_bytes == sum(slots) + spares
    for gi, f in enumerate(e.optimizer_path.buffers.sm.flat):  # the shards are the masters rounded
        assert torch.equal(f, _all_masters(e.optimizer_path.buffers.grads_in, gi, f.numel()).to(f.dtype))


@pytest.mark.parametrize("site,n,err", [("swap.write", 2, "ZS_EIO"), ("swap.read", 3, "ZS_EIO"),
                                        ("swap.write", 3, "ZS_ENOSPC")])
def test_an_nvme_fault_mid_step_is_completed_or_abandoned_with_the_gradients_in_the_shards(tmp_path, site, n,
                                                                                          err):
    """A write or read of the step's n-th swap partition fails: the swapper has stepped (and
    overwritten in the shards) the gradients of the partitions before it. step() again -- or the
    next forward, which completes a step under way before it reads the weights -- completes the
    step, stepping every partition once, and the run equals one that never failed; an abandoned
    step (load_checkpoint) returns every partition to the last step and every shard to its
    weights, and training on from the checkpoint equals the same run."""
    if not eh.native_ops_available():
        pytest.skip("fault injection is libzspeed's (zs_fault_set)")
    from zspeed import NativeError
    from zspeed._native import errcode, lib
    ref, _ = z3._train(_cfg(on=False, sub_group_size=300), steps=2)
    for idx in z3._data(4)[2:]:
        _backward_only(ref, idx)
        ref.step()
    refw = z3._whole(ref)
    for on in (False, True):
        for how in ("retry", "forward", "abandon"):
            swap = tmp_path / f"{on}{how}"
            swap.mkdir()
            e, _ = z3._train(_nvme(swap, on=on), steps=2)
            e.save_checkpoint(tmp_path / f"ck{on}{how}", tag="s")
            _backward_only(e, z3._data(4)[2])
            lib.zs_fault_set(site.encode(), n, 1, errcode(err))
            try:
                with pytest.raises(NativeError, match="stopped partway"):
                    e.step()
            finally:
                lib.zs_fault_clear()
            sw = e.optimizer_path.swappers[0]
            assert e.global_steps == 2 and sw.incomplete_step == 3 and sw.steps == 2
            if on:
                assert e.optimizer_path.buffers.grads_in.held  # the partitions not stepped yet
            if how == "retry":
                e.step()
            elif how == "forward":
                with torch.no_grad():
                    z3._loss(e, z3._data(4)[0])
            else:
                e.load_checkpoint(tmp_path / f"ck{on}{how}", tag="s")
                assert sw.incomplete_step == 0 and sw.steps == 2
                if on:
                    assert e.optimizer_path.buffers.grads_in.held == set()
                _backward_only(e, z3._data(4)[2])
                e.step()
            assert sw.incomplete_step == 0 and sw.steps == 3 and e.global_steps == 3, how
            if on:
                assert e.optimizer_path.buffers.grads_in.held == set()
            _backward_only(e, z3._data(4)[3])
            e.step()
            _equal(z3._whole(e), refw)
            e.close()


_KILLED = """
import os, signal, sys
sys.path.insert(0, {tests!r})
os.environ["ZSPEED_DEVICE"] = {device!r}  # the test's own device: the runs compared bit for bit share it
import torch
import test_grads_in_shards as t
from zspeed._native import errcode, lib
from zspeed.ops.swap import NVMeOptimizerSwapper
e, _ = t.z3._train(t._nvme({swap!r}), steps=2)
e.save_checkpoint({ck!r}, tag="s")
t._backward_only(e, t.z3._data(4)[2])
real = NVMeOptimizerSwapper.step

def step(self, *a, **kw):  # the write of the 3rd partition fails; then the process is killed
    lib.zs_fault_set(b"swap.write", 3, 1, errcode("ZS_EIO"))
    try:
        real(self, *a, **kw)
    finally:
        print("STEPPED", self.incomplete_step, sum(self.holds_state(i) for i in range(len(self.sizes))),
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
NVMeOptimizerSwapper.step = step
e.step()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_run_killed_mid_step_resumes_from_its_checkpoint_bit_for_bit(tmp_path):
    """kill -9 in the middle of an NVMe step whose swapper writes the new weights into the shards
    (some partitions committed to the compact swap file, one write failed, the rest unstepped):
    the next run in the same nvme_path reclaims the dead run's swap file, resumes from the
    checkpoint, and trains on bit for bit as a run that never died."""
    import signal
    import subprocess
    if not eh.native_ops_available():
        pytest.skip("fault injection is libzspeed's (zs_fault_set)")
    swap, ck = tmp_path / "swap", tmp_path / "ck"
    swap.mkdir()
    code = _KILLED.format(tests=os.path.dirname(os.path.abspath(__file__)), swap=str(swap), ck=str(ck),
                          device=z3.DEVICE)
    root = os.path.dirname(os.path.dirname(zspeed.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("STEPPED")]
    assert line and line[0].split()[1] == "3", r.stdout  # it died with step 3 incomplete
    left = [f for f in os.listdir(swap) if f.endswith(".swap")]
    assert left  # the dead run's swap file, which nobody holds any more
    ref, _ = z3._train(_cfg(on=False, sub_group_size=300), steps=2)
    for idx in z3._data(4)[2:]:
        _backward_only(ref, idx)
        ref.step()
    torch.manual_seed(0)
    e, *_ = zspeed.initialize(model=z3.Model(), config=_nvme(swap))
    assert not set(left) & set(os.listdir(swap))  # reclaimed when the new engine started
    e.load_checkpoint(ck, tag="s")
    assert e.global_steps == 2
    for idx in z3._data(4)[2:]:
        _backward_only(e, idx)
        e.step()
    _equal(z3._whole(e), z3._whole(ref))
    e.close()


def test_three_tiers_land_the_disk_share_in_the_shards_bit_for_bit(tmp_path):
    """ratio and max_in_cpu with the optimizer on NVMe: the GPU's units (the CPU here), host
    memory's and NVMe's; the gradients of the last two land in their shards."""
    n = sum(p.numel() for p in z3.Model().parameters())
    out = {}
    for on in (False, True):
        swap = tmp_path / str(on)
        swap.mkdir()
        c = _nvme(swap, on=on)
        c["zero_optimization"]["offload_optimizer"].update(ratio=0.6, max_in_cpu=n // 4)
        e, losses = z3._train(c, steps=4)
        path = e.optimizer_path
        assert path.dev is not None and path.cpu is not None and path.disk is not None
        if on:
            assert path.grads_in is not None and path.disk_buffers.grads_in is path.grads_in
            assert path.grads_in.held == set()
            f = path.sm.flat[0]
            g = path.disk_buffers.flat_grads[0]
            assert f.data_ptr() <= g.data_ptr() < f.data_ptr() + f.numel() * f.element_size()
        out[on] = (losses, z3._whole(e))
        e.close()
    assert out[True][0] == out[False][0]
    _equal(out[True][1], out[False][1])


@pytest.mark.skipif(z3.DEVICE != "cpu", reason="the multi-rank cases run on the CPU (Gloo)")
def test_two_ranks_with_the_optimizer_on_nvme_equal_a_separate_gradient_buffer(tmp_path):
    outs = {}
    for on in (False, True):
        swap = tmp_path / f"s{on}"
        swap.mkdir()
        cfg = dict(_nvme(swap, on=on), train_micro_batch_size_per_gpu=3)
        outs[on] = z3._ranks(2, cfg, tmp_path, f"n{on}")
    for r in range(2):
        _equal(outs[True][r]["state"], outs[False][r]["state"])


def test_a_save_that_cannot_fit_in_host_memory_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """ZeRO-3 with the optimizer on NVMe: a save streams (one gathered parameter, one swap
    partition at a time); where the host has not even that available, the save is refused with
    the numbers before it gathers or writes anything, and training goes on."""
    from zspeed.runtime import checkpoint, memory
    from zspeed.runtime.checkpoint_files import CheckpointError
    swap = tmp_path / "swap"
    swap.mkdir()
    e, _ = z3._train(_nvme(swap), steps=1)
    need = checkpoint.save_host_bytes(e._checkpoint_parts())
    big = max(p.numel() for p in z3.Model().parameters())  # the embedding, 37 x 24
    # bf16: the parameter's unit (itself, padded to the alignment) and the parameter cut from it
    assert 2 * 2 * big <= need["the model's largest parameter, gathered with its unit"] <= 2 * 2 * big + 2 * 1024
    part = max(max(sw.sizes) for sw in e.optimizer_path.swappers)
    assert part <= 300  # sub_group_size
    piece = max(n for ns in e.optimizer_path.layout.numels for n in ns)
    assert need["one NVMe swap partition and one piece of its master or state"] == 12 * part + 8 * piece
    total = sum(need.values())
    monkeypatch.setattr(memory, "available_host_bytes", lambda: total - 1)
    with pytest.raises(CheckpointError, match=r"would hold .* GiB in host memory at once .* available: nothing"):
        e.save_checkpoint(tmp_path / "ck", tag="s")
    assert not (tmp_path / "ck" / "s").exists()
    _backward_only(e, z3._data(4)[1])
    e.step()  # training goes on
    monkeypatch.setattr(memory, "available_host_bytes", lambda: total)
    e.save_checkpoint(tmp_path / "ck", tag="s")
    assert (tmp_path / "ck" / "s").is_dir()
    e.close()


def _track_deferred(monkeypatch) -> dict:
    """Wraps every checkpoint_files.Deferred's load: counts the loads and the bytes of loaded
    tensors alive at once (a tensor stays alive until its last reference goes)."""
    import weakref
    from zspeed.runtime import checkpoint_files as cf
    seen = {"loads": 0, "bytes": 0, "live": 0, "peak": 0}
    init = cf.Deferred.__init__

    def tracked_init(self, dtype, shape, load):
        def counted():
            t = load()
            n = t.numel() * t.element_size()
            seen["loads"] += 1
            seen["bytes"] += n
            seen["live"] += n
            seen["peak"] = max(seen["peak"], seen["live"])
            weakref.finalize(t, lambda: seen.__setitem__("live", seen["live"] - n))
            return t
        init(self, dtype, shape, counted)
    monkeypatch.setattr(cf.Deferred, "__init__", tracked_init)
    return seen


@pytest.mark.parametrize("tiers", ["nvme", "gpu+host+nvme"])
@pytest.mark.parametrize("state_dtype", [None, "int8"])
def test_a_save_streams_the_weights_and_the_nvme_tier(tmp_path, monkeypatch, tiers, state_dtype):
    """A ZeRO-3 save with the optimizer on NVMe holds one gathered weight and one piece of the
    NVMe tier's masters or states at a time (each written, then dropped), never the tier or
    the model whole; a load reads each tensor as it puts it in place; what is written loads
    back into a fresh engine bit for bit."""
    n = sum(p.numel() for p in z3.Model().parameters())
    swap = tmp_path / "swap"
    swap.mkdir()
    c = _nvme(swap, state_dtype=state_dtype)
    if tiers != "nvme":
        c["zero_optimization"]["offload_optimizer"].update(ratio=0.3, max_in_cpu=n // 4)
    e, _ = z3._train(c, steps=2)
    seen = _track_deferred(monkeypatch)
    e.save_checkpoint(tmp_path / "ck", tag="s")
    monkeypatch.undo()
    big = max(p.numel() for p in z3.Model().parameters())
    weights = sum(2 * p.numel() for p in z3.Model().parameters())  # bf16, each gathered once (tied too)
    assert seen["loads"] > 30 and seen["bytes"] > weights  # the weights, and masters and states by piece
    assert seen["live"] == 0
    assert seen["peak"] <= 2 * 4 * big  # at most two loaded tensors alive: the one written, the next
    ref = z3._whole(e)
    ref_state = e.optimizer.state_dict()["state"]
    torch.manual_seed(0)
    swap2 = tmp_path / "swap2"
    swap2.mkdir()
    c2 = dict(c, zero_optimization=dict(c["zero_optimization"], offload_optimizer=dict(
        c["zero_optimization"]["offload_optimizer"], nvme_path=str(swap2))))
    f, *_ = zspeed.initialize(model=z3.Model(), config=c2)
    seen = _track_deferred(monkeypatch)
    f.load_checkpoint(tmp_path / "ck", tag="s")  # streams too: each tensor read as it is put in place
    monkeypatch.undo()
    assert seen["loads"] > 30 and seen["bytes"] > weights
    assert seen["live"] == 0 and seen["peak"] <= 2 * 4 * big
    _equal(z3._whole(f), ref)
    got = f.optimizer.state_dict()["state"]
    assert got.keys() == ref_state.keys()
    for k in ref_state:
        for key, v in ref_state[k].items():
            assert torch.equal(torch.as_tensor(got[k][key]), torch.as_tensor(v)), (k, key)
    for idx in z3._data(2, seed=5):  # both go on identically
        for x in (e, f):
            _backward_only(x, idx)
            x.step()
    _equal(z3._whole(f), z3._whole(e))
    e.close()
    f.close()


def test_a_disk_error_midway_through_a_streaming_load_names_the_file_and_a_second_load_repairs(tmp_path, monkeypatch):
    """A load reads each tensor from the checkpoint as it puts it in place (after every checksum
    and header was checked). If the disk fails midway, the CheckpointError names the file and
    says the engine holds part of the checkpoint; loading again makes it whole."""
    from zspeed.runtime import checkpoint_shards as cs
    from zspeed.runtime.checkpoint_files import CheckpointError
    swap = tmp_path / "swap"
    swap.mkdir()
    e, _ = z3._train(_nvme(swap, state_dtype="int8"), steps=2)
    e.save_checkpoint(tmp_path / "ck", tag="s")
    ref, ref_state = z3._whole(e), e.optimizer.state_dict()["state"]
    e.close()
    torch.manual_seed(0)
    swap2 = tmp_path / "swap2"
    swap2.mkdir()
    f, *_ = zspeed.initialize(model=z3.Model(), config=_nvme(swap2, state_dtype="int8"))
    real_slice, calls = cs._flat_slice, [0]

    def failing(sl, lo, hi):
        calls[0] += 1
        if calls[0] == 7:
            raise OSError(5, "Input/output error")
        return real_slice(sl, lo, hi)
    monkeypatch.setattr(cs, "_flat_slice", failing)
    with pytest.raises(CheckpointError, match=r"cannot read .*ck/s.* \(OSError: .*Input/output error\) after it was "
                                              r"verified.*holds part of the checkpoint: load a checkpoint again"):
        f.load_checkpoint(tmp_path / "ck", tag="s")
    monkeypatch.undo()
    assert calls[0] == 7
    f.load_checkpoint(tmp_path / "ck", tag="s")
    _equal(z3._whole(f), ref)
    got = f.optimizer.state_dict()["state"]
    for k in ref_state:
        for key, v in ref_state[k].items():
            assert torch.equal(torch.as_tensor(got[k][key]), torch.as_tensor(v)), (k, key)
    assert f.global_steps == 2
    for idx in z3._data(2, seed=5):
        _backward_only(f, idx)
        f.step()
    f.close()
