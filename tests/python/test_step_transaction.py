"""A step is one transaction and a torn state never trains on silently (issue 52, findings 2-7):

- a load that finds nothing, or refuses a checkpoint, leaves a torn NVMe step pending (step()
  still completes it); a load that fails while putting the checkpoint in place (an I/O error
  writing the NVMe swap files) is a LoadIncompleteError, after which the engine refuses to
  train or save until a load succeeds;
- an overflow skip whose weight restore fails (fp16, NVMe states, gradients in the shards) is
  pending: the retry finishes it, counted once;
- GatheredParameters and close() after a torn step complete it first (or say why not);
- with grads_in_shards, zero_grad() gives the shards their weights back: a load after it works;
- nothing after a step's commit makes step() raise (a failing monitor is logged), and a phase
  that raises before it (the LR scheduler) is resumed by the retry, not repeated."""
from __future__ import annotations

import logging
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zspeed  # noqa: E402
import engine_helpers as eh  # noqa: E402
import test_zero3 as z3  # noqa: E402
import test_grads_in_shards as G  # noqa: E402
from zspeed.runtime.checkpoint_files import CheckpointError, LoadIncompleteError  # noqa: E402
from zspeed.runtime.engine import StepIncompleteError  # noqa: E402

needs_faults = pytest.mark.skipif(not eh.native_ops_available(), reason="fault injection is libzspeed's (zs_fault_set)")


def _fault(site: str, n: int, count: int = 1, err: str = "ZS_EIO") -> None:
    from zspeed._native import errcode, lib
    lib.zs_fault_set(site.encode(), n, count, errcode(err))


def _clear() -> None:
    from zspeed._native import lib
    lib.zs_fault_clear()


def _reference(steps_after: int = 2) -> dict:
    """Two steps, then ``steps_after`` more on data[2:] (what every recovered run must equal)."""
    ref, _ = z3._train(G._cfg(on=False, sub_group_size=300), steps=2)
    for idx in z3._data(4)[2:2 + steps_after]:
        G._backward_only(ref, idx)
        ref.step()
    out = z3._whole(ref)
    ref.close()
    return out


def _torn(tmp_path, on: bool = True):
    """An NVMe engine after two steps and a save, whose third step stopped partway."""
    from zspeed import NativeError
    swap = tmp_path / "swap"
    swap.mkdir()
    e, _ = z3._train(G._nvme(swap, on=on), steps=2)
    e.save_checkpoint(tmp_path / "ck", tag="s")
    G._backward_only(e, z3._data(4)[2])
    _fault("swap.write", 2)
    try:
        with pytest.raises(NativeError, match="stopped partway"):
            e.step()
    finally:
        _clear()
    assert e.global_steps == 2 and e._step.torn
    return e


@needs_faults
@pytest.mark.parametrize("on", [False, True])
def test_a_load_that_finds_nothing_or_refuses_leaves_the_torn_step_pending(tmp_path, on):
    want = _reference()
    e = _torn(tmp_path, on)
    assert e.load_checkpoint(tmp_path / "missing") == (None, None)
    assert e.load_checkpoint(tmp_path / "ck", tag="no-such-tag") == (None, None)
    assert e._step.torn and e.optimizer_path.swappers[0].incomplete_step == 3  # still pending
    bad = tmp_path / "bad"  # a copy of the checkpoint with one byte changed: its checksum fails
    import shutil
    shutil.copytree(tmp_path / "ck", bad)
    victim = max((p for p in (bad / "s").rglob("*") if p.is_file() and p.suffix == ".safetensors"),
                 key=lambda p: p.stat().st_size)
    raw = bytearray(victim.read_bytes())
    raw[-9] ^= 0xFF
    victim.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError):
        e.load_checkpoint(bad, tag="s")
    assert e._step.torn and e.optimizer_path.swappers[0].incomplete_step == 3  # still pending
    e.step()  # completes it
    assert e.global_steps == 3
    G._backward_only(e, z3._data(4)[3])
    e.step()
    G._equal(z3._whole(e), want)
    e.close()


@needs_faults
def test_an_io_error_while_a_load_writes_the_swap_files_refuses_training_until_a_load_succeeds(tmp_path):
    want = _reference()
    swap = tmp_path / "swap"
    swap.mkdir()
    e, _ = z3._train(G._nvme(swap), steps=2)
    e.save_checkpoint(tmp_path / "ck", tag="s")
    for idx in z3._data(6, seed=9)[:2]:  # moves away from the checkpoint
        G._backward_only(e, idx)
        e.step()
    _fault("swap.write", 2)
    try:
        with pytest.raises(LoadIncompleteError, match="load a checkpoint again"):
            e.load_checkpoint(tmp_path / "ck", tag="s")
    finally:
        _clear()
    assert isinstance(LoadIncompleteError("x"), CheckpointError)
    for what, call in (("engine.backward", lambda: G._backward_only(e, z3._data(4)[2])),
                       ("engine.step", e.step),
                       ("engine.save_checkpoint", lambda: e.save_checkpoint(tmp_path / "ck2", tag="t"))):
        with pytest.raises(LoadIncompleteError, match="load_checkpoint failed partway"):
            call()
    assert not (tmp_path / "ck2" / "t").exists()
    path, _ = e.load_checkpoint(tmp_path / "ck", tag="s")
    assert path is not None and e.global_steps == 2
    for idx in z3._data(4)[2:]:
        G._backward_only(e, idx)
        e.step()
    G._equal(z3._whole(e), want)
    e.close()


@needs_faults
def test_an_overflow_skip_whose_weight_restore_fails_is_finished_by_the_retry(tmp_path):
    """fp16, NVMe states, gradients in the shards: a skipped step puts the weights back from the
    masters (read from the swap files); a read error there leaves the skip pending, not a wedge."""
    cfg = lambda d: G._nvme(d, precision="fp16")  # noqa: E731
    runs = {}
    for faulty in (False, True):
        swap = tmp_path / f"swap{faulty}"
        swap.mkdir()
        torch.manual_seed(0)
        e = zspeed.initialize(model=z3.Model(), config=cfg(swap))[0]
        data = z3._data(4)
        G._backward_only(e, data[0])
        e.step()
        e.backward(z3._loss(e, data[1]) * float("inf"))  # overflows: the step is skipped
        assert e.optimizer_path.buffers.grads_in.held
        if faulty:
            _fault("swap.read", 1)
            try:
                with pytest.raises(Exception):
                    e.step()
            finally:
                _clear()
            assert e.skipped_steps == 1 and e.global_steps == 1
            with pytest.raises(StepIncompleteError, match="skipped .*restoring the weights raised"):
                G._backward_only(e, data[2])
        e.step()
        assert e.skipped_steps == 1 and e.global_steps == 2
        assert e.optimizer_path.buffers.grads_in.held == set()
        for idx in data[2:]:
            G._backward_only(e, idx)
            e.step()
        runs[faulty] = z3._whole(e)
        e.close()
    G._equal(runs[True], runs[False])


@needs_faults
def test_gathered_parameters_after_a_torn_step_completes_it_first(tmp_path, caplog):
    want = _reference(steps_after=1)
    e = _torn(tmp_path)
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        with zspeed.zero.GatheredParameters(list(e.module.parameters())):
            got = {n: p.detach().float().cpu().clone() for n, p in e.module.named_parameters()}
    assert "discarded" not in caplog.text
    assert not e._step.torn and e.global_steps == 3
    for n, v in got.items():
        assert torch.equal(v, want[n]), n
    e.close()


@needs_faults
def test_reading_or_closing_after_a_torn_step_that_fails_again_says_so(tmp_path, caplog):
    e = _torn(tmp_path)
    _fault("swap.write", 1, count=1000)
    try:
        with pytest.raises(StepIncompleteError, match="GatheredParameters: optimizer step 3 stopped partway"):
            with zspeed.zero.GatheredParameters(list(e.module.parameters())):
                pass
        with caplog.at_level(logging.WARNING, logger="zspeed"):
            e.close()
    finally:
        _clear()
    assert "could not be completed" in caplog.text and "some parameters stepped and others not" in caplog.text


def test_zero_grad_with_gradients_in_the_shards_lets_a_load_run(tmp_path):
    e, _ = z3._train(G._cfg(), steps=2)
    e.save_checkpoint(tmp_path, tag="s")
    want = z3._whole(e)
    G._backward_only(e, z3._data(4)[2])
    assert e.optimizer_path.buffers.grads_in.held
    e.zero_grad()  # e.g. after a backward that failed
    assert e.optimizer_path.buffers.grads_in.held == set()
    G._equal(z3._whole(e), want)  # the shards hold the weights again
    path, _ = e.load_checkpoint(tmp_path, tag="s")
    assert path is not None
    G._equal(z3._whole(e), want)


def test_a_failing_monitor_is_logged_and_the_step_stands(tmp_path, caplog):
    cfg = z3._cfg(2, opt="cpu")
    cfg["csv_monitor"] = {"enabled": True, "output_path": str(tmp_path), "job_name": "job"}
    ref, _ = z3._train(z3._cfg(2, opt="cpu"), steps=3)
    torch.manual_seed(0)
    e = zspeed.initialize(model=z3.Model(), config=cfg)[0]

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")
    e.monitor.write_events = full_disk
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        for idx in z3._data(3):
            e.backward(z3._loss(e, idx))
            e.step()  # never raises: the step was applied and counted before the monitor ran
    assert e.global_steps == 3
    assert "was applied and counted, but writing the monitors' step events failed" in caplog.text
    G._equal(z3._whole(e), z3._whole(ref))


def test_a_scheduler_that_raises_is_resumed_not_the_optimizer_step(tmp_path):
    """The LR scheduler's step raises once: step() raises; the retry runs the scheduler, not a
    second optimizer step."""
    class Flaky(torch.optim.lr_scheduler.LambdaLR):
        fail = [False]

        def step(self, *a, **k):
            if Flaky.fail[0]:
                Flaky.fail[0] = False
                raise RuntimeError("scheduler hiccup")
            return super().step(*a, **k)
    runs = {}
    for flaky in (False, True):
        torch.manual_seed(0)
        e = zspeed.initialize(model=z3.Model(), config=z3._cfg(2, opt="cpu"),
                              lr_scheduler=lambda opt: Flaky(opt, lambda s: 1.0 / (1 + s)))[0]
        for i, idx in enumerate(z3._data(3)):
            e.backward(z3._loss(e, idx))
            if flaky and i == 1:
                Flaky.fail[0] = True
                with pytest.raises(RuntimeError, match="scheduler hiccup"):
                    e.step()
                assert e.global_steps == 1
                with pytest.raises(StepIncompleteError, match="LR scheduler"):
                    e.backward(z3._loss(e, idx))
            e.step()
        assert e.global_steps == 3
        runs[flaky] = (z3._whole(e), e.get_lr())
    G._equal(runs[True][0], runs[False][0])
    assert runs[True][1] == runs[False][1]
