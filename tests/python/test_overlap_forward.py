"""offload_optimizer.overlap_forward (cpu.py): engine.step() returns once the CPU step has
started; the step runs chunk by chunk in the background and the next forward waits, module by
module, for the chunk holding that module's weights. The updates are exact: every run here
must equal the synchronous step bit for bit (same kernels, same order per element).

The tests slow the CPU step down (a sleep per chunk) so that the next forward certainly
starts while the step is still running: without the per-module waits it would read old
weights and the results would differ. tests/gpu/check_zero3_cuda.py runs this file on CUDA,
where the copies back go through a copy stream and events."""
from __future__ import annotations

import os
import sys
import time

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError  # noqa: E402

DATA = eh.regression_data(6)
SLOW_S = 0.02  # per chunk: long against the forward of a small MLP


def _cfg(overlap=True, precision="fp32", gas=1, ratio=1.0, **extra):
    c = eh.config(zero_optimization={"stage": 2, "sub_group_size": 300,  # several chunks
                                     "offload_optimizer": {"device": "cpu", "overlap_forward": overlap,
                                                           "ratio": ratio}},
                  gradient_clipping=0.3, gradient_accumulation_steps=gas,
                  scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-2,
                                                           "warmup_num_steps": 4}}, **extra)
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    elif precision == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return c


def _host_path(e):
    p = e.optimizer_path
    return p.cpu if type(p).__name__ in ("SplitPath", "StoreSplitPath") else p


def _patch_step(e, before):
    """Runs ``before(chunk_number)`` ahead of each chunk of the CPU step. The background step
    runs a shallow copy of the host optimizer (with the hyperparameters of its start), so the
    instance's class is replaced: the copy keeps it, and the chunk runs on the copy."""
    host = _host_path(e).host
    calls = []

    class Patched(type(host)):
        def step(self, *a, **k):
            calls.append(1)
            before(len(calls) - 1)
            return super().step(*a, **k)
    host.__class__ = Patched
    return calls


def _slow(e, seconds=SLOW_S):
    """Makes each chunk of the CPU step take at least ``seconds`` longer."""
    _patch_step(e, lambda i: time.sleep(seconds))


def _engine(cfg, model=None, slow=True):
    e, *_ = zspeed.initialize(model=model or _deep(), config=cfg)
    if slow and cfg["zero_optimization"]["offload_optimizer"]["overlap_forward"]:
        _slow(e)
    return e


def _deep():
    """Six Linear layers of odd sizes: several chunks of sub_group_size 300, one module each."""
    torch.manual_seed(0)
    dims = [13, 29, 23, 31, 19, 17, 5]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1])


def _weights(e):
    return [p.detach().float().clone() for p in e.module.parameters()]


@pytest.mark.parametrize("precision,gas,ratio", [("fp32", 1, 1.0), ("bf16", 2, 1.0), ("fp16", 1, 1.0),
                                                 ("fp32", 1, 0.6)])
def test_overlapped_steps_equal_the_synchronous_step(precision, gas, ratio):
    ref = _engine(_cfg(False, precision, gas, ratio))
    e = _engine(_cfg(True, precision, gas, ratio))
    assert len(_host_path(e).chunks) >= 3
    inf_at = (2,) if precision == "fp16" else ()  # an overflow: the step is skipped on both
    la = eh.train(ref, DATA, 8 * gas, inf_at=inf_at)
    lb = eh.train(e, DATA, 8 * gas, inf_at=inf_at)
    assert la == lb  # every forward saw the same weights
    e.finish_step()  # then the parameters can be read directly
    assert eh.same_weights(e, ref)
    assert e.get_lr() == ref.get_lr() and e.global_steps == ref.global_steps
    assert e.skipped_steps == ref.skipped_steps == (1 if precision == "fp16" else 0)


def test_step_returns_while_the_cpu_step_runs_and_the_forward_waits_per_module():
    e = _engine(_cfg(True), slow=False)
    _slow(e, 0.05)
    path = _host_path(e)
    n = len(path.runner.waits)  # what the next forward can wait for: each unit of the store, stepped
    assert n >= len(path.chunks) >= 3
    loss = eh.mse_loss(e, DATA[0])
    e.backward(loss)
    t0 = time.perf_counter()
    e.step()
    returned = time.perf_counter() - t0
    inf = path._inflight
    assert inf is not None and inf.done < n  # still running
    assert returned < 0.05 * len(path.chunks) / 2  # (each chunk's step sleeps 0.05 s)
    # The first module's weights arrive with the first waits: a forward of it alone waits for no more.
    first = e.module[0]
    k0 = max(path._wait_index(p) for p in first.parameters())
    first(DATA[0][0].to(e.device))
    assert inf.done >= k0 + 1 and inf.done < n
    e.finish_step()  # the public way to wait before reading parameters directly
    assert path._inflight is None and inf.done == n


def test_state_dict_and_checkpoints_see_the_finished_step(tmp_path):
    ref = _engine(_cfg(False))
    e = _engine(_cfg(True))
    for eng in (ref, e):
        eh.train(eng, DATA, 2)
    # Right after step(): module.state_dict() finishes the step first (a state_dict pre-hook).
    sd = {k: v.clone() for k, v in e.module.state_dict().items()}
    assert all(torch.equal(sd[k], v) for k, v in ref.module.state_dict().items())
    eh.train(e, DATA, 1, start=2)
    e.save_checkpoint(str(tmp_path), tag="t")
    eh.train(ref, DATA, 1, start=2)
    back = _engine(_cfg(False), slow=False)
    back.load_checkpoint(str(tmp_path), tag="t")
    assert eh.same_weights(back, ref)
    eh.train(back, DATA, 2, start=3)
    eh.train(ref, DATA, 2, start=3)
    assert eh.same_weights(back, ref)


def test_an_error_in_the_background_step_is_raised_by_the_next_forward():
    e = _engine(_cfg(True), slow=False)
    def fail(i):
        if i == 1:
            raise RuntimeError("injected failure in chunk 1")
    _patch_step(e, fail)
    e.backward(eh.mse_loss(e, DATA[0]))
    e.step()
    with pytest.raises(RuntimeError, match="injected failure in chunk 1"):
        eh.mse_loss(e, DATA[1])  # the module that needs chunk 1 raises the step's error
    assert _host_path(e)._inflight is None


def test_eval_forward_and_gradient_accumulation_wait_for_the_whole_step():
    ref = _engine(_cfg(False, gas=3))
    e = _engine(_cfg(True, gas=3))
    eh.train(ref, DATA, 3)
    eh.train(e, DATA, 3)
    with torch.no_grad():
        x = DATA[4][0].to(e.device)
        assert torch.equal(e(x), ref(x))


@pytest.mark.parametrize("off,match", [
    ({"device": "cpu", "overlap_forward": True, "delayed_update": True}, "choose one"),
    ({"device": "none", "overlap_forward": True}, "needs offload_optimizer.device"),
    ({"device": "cpu", "overlap_forward": "yes"}, "overlap_forward"),
])
def test_config_errors(off, match):
    c = eh.config(zero_optimization={"stage": 2, "offload_optimizer": off})
    with pytest.raises(ConfigError, match=match):
        zspeed.initialize(model=eh.mlp(), config=c)


def _z3(overlap, precision="fp32", gas=1, ratio=1.0, param="cpu"):
    c = _cfg(overlap, precision, gas, ratio)
    c["zero_optimization"].update(stage=3, offload_param={"device": param},
                                  stage3_param_persistence_threshold=40)  # the smallest layers stay gathered
    return c


@pytest.mark.parametrize("precision,gas,ratio,param", [("fp32", 1, 1.0, "cpu"), ("bf16", 2, 1.0, "cpu"),
                                                       ("fp16", 1, 1.0, "none"), ("bf16", 1, 0.6, "cpu"),
                                                       ("fp32", 2, 0.3, "none")])
def test_zero3_overlapped_steps_equal_the_synchronous_step(precision, gas, ratio, param):
    """ZeRO-3: the fetcher gathers a module's shards (and prefetches the next ones) only once the
    background step has stepped them; with a split the GPU's units are stepped first."""
    ref = _engine(_z3(False, precision, gas, ratio, param))
    e = _engine(_z3(True, precision, gas, ratio, param))
    assert len(_host_path(e).chunks) >= 2
    inf_at = (2,) if precision == "fp16" else ()
    la = eh.train(ref, DATA, 6 * gas, inf_at=inf_at)
    lb = eh.train(e, DATA, 6 * gas, inf_at=inf_at)
    assert la == lb  # every forward saw the same weights
    e.finish_step()
    assert eh.same_weights(e, ref)
    assert e.global_steps == ref.global_steps and e.skipped_steps == ref.skipped_steps


def test_zero3_the_forward_waits_only_for_the_shards_it_gathers():
    e = _engine(_z3(True), slow=False)
    _slow(e, 0.05)
    path = _host_path(e)
    n = len(path.runner.waits)
    e.backward(eh.mse_loss(e, DATA[0]))
    e.step()
    inf = path._inflight
    assert inf is not None and inf.done < n
    with torch.no_grad():
        e.module[0](DATA[0][0].to(e.device))  # gathers the first layer's shards: waits for them only
    assert 1 <= inf.done < n
    e.finish_step()
    assert path._inflight is None and inf.done == n
