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
                  with k = t - (s1 + s2) + 1 the steps after the cycle; betas[0] moves inversely.
"""
from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger("zspeed.lr_schedules")

__all__ = ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "build_scheduler",
           "SCHEDULERS"]


def _per_group(optimizer, value, name):
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: expected {n} values (one per param group), got {len(value)}")
        return [float(v) for v in value]
    return [float(value)] * n


def _write_lrs(optimizer, lrs):
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    return [g["lr"] for g in optimizer.param_groups]


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
        self.optimizer = optimizer
        if warmup_max_lr is None:  # DeepSpeed: fall back to the optimizer's configured lr
            warmup_max_lr = optimizer.param_groups[0]["lr"]
        if warmup_type not in ("log", "linear"):
            raise ValueError(f"warmup_type must be 'log' or 'linear', got {warmup_type!r}")
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.warmup_type = warmup_type
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
        if warmup_type not in ("log", "linear"):
            raise ValueError(f"warmup_type must be 'log' or 'linear', got {warmup_type!r}")
        self.optimizer = optimizer
        self.total_num_steps = int(total_num_steps)
        self.warmup_min_ratio = float(warmup_min_ratio)
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.cos_min_ratio = float(cos_min_ratio)
        self.warmup_type = warmup_type
        self.last_batch_iteration = last_batch_iteration
        if self.total_num_steps < self.warmup_num_steps:
            log.warning("WarmupCosineLR: total_num_steps %d is less than warmup_num_steps %d",
                        self.total_num_steps, self.warmup_num_steps)
        self.org_lrs = [g["lr"] for g in optimizer.param_groups]
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
        return {"last_batch_iteration": self.last_batch_iteration, "org_lrs": list(self.org_lrs)}

    def load_state_dict(self, sd: dict) -> None:
        if "org_lrs" in sd:
            self.org_lrs = [float(x) for x in sd["org_lrs"]]
        super().load_state_dict(sd)


class OneCycle(_Schedule):
    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0,
                 cycle_first_step_size=2000, cycle_second_step_size=None, cycle_first_stair_count=0,
                 cycle_second_stair_count=None, decay_step_size=0, cycle_momentum=True,
                 cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.0, last_batch_iteration=-1):
        self.optimizer = optimizer
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        # DeepSpeed accepts the stair counts but its schedule does not use them; so do we.
        self.first_stair_count = cycle_first_stair_count
        self.second_stair_count = (cycle_first_stair_count if cycle_second_stair_count is None
                                   else cycle_second_stair_count)
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
        n = len(optimizer.param_groups)
        self.min_moms = [float(cycle_min_mom)] * n
        self.max_moms = [float(cycle_max_mom)] * n
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = _write_lrs(optimizer, self.min_lrs)
            if self.cycle_momentum:
                self._write_moms(self.min_moms)

    def _scale(self) -> float:
        it = self.last_batch_iteration + 1
        cycle = math.floor(1 + it / self.total_size)
        x = 1.0 + it / self.total_size - cycle
        if x <= self.step_ratio:
            return x / self.step_ratio
        return (x - 1) / (self.step_ratio - 1)

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
        t = self.last_batch_iteration
        if t < self.total_size:
            s = self._scale()
            return [hi - (hi - lo) * s for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        k = (t - self.total_size + 1) / self.decay_step_size
        return [hi * (1 + self.decay_mom_rate * k) for hi in self.max_moms]

    def _write_moms(self, moms):
        for group, m in zip(self.optimizer.param_groups, moms):
            group["betas"] = (m, group["betas"][1] if "betas" in group else 0.99)

    def step(self, last_batch_iteration: int | None = None) -> None:
        super().step(last_batch_iteration)
        if self.cycle_momentum:
            self._write_moms(self.get_mom())

    def load_state_dict(self, sd: dict) -> None:
        super().load_state_dict(sd)
        if self.cycle_momentum and self.last_batch_iteration >= 0:
            self._write_moms(self.get_mom())


SCHEDULERS = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR,
              "WarmupCosineLR": WarmupCosineLR, "OneCycle": OneCycle}


def build_scheduler(name: str, params: dict, optimizer):
    """Constructs the scheduler named in a validated config section."""
    return SCHEDULERS[name](optimizer, **params)
