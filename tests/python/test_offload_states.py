"""engine.offload_states() / reload_states() (DeepSpeed's names; runtime/park.py): the states
leave for host memory and come back bit for bit, on every path and stage, so that a run with an
offload/reload between two calls trains exactly as the same run without it (difference exactly
0: the same kernels see the same bytes). On these CPU runs the engine's device is the host, and
the states move from their storages into separate host buffers just as they would from a GPU
(tests/gpu/check_offload_states.py checks the device memory that is freed on a GPU).

Also: calls that need a state that is away are refused by name, the parameters can be read (and
written) on the host while away, and the arguments are checked as DeepSpeed's."""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zspeed  # noqa: E402
import test_zero3 as z3  # noqa: E402
from test_zero_grad import CASES, _engine, _backward, _equal  # noqa: E402
from distrun import run_ranks  # noqa: E402
from zspeed.runtime.park import StatesAwayError  # noqa: E402
from zspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum  # noqa: E402

KINDS = [None, ["lp_params"], ["hp_params"], ["optim_states"], ["lp_grads"], ["contiguous_grad_buffer"]]


def _train(case, tmp, away_at=None, include=None, steps=3, between=None):
    """``steps`` steps of one micro-batch; with ``away_at`` (("backward" | "step", i)) the states
    go away and come back right after that call of step i; ``between(e)`` runs meanwhile."""
    data = z3._data(steps, seed=5)
    e = _engine(case, tmp)
    moved = None
    for i in range(steps):
        _backward(e, data[i])
        if away_at == ("backward", i):
            e.offload_states(include=include)
            moved = e._parked.bytes_away()
            between and between(e)
            e.reload_states()
        e.step()
        if away_at == ("step", i):
            e.offload_states(include=include)
            moved = e._parked.bytes_away()
            between and between(e)
            e.reload_states()
    out = z3._whole(e)
    e.close()
    return out, moved


@pytest.mark.parametrize("case", list(CASES))
def test_offload_and_reload_between_backward_and_step_trains_bit_for_bit(case, tmp_path):
    want, _ = _train(case, tmp_path / "ref")
    got, moved = _train(case, tmp_path / "away", away_at=("backward", 1))
    _equal(got, want, f"{case}: offload_states()/reload_states() between backward and step")
    assert moved and sum(moved.values()) > 0, f"{case}: nothing moved ({moved})"


@pytest.mark.parametrize("case", ["s0-fp32", "s1-bf16", "s2-cpu-fp16", "s2-split-bf16", "s3-fp32", "s3-cpu-bf16",
                                  "s3-nvme-bf16-shards", "s3-overlap-bf16"])
@pytest.mark.parametrize("include", KINDS[1:], ids=lambda k: k[0])
def test_each_state_alone_leaves_and_comes_back(case, include, tmp_path):
    want, _ = _train(case, tmp_path / "ref")
    got, moved = _train(case, tmp_path / "away", away_at=("step", 0), include=include)
    _equal(got, want, f"{case}: offload_states(include={include})")
    kind = {"contiguous_grad_buffer": "lp_grads"}.get(include[0], include[0])
    assert list(moved) == [kind]


def test_what_moves_where_the_optimizer_lives(tmp_path):
    """The fp32 masters and Adam's moments move where they live on the engine's device (ZeRO-1/2
    without offload), and stay where an offloaded optimizer keeps them (host memory already),
    as DeepSpeed leaves a CPU optimizer's."""
    on_device, offloaded = (_moved_after_one_step(c, tmp_path / c) for c in ("s1-bf16", "s2-cpu-fp32"))
    assert on_device["hp_params"] > 0 and on_device["optim_states"] > 0
    assert offloaded["hp_params"] == 0 and offloaded["optim_states"] == 0
    assert on_device["lp_params"] > 0 and offloaded["lp_params"] > 0


def _moved_after_one_step(case, tmp) -> dict:
    e = _engine(case, tmp)
    _backward(e, z3._data(1, seed=5)[0])
    e.step()
    e.offload_states()
    moved = e._parked.bytes_away()
    e.reload_states()
    e.close()
    return moved


def test_calls_that_need_what_is_away_are_refused_and_forward_runs_without_the_optimizer_state(tmp_path):
    e = _engine("s1-bf16", tmp_path)
    data = z3._data(3, seed=6)
    _backward(e, data[0])
    e.step()
    e.offload_states(include=[OffloadStateTypeEnum.optim_states, OffloadStateTypeEnum.hp_params])
    with torch.no_grad():  # a forward needs only the weights (an RLHF loop's generation)
        out = e(data[1].to(e.device))
    for call, what in [(lambda: e.step(), "engine.step()"), (lambda: _backward(e, data[1]), "engine.backward()"),
                       (lambda: e.save_checkpoint(str(tmp_path / "ck")), "engine.save_checkpoint()"),
                       (lambda: e.zero_grad(), "engine.zero_grad()")]:
        with pytest.raises(StatesAwayError, match=rf"{what.replace('(', '[(]').replace(')', '[)]')} needs the "
                                                 r"engine's states.*optim_states.*reload_states\(\) first"):
            call()
    with pytest.raises(StatesAwayError, match=r"tensor-fragment API.*needs the engine's states"):
        zspeed.utils.safe_get_full_fp32_param(next(e.module.parameters()))
    e.reload_states()
    with torch.no_grad():
        assert torch.equal(e(data[1].to(e.device)), out)
    e.offload_states(include=["lp_params"])
    with pytest.raises(StatesAwayError, match=r"engine.forward\(\) needs.*lp_params"):
        e(data[1].to(e.device))
    e.reload_states()
    _backward(e, data[2])
    e.step()
    assert e.global_steps == 2
    e.close()


def test_the_weights_can_be_read_and_written_on_the_host_while_away(tmp_path):
    """While the 16-bit weights are away the parameters point at their host copies: reading
    them gives the weights, and a write there is what comes back (as DeepSpeed's parameters
    are views of its host buffer then)."""
    for case in ("s2-cpu-fp32", "s3-fp32"):
        e = _engine(case, tmp_path / case)
        _backward(e, z3._data(1, seed=7)[0])
        e.step()
        e.finish_step()
        named = dict(e.module.named_parameters())
        before = {n: p.detach().clone() for n, p in named.items() if p.numel()}
        e.offload_states(include=["lp_params"])
        for n, t in before.items():
            assert torch.equal(named[n].detach(), t.cpu()), f"{case}: {n} reads other values while away"
        shards = [p.ds_tensor for p in named.values() if hasattr(p, "ds_tensor")]
        assert all(s.device.type == "cpu" for s in shards)
        if not shards:
            name = next(iter(before))
            with torch.no_grad():
                named[name].add_(1.0)
        e.reload_states()
        for n, t in before.items():
            expect = t + 1.0 if not shards and n == next(iter(before)) else t
            assert torch.equal(named[n].detach(), expect), f"{case}: {n} came back with other values"
        e.close()


def test_offload_twice_and_reload_twice_are_harmless_and_close_brings_them_back(tmp_path):
    want, _ = _train("s1-bf16", tmp_path / "ref", steps=2)
    e = _engine("s1-bf16", tmp_path / "e")
    data = z3._data(2, seed=5)
    _backward(e, data[0])
    e.step()
    e.offload_states(include=["optim_states"])
    e.offload_states()                      # the rest follows; optim_states is away already
    assert sorted(e._parked.kinds) == ["hp_params", "lp_grads", "lp_params", "optim_states"]
    e.reload_states()
    e.reload_states()                       # nothing away: a no-op
    _backward(e, data[1])
    e.step()
    _equal(z3._whole(e), want, "offload twice, reload twice")
    e.offload_states()
    e.close()                               # the module is handed back whole
    assert all(p.device == e.device and torch.isfinite(p).all() for p in e.module.parameters())


def test_arguments_are_checked_as_deepspeed_does(tmp_path, caplog):
    e = _engine("s1-bf16", tmp_path)
    with pytest.raises(ValueError, match=r"unknown state 'masters'.*lp_params, hp_params, optim_states"):
        e.offload_states(include=["masters"])
    with pytest.raises(ValueError, match=r"device='nvme'.*host memory only"):
        e.offload_states(device=OffloadDeviceEnum.nvme)
    with caplog.at_level("WARNING", logger="zspeed.engine"):
        e.offload_states(device=OffloadDeviceEnum.none)
    assert "nothing moved" in caplog.text and not e._parked.away
    e.offload_states(include="optim_states", device="cpu", pin_memory=False, non_blocking=True)
    assert e._parked.kinds == ["optim_states"]
    e.reload_states(non_blocking=True)
    e.close()
    inference = zspeed.initialize(model=z3.Model(), config={"train_micro_batch_size_per_gpu": 1})[0]
    with pytest.raises(Exception, match=r"offload_states\(\).*without an optimizer"):
        inference.offload_states()


def test_several_ranks_offload_their_own_shards(tmp_path):
    """Two Gloo ranks at ZeRO-3 and ZeRO-2 with a split: each rank's states leave and come back;
    the run equals one without it on every rank."""
    code = f"""
import os, sys, torch
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import test_zero3 as z3
from test_zero_grad import _engine, _backward
from pathlib import Path
for case in ("s3-fp32", "s2-split-bf16", "s1-bf16"):
    outs = []
    for away in (False, True):
        e = _engine(case, Path({str(tmp_path)!r}) / f"{{case}}-{{away}}-{{os.environ['RANK']}}")
        data = z3._data(3, seed=5)
        for i in range(3):
            _backward(e, data[i])
            if away and i == 1:
                e.offload_states()
                assert e._parked.bytes_away()["lp_params"] > 0
                e.reload_states()
            e.step()
        outs.append(z3._whole(e))
        e.close()
    bad = [k for k in outs[0] if not torch.equal(outs[0][k], outs[1][k])]
    assert not bad, (case, bad)
print("ok")
"""
    for r in run_ranks(2, code, timeout=300):
        assert r.returncode == 0 and "ok" in r.stdout, r


def test_device_memory_is_freed_while_away_and_taken_again_on_reload(tmp_path):
    """On a GPU (the gate runs this file with ZSPEED_DEVICE=cuda:0): the allocator's count of
    device memory drops by at least the bytes moved, the parameters' host copies are
    page-locked, and reload takes the memory again."""
    e = _engine("s1-bf16", tmp_path)
    if e.device.type != "cuda":
        e.close()
        pytest.skip("the engine runs on the CPU here; the GPU gate (ZSPEED_DEVICE=cuda:0) checks device memory")
    _backward(e, z3._data(1, seed=8)[0])
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(e.device)
    e.offload_states()
    moved = sum(e._parked.bytes_away().values())
    away = torch.cuda.memory_allocated(e.device)
    assert moved > 0 and before - away >= moved, (before, away, moved)
    assert all(p.device.type == "cpu" and p.is_pinned() for p in e.module.parameters())
    e.reload_states()
    back = torch.cuda.memory_allocated(e.device)
    assert back - away >= moved and back <= before, (before, away, back, moved)
    assert all(p.device == e.device for p in e.module.parameters())
    e.step()
    e.close()
