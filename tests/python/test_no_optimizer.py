"""zspeed.initialize without an optimizer (none passed, no 'optimizer' section): DeepSpeed's
ZeRO-Inference, which Hugging Face's Trainer builds for evaluate() and predict() without
training. The engine runs the forward (equal bit for bit to the plain model: fp32 on the CPU,
the same kernels on the same weights), loads a trained checkpoint's weights, and refuses every
training call with NoOptimizerError naming the fix. At ZeRO-3 closing an engine puts its
weights back into the parameters, and a second engine built on a model an earlier one still
partitions (evaluate, then train) closes that one and starts from its weights."""
from __future__ import annotations

import copy
import logging
import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distrun import run_ranks  # noqa: E402

import zspeed  # noqa: E402
from zspeed.runtime.engine import EngineClosedError  # noqa: E402
from zspeed.runtime.errors import NoOptimizerError  # noqa: E402

ZEROS = {"stage0": {"stage": 0}, "stage1": {"stage": 1}, "stage2": {"stage": 2},
         "stage3": {"stage": 3, "stage3_param_persistence_threshold": 0},
         "stage3-persistent": {"stage": 3},  # the small parameters stay whole between uses
         "stage3-offload_param-cpu": {"stage": 3, "offload_param": {"device": "cpu"},
                                      "stage3_param_persistence_threshold": 0}}
TRAIN = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(13, 37), torch.nn.GELU(), torch.nn.Linear(37, 5))


def _cfg(zero, **more):
    return {"train_micro_batch_size_per_gpu": 3, "zero_optimization": copy.deepcopy(zero), **more}


X = torch.randn(3, 13, generator=torch.Generator().manual_seed(7))


def _train(engine, steps=3):
    for i in range(steps):
        loss = engine(X + i).square().mean()
        engine.backward(loss)
        engine.step()


@pytest.mark.parametrize("zero", list(ZEROS.values()) + ["nvme"], ids=list(ZEROS) + ["stage3-offload_param-nvme"])
def test_forward_equals_the_plain_model_and_training_calls_are_refused(zero, tmp_path):
    if zero == "nvme":
        zero = {"stage": 3, "stage3_param_persistence_threshold": 0,
                "offload_param": {"device": "nvme", "nvme_path": str(tmp_path), "buffer_count": 2,
                                  "buffer_size": 1000, "max_in_cpu": 0}}
    plain = _model()
    with torch.no_grad():
        want = plain(X)
    engine, opt, _, sched = zspeed.initialize(model=_model(), config=_cfg(zero))
    assert opt is None and sched is None and engine.optimizer is None and engine.get_lr() == []
    with torch.no_grad():
        assert torch.equal(engine(X), want)
    out = engine(X)  # with autograd on, as a Trainer's prediction step may run it
    assert torch.equal(out.detach(), want)
    with pytest.raises(NoOptimizerError, match="engine.backward.*'optimizer' section"):
        engine.backward(out.sum())
    with pytest.raises(NoOptimizerError, match="loss.backward"):
        engine(X).sum().backward()
    with pytest.raises(NoOptimizerError, match="engine.step"):
        engine.step()
    with pytest.raises(NoOptimizerError, match="save_16bit_model"):
        engine.save_checkpoint(str(tmp_path / "ck"))
    assert not (tmp_path / "ck").exists()
    with torch.no_grad():  # nothing the refusals did changed the weights
        assert torch.equal(engine(X), want)
    engine.close()


@pytest.mark.parametrize("zero", [ZEROS["stage2"], ZEROS["stage3"], ZEROS["stage3-offload_param-cpu"]],
                         ids=["stage2", "stage3", "stage3-offload_param-cpu"])
def test_a_trained_checkpoint_loads_into_an_engine_without_optimizer(zero, tmp_path):
    trained, *_ = zspeed.initialize(model=_model(), config=_cfg(zero, **TRAIN))
    _train(trained)
    with torch.no_grad():
        want = trained(X)
    trained.save_checkpoint(str(tmp_path), tag="t")
    engine, *_ = zspeed.initialize(model=_model(seed=1), config=_cfg(zero))
    for kw in ({}, {"load_optimizer_states": False}, {"load_module_only": True}):
        path, _ = engine.load_checkpoint(str(tmp_path), tag="t", **kw)
        assert path is not None
        with torch.no_grad():
            assert torch.equal(engine(X), want), kw
    assert engine.global_steps == 3  # the counters too, except with load_module_only (the last load)


def test_a_scheduler_without_an_optimizer_is_ignored_with_a_warning(caplog):
    cfg = _cfg(ZEROS["stage3"], scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 5}})
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        engine, _, _, sched = zspeed.initialize(model=_model(), config=cfg)
    assert sched is None and engine.lr_scheduler is None
    assert any("lr scheduler (WarmupLR) is ignored" in r.getMessage() for r in caplog.records)


def test_closing_a_zero3_engine_puts_its_weights_back_into_the_model():
    model = _model()
    engine, *_ = zspeed.initialize(model=model, config=_cfg(ZEROS["stage3"], **TRAIN))
    _train(engine)
    with torch.no_grad():
        want = engine(X)
    assert model[0].weight.numel() == 0  # partitioned while the engine runs
    engine.close()
    assert model[0].weight.shape == (37, 13) and not hasattr(model[0].weight, "ds_numel")
    with torch.no_grad():
        assert torch.equal(model(X), want)  # a plain module again, with the trained weights
    with pytest.raises(EngineClosedError):
        engine(X)


@pytest.mark.parametrize("first", ["inference", "training"])
def test_a_second_engine_on_a_model_an_earlier_one_partitions_starts_from_its_weights(first, caplog):
    """Evaluate, then train (or train, then build another engine): the earlier engine is closed
    and the new one trains as an engine built on a plain model with those weights does."""
    model = _model()
    old, *_ = zspeed.initialize(model=model, config=_cfg(ZEROS["stage3"], **(TRAIN if first == "training" else {})))
    if first == "training":
        _train(old)
    with torch.no_grad():
        start = old(X)
    reference = _model(seed=1)
    reference.load_state_dict(old._zero3_consolidated_16bit_state_dict())  # the old engine's weights
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        new, *_ = zspeed.initialize(model=model, config=_cfg(ZEROS["stage3"], **TRAIN))
    assert any("partitioned by an earlier engine" in r.getMessage() for r in caplog.records)
    with pytest.raises(EngineClosedError):
        old(X)
    with torch.no_grad():
        assert torch.equal(new(X), start)
    fresh, *_ = zspeed.initialize(model=reference, config=_cfg(ZEROS["stage3"], **TRAIN))
    _train(new)
    _train(fresh)
    with torch.no_grad():
        assert torch.equal(new(X), fresh(X))


TWO_RANKS = """
import torch, zspeed
zspeed.init_distributed()
rank = torch.distributed.get_rank()
def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(13, 37), torch.nn.GELU(), torch.nn.Linear(37, 5))
x = torch.randn(3, 13, generator=torch.Generator().manual_seed(7))
zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
cfg = {"train_micro_batch_size_per_gpu": 3, "zero_optimization": zero}
train = dict(cfg, optimizer={"type": "AdamW", "params": {"lr": 1e-2}})
with torch.no_grad():
    want = model(0)(x)
m = model(rank)  # rank 1 starts from other weights: the engine takes rank 0's
inf, opt, _, _ = zspeed.initialize(model=m, config=cfg)
with torch.no_grad():
    got = inf(x)
print("INFERENCE", "ok" if opt is None and torch.equal(got, want) else "WRONG")
eng, *_ = zspeed.initialize(model=m, config=train)  # takes the model from the inference engine
ref, *_ = zspeed.initialize(model=model(0), config=train)
with torch.no_grad():
    print("TAKEN", "ok" if torch.equal(eng(x), want) else "WRONG")
for e in (eng, ref):
    for i in range(3):
        loss = e(x + i).square().mean()
        e.backward(loss)
        e.step()
with torch.no_grad():
    print("TRAINED", "ok" if torch.equal(eng(x), ref(x)) else "WRONG")
"""


def test_two_ranks_inference_then_training_on_the_same_model():
    """Two Gloo ranks at ZeRO-3: the engine without an optimizer computes with rank 0's weights;
    a training engine built on the same model (each rank hands its shards over as zero.Init
    leaves them) trains exactly as one built on rank 0's plain model."""
    res = run_ranks(2, TWO_RANKS, timeout=240)
    for r in res:
        assert r.returncode == 0, r
        for what in ("INFERENCE", "TAKEN", "TRAINED"):
            assert f"{what} ok" in r.stdout, (what, r.stdout)
