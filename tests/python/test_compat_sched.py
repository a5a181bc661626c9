"""DeepSpeed's documented schedule rules (checked against its lr_schedules.py): per-group
WarmupLR targets, tensor learning rates filled in place, positive step sizes, the log
fallback for an unknown warmup_type, OneCycle's (beta1, beta2) momentum, per-group
momentum lists and stairs, LRRangeTest, and VALID_LR_SCHEDULES."""
import logging
import math

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch")

from zspeed.runtime import lr_schedules as lrs  # noqa: E402
from zspeed.runtime.lr_schedules import (LRRangeTest, OneCycle, VALID_LR_SCHEDULES, WarmupCosineLR,  # noqa: E402
                                         WarmupDecayLR, WarmupLR)


def two_groups(lr0=0.1, lr1=0.2, betas=(0.9, 0.95)):
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    return torch.optim.Adam([{"params": [a], "lr": lr0}, {"params": [b], "lr": lr1}], betas=betas)


def test_valid_lr_schedules_are_all_available():
    assert VALID_LR_SCHEDULES == ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]
    assert all(name in lrs.SCHEDULERS for name in VALID_LR_SCHEDULES)


def test_warmup_lr_without_max_warms_each_group_to_its_own_lr():
    opt = two_groups()
    s = WarmupLR(opt, warmup_num_steps=10)
    assert s.max_lrs == [0.1, 0.2]
    s.step(10)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.2])


TENSOR_CASES = [
    (LRRangeTest, {}, 1e-3, 1e-3 * (1 + 2 / 2000)),
    (OneCycle, dict(cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=10, cycle_momentum=False),
     0.01, 0.01 + 0.09 * 2 / 10),
    (WarmupLR, dict(warmup_num_steps=10), 0.0, 0.1 * math.log(2) / math.log(10)),
    (WarmupDecayLR, dict(total_num_steps=100, warmup_num_steps=10, warmup_max_lr=0.1), 0.0,
     0.1 * math.log(2) / math.log(10)),
    (WarmupCosineLR, dict(total_num_steps=100, warmup_num_steps=10), 0.0, 0.1 * math.log(2) / math.log(10)),
]


@pytest.mark.parametrize("shape", [(), (1,)])
@pytest.mark.parametrize("cls,kwargs,first,second", TENSOR_CASES, ids=[c[0].__name__ for c in TENSOR_CASES])
def test_tensor_lr_stays_the_same_tensor(cls, kwargs, first, second, shape):
    lr = torch.full(shape, 0.1, dtype=torch.float64)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    s = cls(opt, **kwargs)
    assert opt.param_groups[0]["lr"] is lr and lr.shape == shape and lr.dtype == torch.float64
    assert lr.item() == pytest.approx(first)
    s.step(1)
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(second)


@pytest.mark.parametrize("cls,extra", [(WarmupLR, {}), (WarmupDecayLR, {"total_num_steps": 100}),
                                       (WarmupCosineLR, {"total_num_steps": 100})])
@pytest.mark.parametrize("bad", [None, 0, -5, 2.5])
def test_warmup_num_steps_must_be_a_positive_integer(cls, extra, bad):
    opt = two_groups()
    with pytest.raises(ValueError, match="warmup_num_steps"):
        cls(opt, warmup_num_steps=bad, **extra)


@pytest.mark.parametrize("first,second", [(0, 0), (0, None), (-1, None), (0, 100), (100, -1)])
def test_one_cycle_refuses_bad_step_sizes(first, second):
    with pytest.raises(ValueError, match="step_size"):
        OneCycle(two_groups(), 0.001, 0.1, cycle_first_step_size=first, cycle_second_step_size=second)


def test_one_cycle_allows_an_empty_second_half():
    s = OneCycle(two_groups(), 0.001, 0.1, cycle_first_step_size=100, cycle_second_step_size=0)
    for _ in range(3):
        s.step()
    assert s.get_lr()[0] > 0.001


@pytest.mark.parametrize("bad", [0, -1])
def test_lr_range_test_refuses_bad_step_size(bad):
    with pytest.raises(ValueError, match="lr_range_test_step_size"):
        LRRangeTest(two_groups(), lr_range_test_step_size=bad)


def test_lr_range_test_values():
    opt = two_groups()
    s = LRRangeTest(opt, lr_range_test_min_lr=[0.01, 0.02], lr_range_test_step_size=4,
                    lr_range_test_step_rate=0.5, lr_range_test_staircase=True)
    assert s.get_last_lr() == [0.01, 0.02]
    got = []
    for _ in range(8):
        s.step()
        got.append(opt.param_groups[1]["lr"])
    # staircase: interval floor((t + 1) / 4) for t = 0..7 -> 0,0,0,1,1,1,1,2
    assert got == pytest.approx([0.02, 0.02, 0.02, 0.03, 0.03, 0.03, 0.03, 0.04])


def test_unknown_warmup_type_falls_back_to_log(caplog):
    caplog.set_level(logging.WARNING, logger="zspeed")
    a = WarmupCosineLR(two_groups(), total_num_steps=100, warmup_num_steps=10, warmup_type="not_a_curve")
    b = WarmupCosineLR(two_groups(), total_num_steps=100, warmup_num_steps=10, warmup_type="log")
    assert a.warmup_type == "log" and any("not_a_curve" in r.getMessage() for r in caplog.records)
    for t in range(15):
        a.step(t)
        b.step(t)
        assert a.get_lr_ratio() == pytest.approx(b.get_lr_ratio())
    assert WarmupLR(two_groups(), warmup_type="cosine").warmup_type == "log"


def test_one_cycle_momentum_pairs_and_groups():
    opt = two_groups(betas=(0.9, 0.97))
    s = OneCycle(opt, cycle_min_lr=[0.001, 0.002], cycle_max_lr=[0.01, 0.02], cycle_min_mom=[0.8, 0.85],
                 cycle_max_mom=[0.9, 0.95], cycle_first_step_size=5, cycle_second_step_size=5)
    assert [g["betas"] for g in opt.param_groups] == [(0.8, 0.97), (0.85, 0.97)]
    s.step(4)  # the peak: max lr, min momentum, for each group its own
    assert s.get_lr() == pytest.approx([0.01, 0.02])
    assert s.get_mom() == [pytest.approx((0.8, 0.97)), pytest.approx((0.85, 0.97))]
    s.step(9)  # back at the bottom
    assert [g["betas"][0] for g in opt.param_groups] == pytest.approx([0.9, 0.95])
    with pytest.raises(ValueError, match="one per param group"):
        OneCycle(two_groups(), 0.001, 0.01, cycle_min_mom=[0.8, 0.85, 0.9])
    assert OneCycle(two_groups(), 0.001, 0.01, cycle_momentum=False).get_mom() is None


def _one_cycle_lrs(first_stairs, steps=16, first=8, second=8, second_stairs=None):
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.001)
    s = OneCycle(opt, 0.001, 0.01, cycle_first_step_size=first, cycle_second_step_size=second,
                 cycle_first_stair_count=first_stairs, cycle_second_stair_count=second_stairs)
    out = []
    for _ in range(steps):
        s.step()
        out.append(s.get_lr()[0])
    return out


def test_one_cycle_stairs():
    continuous = _one_cycle_lrs(0)
    assert len(set(continuous[:8])) == 8
    stairs = _one_cycle_lrs(2)
    assert stairs[0] == stairs[1] and len(set(stairs[:8])) < 8
    assert _one_cycle_lrs(8) == continuous  # one stair per step is the continuous schedule
    cont = _one_cycle_lrs(0, steps=31, first=10, second=21, second_stairs=0)
    aligned = _one_cycle_lrs(10, steps=31, first=10, second=21, second_stairs=21)
    assert aligned == pytest.approx(cont) and aligned[9] == pytest.approx(0.01)
