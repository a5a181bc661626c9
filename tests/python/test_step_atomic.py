"""An optimizer step is all or nothing (engine.step, cpu.py's _advance, interrupts.py).

- Ctrl-C during a synchronous multi-chunk CPU step waits for the step; a second Ctrl-C
  interrupts it, and the next engine.step() completes it, every chunk stepped once.
- A step that raises partway (a failing chunk) is completed by the next engine.step();
  until then backward refuses, save_checkpoint completes it first, load_checkpoint
  discards it.
- A step that fails in the background (overlap_forward, delayed_update) raises its error
  once, at the next forward or step, and the call after that completes it.
- Exports right after step() (module.state_dict, the consolidated 16-bit state dict,
  copy.deepcopy and torch.save of the module) see the finished step; a ZeRO-3 module
  refuses to be copied, naming what to use.
- A closed engine refuses to train.

Every comparison is exact: the completed step must equal an uninterrupted one bit for bit
(the same kernels on the same data, each parameter stepped once)."""
from __future__ import annotations

import copy
import io
import os
import signal
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_helpers as eh  # noqa: E402

import zspeed  # noqa: E402
from zspeed.runtime.engine import EngineClosedError, StepIncompleteError, ZeRO3CopyError  # noqa: E402

DATA = eh.regression_data(6)


class FakeInterrupt(BaseException):
    """What the test's SIGINT handler raises (a real KeyboardInterrupt would stop pytest)."""


@pytest.fixture
def sigint():
    """A SIGINT handler raising FakeInterrupt, restored afterwards; yields a function sending SIGINT."""
    def handler(signum, frame):
        raise FakeInterrupt()
    old = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, old)


def _cfg(mode="sync", precision="fp32", **off):
    o = {"device": "cpu", **off}
    if mode == "overlap":
        o["overlap_forward"] = True
    elif mode == "delayed":
        o["delayed_update"] = True
    c = eh.config(zero_optimization={"stage": 2, "sub_group_size": 300, "offload_optimizer": o},
                  gradient_clipping=0.3,
                  scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 5e-3, "warmup_max_lr": 2e-2,
                                                           "warmup_num_steps": 4}})
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    return c


def _deep():
    torch.manual_seed(0)
    dims = [13, 29, 23, 31, 19, 17, 5]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1])


def _engine(cfg):
    e, *_ = zspeed.initialize(model=_deep(), config=cfg)
    return e


def _host(e):
    p = e.optimizer_path
    return p.cpu if type(p).__name__ == "StoreSplitPath" else p


def _before_chunks(e, before):
    """Runs before(i) ahead of the CPU step's i-th chunk call (the background steps run a shallow
    copy of the host optimizer, which keeps the replaced class)."""
    host = _host(e).host
    calls = []

    class Patched(type(host)):
        def step(self, *a, **k):
            calls.append(1)
            before(len(calls) - 1)
            return super().step(*a, **k)
    host.__class__ = Patched
    return calls


def _same(a, b):
    a.finish_step()
    b.finish_step()
    assert eh.same_weights(a, b)
    assert a.global_steps == b.global_steps and a.get_lr() == b.get_lr()
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for name, v in sa[k].items():
            w = sb[k][name]
            assert (torch.equal(v, w) if torch.is_tensor(v) else v == w), (k, name)


def _backward(e, i):
    e.backward(eh.mse_loss(e, DATA[i % len(DATA)]))


# -- Ctrl-C and errors during a synchronous step ---------------------------------------------------
def test_ctrl_c_during_the_step_waits_for_it(sigint):
    ref, e = _engine(_cfg()), _engine(_cfg())
    assert len(_host(e).chunks) >= 3
    eh.train(ref, DATA, 2)
    eh.train(e, DATA, 1)
    _before_chunks(e, lambda i: sigint() if i == 1 else None)
    _backward(e, 1)
    with pytest.raises(FakeInterrupt):
        e.step()  # delivered after the step, not inside it
    assert e.global_steps == 2 and e.micro_steps == 2
    _same(e, ref)


def test_a_second_ctrl_c_interrupts_and_the_next_step_completes_it(sigint, tmp_path):
    ref, e = _engine(_cfg()), _engine(_cfg())
    eh.train(ref, DATA, 3)
    eh.train(e, DATA, 1)
    calls = _before_chunks(e, lambda i: (sigint(), sigint()) if i == 1 else None)
    _backward(e, 1)
    with pytest.raises(FakeInterrupt):
        e.step()
    assert e.global_steps == 1  # the step is not counted until it is complete
    with pytest.raises(StepIncompleteError, match="Call engine.step\\(\\) again"):
        _backward(e, 2)  # its gradients must not be overwritten
    e.step()  # completes it: the chunks already stepped are not stepped again
    n = len(_host(e).chunks)
    assert len(calls) == 2 + (n - 1)  # chunk 1 raised before its kernel ran; the retry starts there
    assert e.global_steps == 2
    eh.train(e, DATA, 1, start=2)
    _same(e, ref)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_step_that_raises_partway_is_completed_by_the_next_step(precision):
    ref, e = _engine(_cfg(precision=precision)), _engine(_cfg(precision=precision))
    eh.train(ref, DATA, 3)
    eh.train(e, DATA, 1)
    fail = {"at": 2}

    def before(i):
        if i == fail["at"]:
            fail["at"] = None
            raise RuntimeError("injected failure in chunk 2")
    _before_chunks(e, before)
    _backward(e, 1)
    with pytest.raises(RuntimeError, match="injected failure in chunk 2"):
        e.step()
    with pytest.raises(StepIncompleteError, match="injected failure in chunk 2"):
        _backward(e, 2)
    e.step()
    eh.train(e, DATA, 1, start=2)
    _same(e, ref)


def test_save_completes_a_step_that_raised_and_load_discards_one(tmp_path):
    ref, e = _engine(_cfg()), _engine(_cfg())
    eh.train(ref, DATA, 2)
    eh.train(e, DATA, 1)
    fail = {"at": 1}

    def before(i):
        if i == fail["at"]:
            fail["at"] = None
            raise RuntimeError("injected")
    _before_chunks(e, before)
    _backward(e, 1)
    with pytest.raises(RuntimeError):
        e.step()
    e.save_checkpoint(str(tmp_path), tag="t")  # completes the step first
    assert e.global_steps == 2
    _same(e, ref)
    back = _engine(_cfg())
    back.load_checkpoint(str(tmp_path), tag="t")
    _same(back, ref)
    # A torn step is discarded by a load of the optimizer states, refused by a module-only load.
    fail["at"] = 0
    calls = _before_chunks(back, before)
    _backward(back, 2)
    with pytest.raises(RuntimeError):
        back.step()
    with pytest.raises(StepIncompleteError, match="load the optimizer states too"):
        back.load_checkpoint(str(tmp_path), tag="t", load_module_only=True)
    back.load_checkpoint(str(tmp_path), tag="t")
    assert len(calls) == 1
    eh.train(back, DATA, 1, start=2)
    eh.train(ref, DATA, 1, start=2)
    _same(back, ref)


# -- errors in a step running in the background ----------------------------------------------------
def test_an_overlapped_step_that_fails_is_completed_by_the_next_forward():
    ref, e = _engine(_cfg()), _engine(_cfg("overlap"))
    eh.train(ref, DATA, 3)
    fail = {"at": 1}

    def before(i):
        if i == fail["at"]:
            fail["at"] = None
            raise RuntimeError("injected failure in chunk 1")
    eh.train(e, DATA, 1)
    _before_chunks(e, before)
    _backward(e, 1)
    e.step()
    with pytest.raises(RuntimeError, match="injected failure in chunk 1"):
        eh.mse_loss(e, DATA[2])  # raised once, by the module that waits for chunk 1
    eh.train(e, DATA, 1, start=2)  # this forward completes the step first
    _same(e, ref)


def test_a_delayed_step_that_fails_is_completed_by_the_next_step(tmp_path):
    plain, e = _engine(_cfg("delayed")), _engine(_cfg("delayed"))
    eh.train(plain, DATA, 3)
    plain.save_checkpoint(str(tmp_path / "a"), tag="t")
    fail = {"at": 1}

    def before(i):
        if i == fail["at"]:
            fail["at"] = None
            raise RuntimeError("injected failure in chunk 1")
    eh.train(e, DATA, 1)
    _before_chunks(e, before)
    _backward(e, 1)
    e.step()  # starts step 2 in the background; chunk 1 fails there
    _backward(e, 2)
    with pytest.raises(RuntimeError, match="injected failure in chunk 1"):
        e.step()  # step 3 first finishes step 2: its error comes out here
    e.step()  # the retry: step 2 completes, then step 3 runs
    e.save_checkpoint(str(tmp_path / "b"), tag="t")
    _same(e, plain)


def test_save_after_a_background_failure_completes_the_step_first(tmp_path):
    ref, e = _engine(_cfg()), _engine(_cfg("overlap"))
    eh.train(ref, DATA, 2)
    fail = {"at": 2}

    def before(i):
        if i == fail["at"]:
            fail["at"] = None
            raise RuntimeError("injected")
    eh.train(e, DATA, 1)
    _before_chunks(e, before)
    _backward(e, 1)
    e.step()
    with pytest.raises(RuntimeError, match="injected"):
        e.finish_step()
    e.save_checkpoint(str(tmp_path), tag="t")  # the retry runs here; the checkpoint is whole
    back = _engine(_cfg())
    back.load_checkpoint(str(tmp_path), tag="t")
    _same(back, ref)


# -- exports right after step() --------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["delayed", "overlap"])
def test_exports_right_after_step_see_the_finished_step(mode, tmp_path):
    ref, e = _engine(_cfg()), _engine(_cfg(mode))
    eh.train(ref, DATA, 1)  # after one step the delayed update equals the plain one
    if mode == "overlap":
        import time
        _before_chunks(e, lambda i: time.sleep(0.02))
    eh.train(e, DATA, 1)
    want = {k: v.clone() for k, v in ref.module.state_dict().items()}

    def check(sd):
        assert sd.keys() == want.keys()
        for k in want:
            assert torch.equal(sd[k].float().cpu(), want[k].float().cpu()), k
    check(e.module.state_dict())
    check(e._zero3_consolidated_16bit_state_dict())
    e.save_16bit_model(str(tmp_path), "m.safetensors")
    from safetensors.torch import load_file
    check(load_file(str(tmp_path / "m.safetensors")))
    eh.train(e, DATA, 1, start=1)
    eh.train(ref, DATA, 1, start=1)
    c = copy.deepcopy(e.module)  # an EMA copy right after step()
    e.finish_step()
    if mode == "overlap":
        assert all(torch.equal(p, q) for p, q in zip(c.parameters(), ref.module.parameters()))
    assert all(torch.equal(p, q) for p, q in zip(c.parameters(), e.module.parameters()))


@pytest.mark.parametrize("mode", ["sync", "overlap"])
def test_the_module_can_be_deep_copied_and_saved_whole(mode):
    e = _engine(_cfg(mode))
    eh.train(e, DATA, 2)
    c = copy.deepcopy(e.module)  # the copy is a plain module: its hooks do nothing
    buf = io.BytesIO()
    torch.save(e.module, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    e.finish_step()
    x = DATA[0][0].to(e.device)
    with torch.no_grad():
        want = e.module(x)
        for m in (c, loaded):
            assert torch.equal(m(x), want)
            assert all(torch.equal(p, q) for p, q in zip(m.parameters(), e.module.parameters()))
            assert "__deepcopy__" not in m.__dict__ and "__reduce_ex__" not in m.__dict__
    eh.train(e, DATA, 1, start=2)  # the engine trains on after the copies


def test_a_zero3_module_refuses_to_be_copied_naming_the_alternative():
    e, *_ = zspeed.initialize(model=_deep(), config=eh.config(zero_optimization={"stage": 3}))
    eh.train(e, DATA, 1)
    for target in (e.module, e.module[2]):
        with pytest.raises(ZeRO3CopyError, match="_zero3_consolidated_16bit_state_dict"):
            copy.deepcopy(target)
        with pytest.raises(ZeRO3CopyError, match="partitioned by ZeRO stage 3"):
            torch.save(target, io.BytesIO())
    eh.train(e, DATA, 1, start=1)


def test_a_closed_engine_refuses_to_train(tmp_path):
    e = _engine(_cfg())
    eh.train(e, DATA, 1)
    e.close()
    e.close()  # idempotent
    for call in (lambda: eh.mse_loss(e, DATA[0]), lambda: e.step(), lambda: e.save_checkpoint(str(tmp_path))):
        with pytest.raises(EngineClosedError, match="zspeed.initialize"):
            call()
