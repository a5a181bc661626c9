"""LR schedules against DeepSpeed's formulas, re-derived here independently.

Expected values are computed in float64 from closed forms written in this file;
the schedules also compute in Python floats, so agreement is to 1e-12 relative
(only the order of float operations can differ)."""
import math

import pytest

torch = pytest.importorskip("torch", reason="the zspeed runtime needs torch (pip install torch)")

from zspeed.runtime.lr_schedules import OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR, build_scheduler


def opt(lr=0.1, groups=1, betas=True):
    ps = [[torch.nn.Parameter(torch.zeros(3))] for _ in range(groups)]
    if betas:
        return torch.optim.Adam([{"params": p} for p in ps], lr=lr)
    return torch.optim.SGD([{"params": p} for p in ps], lr=lr)


def lr_sequence(sched, o, n):
    seen = [o.param_groups[0]["lr"]]
    for _ in range(n):
        sched.step()
        seen.append(o.param_groups[0]["lr"])
    return seen


def close(a, b):
    assert a == pytest.approx(b, rel=1e-12, abs=1e-15)


def warm(t, w, kind):
    # log warmup grows like log(t+1)/log(W); linear like t/W; W is at least 2.
    w = max(2, w)
    return math.log(t + 1) / math.log(w) if kind == "log" else t / w


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_lr(kind):
    o = opt()
    s = WarmupLR(o, warmup_min_lr=0.01, warmup_max_lr=0.5, warmup_num_steps=7, warmup_type=kind)
    seq = lr_sequence(s, o, 20)
    close(seq[0], 0.01)  # before the first step the optimizer runs at the min lr
    for k in range(1, 21):  # after k steps the schedule is at t = k - 1
        t = k - 1
        g = warm(t, 7, kind) if t < 7 else 1.0
        close(seq[k], 0.01 + (0.5 - 0.01) * g)
    assert s.get_last_lr() == [0.5]


def test_warmup_lr_defaults_to_optimizer_lr_and_min_two_steps():
    o = opt(lr=0.3)
    s = WarmupLR(o, warmup_num_steps=1)
    assert s.warmup_num_steps == 2
    seq = lr_sequence(s, o, 3)
    close(seq[1], 0.0)                                  # t=0: log(1)/log(2) = 0
    close(seq[2], 0.3 * math.log(2) / math.log(2))      # t=1: ... = 1 (warmup over)
    close(seq[3], 0.3)


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_decay_lr(kind):
    o = opt()
    T, W = 30, 5
    s = WarmupDecayLR(o, total_num_steps=T, warmup_min_lr=0.0, warmup_max_lr=0.2, warmup_num_steps=W,
                      warmup_type=kind)
    seq = lr_sequence(s, o, 40)
    close(seq[0], 0.0)
    for t in range(40):
        if t < W:
            g = warm(t, W, kind)
        else:
            g = max(0.0, (T - t) / max(1.0, T - W))
        close(seq[t + 1], 0.2 * g)
    assert seq[T + 1] == 0.0 and seq[40] == 0.0


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_cosine_lr(kind):
    o = opt(lr=0.4, groups=2)
    T, W, r0, c = 50, 10, 0.1, 0.01
    s = WarmupCosineLR(o, total_num_steps=T, warmup_min_ratio=r0, warmup_num_steps=W, cos_min_ratio=c,
                       warmup_type=kind)
    seq = lr_sequence(s, o, 60)
    close(seq[0], 0.0)  # DeepSpeed's WarmupCosineLR starts at ratio 0 before the first step
    for t in range(60):
        if t < W:
            ratio = r0 + (1 - r0) * warm(t, W, kind)
        else:
            ratio = max(0.0, c + (1 - c) * 0.5 * (1 + math.cos(math.pi * (t - W + 1) / (T - W))))
        close(seq[t + 1], 0.4 * ratio)
    assert o.param_groups[1]["lr"] == o.param_groups[0]["lr"]


def onecycle_ref(t, lo, hi, s1, s2, rate, dstep):
    total = s1 + s2
    if t < total:
        it = t + 1
        cyc = math.floor(1 + it / total)
        x = 1 + it / total - cyc
        frac = s1 / total
        f = x / frac if x <= frac else (x - 1) / (frac - 1)
        return lo + (hi - lo) * f, f
    if dstep == 0 or rate == 0:
        return lo, None
    return lo / (1 + rate * (t - total + 1) / dstep), None


def test_one_cycle_lr_and_momentum():
    o = opt()
    s = OneCycle(o, cycle_min_lr=0.01, cycle_max_lr=0.1, decay_lr_rate=0.5, cycle_first_step_size=6,
                 cycle_second_step_size=4, decay_step_size=3, cycle_min_mom=0.85, cycle_max_mom=0.95,
                 decay_mom_rate=0.01)
    assert o.param_groups[0]["lr"] == 0.01 and o.param_groups[0]["betas"][0] == 0.85
    for t in range(0, 25):
        s.step()
        want, f = onecycle_ref(t, 0.01, 0.1, 6, 4, 0.5, 3)
        close(o.param_groups[0]["lr"], want)
        beta1 = o.param_groups[0]["betas"][0]
        if f is not None:
            close(beta1, 0.95 - (0.95 - 0.85) * f)
        else:
            close(beta1, 0.95 * (1 + 0.01 * (t - 10 + 1) / 3))
        assert o.param_groups[0]["betas"][1] == 0.999  # beta2 is left as configured


def test_one_cycle_no_decay_and_no_betas():
    o = opt(betas=False)
    s = OneCycle(o, cycle_min_lr=0.2, cycle_max_lr=1.0, cycle_first_step_size=3)
    assert not s.cycle_momentum
    seq = lr_sequence(s, o, 12)
    for t in range(12):
        close(seq[t + 1], onecycle_ref(t, 0.2, 1.0, 3, 3, 0.0, 0)[0])


@pytest.mark.parametrize("name,params", [
    ("WarmupLR", {"warmup_num_steps": 9}),
    ("WarmupDecayLR", {"total_num_steps": 20, "warmup_num_steps": 4}),
    ("WarmupCosineLR", {"total_num_steps": 20, "warmup_num_steps": 4}),
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 4,
                  "decay_step_size": 2, "decay_lr_rate": 0.1}),
])
def test_state_dict_round_trip(name, params):
    o1 = opt()
    s1 = build_scheduler(name, params, o1)
    for _ in range(7):
        s1.step()
    sd = s1.state_dict()
    o2 = opt()
    s2 = build_scheduler(name, params, o2)
    s2.load_state_dict(sd)
    assert o2.param_groups[0]["lr"] == o1.param_groups[0]["lr"]
    for _ in range(15):
        s1.step()
        s2.step()
        assert o2.param_groups[0]["lr"] == o1.param_groups[0]["lr"]
        assert o2.param_groups[0]["betas"] == o1.param_groups[0]["betas"]


def test_bad_arguments():
    # DeepSpeed's rule: an unknown warmup_type falls back to the log curve (tested in
    # test_compat_sched.py); a non-positive warmup_num_steps is refused.
    with pytest.raises(ValueError, match="warmup_num_steps"):
        WarmupLR(opt(), warmup_num_steps=0)
    with pytest.raises(ValueError, match="one per param group"):
        WarmupLR(opt(groups=2), warmup_min_lr=[0.1, 0.2, 0.3])
    with pytest.raises(RuntimeError, match="step"):
        s = OneCycle(opt(), 0.1, 0.2)
        s._last_lr = None
        s.get_last_lr()
