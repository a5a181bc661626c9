"""The engine's timers, as DeepSpeed's engine keeps them: ``engine.tput_timer`` (samples per
second, config section ``timers.throughput``) and ``engine.timers`` (named wall-clock timers,
which ``wall_clock_breakdown`` fills).

With ``wall_clock_breakdown`` true each forward, backward and step() is timed twice: a
"micro" timer for the micro-batch (``fwd_microstep``, ``bwd_microstep``,
``bwd_inner_microstep``, ``bwd_allreduce_microstep``, ``step_microstep``), printed on rank 0
at every step() call, and a "global" one that adds up the micro-batches of an optimizer step
(``fwd``, ``bwd``, ``bwd_inner``, ``bwd_allreduce``, ``step``), printed at each accumulation
boundary. ``bwd_inner`` is autograd's backward, ``bwd_allreduce`` the gradient work the
engine does after it (waiting for the reductions still in flight, moving gradients where the
step reads them); zspeed reduces most gradients during the backward, so most reduction time
shows in ``bwd_inner``. ``engine.get_wall_clock_timers()`` returns the micro and global times
of the last step() call (milliseconds). Off, the timers are not started at all.
"""
from __future__ import annotations

import contextlib

from ..utils import timer as T

__all__ = ["EngineTiming"]

_MICRO = {"fwd": T.FORWARD_MICRO_TIMER, "bwd": T.BACKWARD_MICRO_TIMER, "bwd_inner": T.BACKWARD_INNER_MICRO_TIMER,
          "bwd_reduce": T.BACKWARD_REDUCE_MICRO_TIMER, "step": T.STEP_MICRO_TIMER}
# the monitor's names of the global timers, in _GLOBAL's order
_MONITOR_LABELS = ("forward", "backward", "backward_inner", "backward_allreduce", "step")
_GLOBAL = {"fwd": T.FORWARD_GLOBAL_TIMER, "bwd": T.BACKWARD_GLOBAL_TIMER, "bwd_inner": T.BACKWARD_INNER_GLOBAL_TIMER,
           "bwd_reduce": T.BACKWARD_REDUCE_GLOBAL_TIMER, "step": T.STEP_GLOBAL_TIMER}


class EngineTiming:
    """The engine's throughput timer and its wall-clock breakdown (see the module's text)."""

    def __init__(self, config, batch_size: int, rank: int):
        spp = config.steps_per_print
        self.tput = T.ThroughputTimer(_Switches(config.throughput_timer), batch_size=batch_size,
                                      steps_per_output=spp if spp and spp != float("inf") else None)
        self.timers = T.SynchronizedWallClockTimer()
        on = config.wall_clock_breakdown
        # phase -> the timers it starts (none with the breakdown off)
        self._names = {k: [_MICRO[k], _GLOBAL[k]] if on else [] for k in _MICRO}
        self._micro = list(_MICRO.values()) if on else []
        self._global = list(_GLOBAL.values()) if on else []
        self._ranks = [0]
        self._rank = rank
        self.snapshot: dict = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        """Times ``name`` ("fwd", "bwd", "bwd_inner", "bwd_reduce", "step") while the block runs."""
        names = self._names[name]
        for n in names:
            self.timers(n).start()
        try:
            yield
        finally:
            for n in names:
                t = self.timers(n)
                if t.started_:
                    t.stop()

    def monitor_events(self, step: int, lr: float, loss_scale: float | None) -> list:
        """DeepSpeed's monitor events of an optimizer step, at ``step`` (global_samples): the
        learning rate, the fp16 loss scale (None: not fp16) and, with wall_clock_breakdown, the
        step's summed times (milliseconds)."""
        events = [("Train/Samples/lr", lr, step)]
        if loss_scale is not None:
            events.append(("Train/Samples/loss_scale", loss_scale, step))
        return events + [(f"Train/Samples/elapsed_time_ms_{label}", self.timers(name).elapsed(reset=False), step)
                         for label, name in zip(_MONITOR_LABELS, self._global)]

    def after_step(self, boundary: bool) -> None:
        """The end of a step() call: the throughput timer's span closes, and with the breakdown
        on the micro times (and, on a boundary, the global ones) are printed and reset."""
        self.tput.stop(global_step=boundary, report_speed=self._rank == 0)
        shown = self._micro + (self._global if boundary else [])
        if not shown:
            return
        self.snapshot = {n: self.timers(n).elapsed(reset=False) for n in self._micro + self._global}
        self.timers.log(self._micro, ranks=self._ranks)
        if boundary:
            self.timers.log(self._global, ranks=self._ranks)


class _Switches:
    """The parsed ``timers.throughput`` section as the attributes ThroughputTimer reads."""

    def __init__(self, section: dict):
        self.enabled = bool(section["enabled"])
        self.synchronized = bool(section["synchronized"])
