"""DeepSpeed's learning-rate schedules, with its parameter names, defaults and formulas.

Each schedule is stepped once per optimizer step (after the optimizer, as
DeepSpeed's engine does) and writes the new rate into every param group.
``last_batch_iteration`` counts the optimizer steps already taken; -1 means
"not started" and the constructor then writes the step-0 rate. All schedules
expose get_lr(), get_last_lr(), step(last_batch_iteration=None),
state_dict() and load_state_dict() so checkpoints can resume them.

Formulas (t = last_batch_iteration, W = max(2, warmup_num_steps)):
  warmup gamma: log: ln(t + 1) / ln(W);  linear: t / W   (for t < W, else 1)
  WarmupLR:       lr = min + (max - min) * gamma
  WarmupDecayLR:  as WarmupLR, and for t >= W gamma = max(0, (T - t) / max(1, T - W))
  WarmupCosineLR: ratio = r0 + (1 - r0) * gamma during warmup, then
                  ratio = max(0, c + (1 - c) * (1 + cos(pi * (t - W + 1) / (T - W))) / 2);
                  lr = optimizer's initial lr * ratio
  OneCycle:       triangular cycle of length s1 + s2 on (t + 1), then lr = min / (1 + rate * k / d)
                  with k = t - (s1 + s2) + 1 the steps after the cycle; betas[0] moves inversely;
                  a stair count n > 0 holds the rate on n flat stairs per half cycle.
  LRRangeTest:    lr = min * (1 + rate * i), i = (t + 1) / size (floored with staircase).

As in DeepSpeed: a learning rate or bound may be given per group (a list); a group
whose lr is a tensor keeps that tensor, filled in place; warmup_num_steps and the
cycle and range-test step sizes must be positive integers (ValueError otherwise; the
second half of a cycle may be 0); an unknown warmup_type falls back to "log" with a
warning; WarmupLR without warmup_max_lr warms each group up to its own lr.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import torch

log = logging.getLogger("zspeed.lr_schedules")

__all__ = ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest", "build_scheduler",
           "SCHEDULERS", "VALID_LR_SCHEDULES", "LR_RANGE_TEST", "ONE_CYCLE", "WARMUP_LR", "WARMUP_DECAY_LR",
           "WARMUP_COSINE_LR", "WARMUP_LOG_RATE", "WARMUP_LINEAR_RATE"]

# DeepSpeed's names of the schedules and warmup curves.
LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]
WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"
# DeepSpeed's names of the config section and of each schedule's parameters (the keys of "params").
LR_SCHEDULE = "lr_schedule"
_PARAM_NAMES = ("lr_range_test_min_lr", "lr_range_test_step_rate", "lr_range_test_step_size",
                "lr_range_test_staircase", "edge_value", "mid_value", "cycle_first_step_size",
                "cycle_first_stair_count", "cycle_second_step_size", "cycle_second_stair_count", "decay_step_size",
                "cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate",
                "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "warmup_min_ratio",
                "cos_min_ratio", "total_num_steps")
globals().update((_key.upper(), _key) for _key in _PARAM_NAMES)
__all__ += ["LR_SCHEDULE"] + [_key.upper() for _key in _PARAM_NAMES]


def _per_group(optimizer, value, name):
    """One value per param group: a list of exactly that many, or one value for all."""
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: expected {n} values (one per param group), got {len(value)}")
        return [v.clone() if torch.is_tensor(v) else float(v) for v in value]
    return [value.clone() if torch.is_tensor(value) else float(value)] * n


def _write_lrs(optimizer, lrs):
    """Writes each group's lr; a group whose lr is a tensor keeps its tensor, filled in place."""
    for group, lr in zip(optimizer.param_groups, lrs):
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(lr.squeeze() if torch.is_tensor(lr) else lr)
        else:
            group["lr"] = lr
    return [g["lr"] for g in optimizer.param_groups]


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _warmup_type(kind) -> str:
    if kind in (WARMUP_LOG_RATE, WARMUP_LINEAR_RATE):
        return kind
    log.warning("unknown warmup_type %r: the log warmup curve is used (the known ones are 'log' and "
                "'linear'), as in DeepSpeed", kind)
    return WARMUP_LOG_RATE


class _Schedule:
    """Shared stepping and state handling."""

    optimizer: Any
    last_batch_iteration: int
    _last_lr: list | None = None

    def get_lr(self) -> list:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def get_last_lr(self) -> list:
        if self._last_lr is None:
            raise RuntimeError("get_last_lr() called before the scheduler set any learning rate; "
                               "call step() first")
        return self._last_lr

    def step(self, last_batch_iteration: int | None = None) -> None:
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = last_batch_iteration
        self._last_lr = _write_lrs(self.optimizer, self.get_lr())

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd: dict) -> None:
        self.last_batch_iteration = int(sd["last_batch_iteration"])
        # Write the restored rate at once so the first resumed step uses it.
        if self.last_batch_iteration >= 0:
            self._last_lr = _write_lrs(self.optimizer, self.get_lr())


def _warmup_gamma(t: int, w: int, kind: str) -> float:
    if kind == "log":
        return math.log(t + 1) / math.log(w)
    return t / w


class WarmupLR(_Schedule):
    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=None, warmup_num_steps=1000,
                 warmup_type="log", last_batch_iteration=-1):
        _positive_int(warmup_num_steps, "warmup_num_steps")
        self.optimizer = _torch_optimizer(optimizer)
        optimizer = self.optimizer
        if warmup_max_lr is None:  # each group warms up to its own configured lr
            warmup_max_lr = [g["lr"] for g in optimizer.param_groups]
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = _warmup_type(warmup_type)
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = _write_lrs(optimizer, self.get_lr())

    def _gamma(self) -> float:
        t = self.last_batch_iteration
        if t < self.warmup_num_steps:
            return _warmup_gamma(t, self.warmup_num_steps, self.warmup_type)
        return 1.0

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        g = self._gamma()
        return [lo + (hi - lo) * g for lo, hi in zip(self.min_lrs, self.max_lrs)]


class WarmupDecayLR(WarmupLR):
    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps=1000, warmup_type="log", last_batch_iteration=-1):
        self.total_num_steps = int(total_num_steps)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)
        if self.total_num_steps < self.warmup_num_steps:
            log.warning("WarmupDecayLR: total_num_steps %d is less than warmup_num_steps %d",
                        self.total_num_steps, self.warmup_num_steps)

    def _gamma(self) -> float:
        t = self.last_batch_iteration
        if t < self.warmup_num_steps:
            return _warmup_gamma(t, self.warmup_num_steps, self.warmup_type)
        return max(0.0, (self.total_num_steps - t) / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(_Schedule):
    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                 cos_min_ratio=0.0001, warmup_type="log", last_batch_iteration=-1):
        _positive_int(warmup_num_steps, "warmup_num_steps")
        self.optimizer = _torch_optimizer(optimizer)
        optimizer = self.optimizer
        self.total_num_steps = int(total_num_steps)
        self.warmup_min_ratio = float(warmup_min_ratio)
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.cos_min_ratio = float(cos_min_ratio)
        self.warmup_type = _warmup_type(warmup_type)
        self.last_batch_iteration = last_batch_iteration
        if self.total_num_steps < self.warmup_num_steps:
            log.warning("WarmupCosineLR: total_num_steps %d is less than warmup_num_steps %d",
                        self.total_num_steps, self.warmup_num_steps)
        self.org_lrs = [g["lr"].clone() if torch.is_tensor(g["lr"]) else g["lr"] for g in optimizer.param_groups]
        if last_batch_iteration == -1:
            self._last_lr = _write_lrs(optimizer, self.get_lr())

    def get_lr_ratio(self) -> float:
        t = self.last_batch_iteration
        if t < 0:
            return 0.0
        w = self.warmup_num_steps
        if t < w:
            g = _warmup_gamma(t, w, self.warmup_type)
            return self.warmup_min_ratio + g * (1.0 - self.warmup_min_ratio)
        done = t - w + 1
        span = self.total_num_steps - w
        if span <= 0:  # no decay phase configured: stay at the end ratio
            return max(0.0, self.cos_min_ratio)
        cos_part = (1.0 + math.cos(math.pi * done / span)) / 2.0
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cos_part)

    def get_lr(self):
        r = self.get_lr_ratio()
        return [lr * r for lr in self.org_lrs]

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration,
                "org_lrs": [float(x) for x in self.org_lrs]}

    def load_state_dict(self, sd: dict) -> None:
        if "org_lrs" in sd:
            self.org_lrs = [float(x) for x in sd["org_lrs"]]
        super().load_state_dict(sd)


class OneCycle(_Schedule):
    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0,
                 cycle_first_step_size=2000, cycle_second_step_size=None, cycle_first_stair_count=0,
                 cycle_second_stair_count=None, decay_step_size=0, cycle_momentum=True,
                 cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.0, last_batch_iteration=-1):
        self.optimizer = _torch_optimizer(optimizer)
        optimizer = self.optimizer
        if isinstance(cycle_first_step_size, bool) or not cycle_first_step_size > 0:
            raise ValueError(f"cycle_first_step_size must be positive, got {cycle_first_step_size!r}")
        if cycle_second_step_size is not None and (isinstance(cycle_second_step_size, bool)
                                                   or not cycle_second_step_size >= 0):
            raise ValueError(f"cycle_second_step_size must be >= 0, got {cycle_second_step_size!r}")
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        self.first_step_size, self.second_step_size = first, second
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_stair_count = int(cycle_first_stair_count or 0)
        self.second_stair_count = (self.first_stair_count if cycle_second_stair_count is None
                                   else int(cycle_second_stair_count))
        self.decay_step_size = decay_step_size
        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = float(decay_lr_rate)
        self.decay_mom_rate = float(decay_mom_rate)
        self.skip_lr_decay = math.isclose(decay_step_size, 0) or math.isclose(self.decay_lr_rate, 0)
        self.skip_mom_decay = math.isclose(decay_step_size, 0) or math.isclose(self.decay_mom_rate, 0)
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum and "betas" not in optimizer.defaults:
            log.warning("OneCycle: cycle_momentum disabled: %s has no betas", type(optimizer).__name__)
            self.cycle_momentum = False
        self.min_moms = _per_group(optimizer, cycle_min_mom, "cycle_min_mom")
        self.max_moms = _per_group(optimizer, cycle_max_mom, "cycle_max_mom")
        # The second beta is the optimizer's and stays as configured (DeepSpeed sets it to 0.99).
        self._beta2 = [g["betas"][1] if "betas" in g else 0.99 for g in optimizer.param_groups]
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = _write_lrs(optimizer, self.min_lrs)
            if self.cycle_momentum:
                self._write_moms(list(zip(self.min_moms, self._beta2)))

    def _scale(self) -> float:
        it = self.last_batch_iteration + 1
        cycle = math.floor(1 + it / self.total_size)
        x = 1.0 + it / self.total_size - cycle
        if x <= self.step_ratio:
            scale, stairs = x / self.step_ratio, self.first_stair_count
        else:
            scale, stairs = (x - 1) / (self.step_ratio - 1), self.second_stair_count
        if stairs > 0:
            # Flat stairs, placed from the integer position in the cycle (a float scale can fall
            # just below a stair boundary and would floor to the stair under it).
            pos = it % self.total_size
            if pos <= self.first_step_size:
                where = pos * stairs / self.first_step_size
            else:
                where = (self.total_size - pos) * stairs / self.second_step_size
            scale = math.floor(where) / stairs
        return scale

    def get_lr(self):
        t = self.last_batch_iteration
        if t < self.total_size:
            s = self._scale()
            return [lo + (hi - lo) * s for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        k = (t - self.total_size + 1) / self.decay_step_size
        return [lo / (1 + self.decay_lr_rate * k) for lo in self.min_lrs]

    def get_mom(self):
        """Per group (beta1, beta2) for the current step (None without cycle_momentum), as
        DeepSpeed returns it."""
        if not self.cycle_momentum:
            return None
        t = self.last_batch_iteration
        if t < self.total_size:
            s = self._scale()
            b1 = [hi - (hi - lo) * s for lo, hi in zip(self.min_moms, self.max_moms)]
        elif self.skip_mom_decay:
            b1 = list(self.max_moms)
        else:
            k = (t - self.total_size + 1) / self.decay_step_size
            b1 = [hi * (1 + self.decay_mom_rate * k) for hi in self.max_moms]
        return list(zip(b1, self._beta2))

    def _write_moms(self, moms):
        for group, m in zip(self.optimizer.param_groups, moms):
            group["betas"] = tuple(m)

    def step(self, last_batch_iteration: int | None = None) -> None:
        super().step(last_batch_iteration)
        if self.cycle_momentum:
            self._write_moms(self.get_mom())

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        if self.cycle_momentum and self.last_batch_iteration >= 0:
            self._write_moms(self.get_mom())


class LRRangeTest(_Schedule):
    """DeepSpeed's learning-rate range test: the rate grows from lr_range_test_min_lr by
    step_rate per lr_range_test_step_size steps (continuously, or in stairs)."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False, last_batch_iteration=-1):
        self.optimizer = _torch_optimizer(optimizer)
        self.min_lr = _per_group(self.optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size = _positive_int(lr_range_test_step_size, "lr_range_test_step_size")
        self.step_rate = float(lr_range_test_step_rate)
        self.staircase = bool(lr_range_test_staircase)
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = _write_lrs(self.optimizer, self.min_lr)

    def get_lr(self):
        interval = (self.last_batch_iteration + 1) / self.step_size
        if self.staircase:
            interval = math.floor(interval)
        return [lo * (1 + self.step_rate * interval) for lo in self.min_lr]


def _torch_optimizer(optimizer):
    """The torch optimizer whose groups a schedule drives: the optimizer, or the one a wrapper
    holds as ``.optimizer`` (DeepSpeed accepts both)."""
    if hasattr(optimizer, "param_groups"):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and hasattr(inner, "param_groups"):
        return inner
    raise TypeError(f"{type(optimizer).__name__} is not an optimizer (it has no param_groups)")


SCHEDULERS = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR,
              "WarmupCosineLR": WarmupCosineLR, "OneCycle": OneCycle, "LRRangeTest": LRRangeTest}


def build_scheduler(name: str, params: dict, optimizer):
    """Constructs the scheduler named in a validated config section."""
    return SCHEDULERS[name](optimizer, **params)
