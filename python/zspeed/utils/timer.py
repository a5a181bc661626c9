"""DeepSpeed's timers (``deepspeed.utils.timer``): the engine's throughput timer
(``engine.tput_timer``), the named wall-clock timers (``engine.timers``, which
``wall_clock_breakdown`` fills with the forward, backward and step times) and the
do-nothing stand-in (``NoopTimer``).

Times are host wall-clock seconds read with ``time.perf_counter``; where ``synchronized``
is on (the default, as in DeepSpeed) the host first waits for the work queued on the current
CUDA stream, so that a time covers the device work the host launched and not only the
launching. Only the current stream is waited for (DeepSpeed waits for the whole device): the
engine's copies and CPU-step transfers on its side streams keep overlapping. With no CUDA
device in use nothing is synchronized.
"""
from __future__ import annotations

import logging
import time

__all__ = ["ThroughputTimer", "SynchronizedWallClockTimer", "NoopTimer", "trim_mean",
           "FORWARD_MICRO_TIMER", "FORWARD_GLOBAL_TIMER", "BACKWARD_MICRO_TIMER", "BACKWARD_GLOBAL_TIMER",
           "BACKWARD_INNER_MICRO_TIMER", "BACKWARD_INNER_GLOBAL_TIMER", "BACKWARD_REDUCE_MICRO_TIMER",
           "BACKWARD_REDUCE_GLOBAL_TIMER", "STEP_MICRO_TIMER", "STEP_GLOBAL_TIMER", "TIME_EPSILON"]

log = logging.getLogger("zspeed")

# The names of the engine's timers (DeepSpeed's): "micro" ones cover one micro-batch, "global"
# ones add up the micro-batches of one optimizer step.
FORWARD_MICRO_TIMER = "fwd_microstep"
FORWARD_GLOBAL_TIMER = "fwd"
BACKWARD_MICRO_TIMER = "bwd_microstep"
BACKWARD_GLOBAL_TIMER = "bwd"
BACKWARD_INNER_MICRO_TIMER = "bwd_inner_microstep"
BACKWARD_INNER_GLOBAL_TIMER = "bwd_inner"
BACKWARD_REDUCE_MICRO_TIMER = "bwd_allreduce_microstep"
BACKWARD_REDUCE_GLOBAL_TIMER = "bwd_allreduce"
STEP_MICRO_TIMER = "step_microstep"
STEP_GLOBAL_TIMER = "step"
TIME_EPSILON = 1e-6  # keeps a rate finite when a measured time rounds to 0

_GIB = float(1 << 30)


def _device_sync() -> None:
    """Waits for the work queued on the current CUDA stream, when CUDA is in use (never starts it)."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()


def _device_memory() -> tuple[float, float]:
    """(allocated, peak allocated) GiB on the current CUDA device; zeros without one."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.memory_allocated() / _GIB, torch.cuda.max_memory_allocated() / _GIB
    return 0.0, 0.0


def trim_mean(data, trim_percent: float) -> float:
    """The mean of ``data`` without its lowest and highest ``trim_percent`` (a fraction in
    [0, 1]) of values, rounded to whole values at each end; 0 for no data. ``data`` is not
    reordered."""
    if not 0.0 <= trim_percent <= 1.0:
        raise ValueError(f"trim_mean: trim_percent must be a fraction between 0 and 1, got {trim_percent!r}")
    values = sorted(data)
    if not values:
        return 0
    cut = int(round(len(values) * trim_percent))
    kept = values[cut:len(values) - cut]
    if not kept:
        raise ValueError(f"trim_mean: trimming {trim_percent:g} at each end leaves none of {len(values)} values")
    return sum(kept) / len(kept)


class _Settings:
    """The ``timers.throughput`` config section's two switches, for a ThroughputTimer built
    without one."""

    def __init__(self, enabled: bool = True, synchronized: bool = True):
        self.enabled = enabled
        self.synchronized = synchronized


class ThroughputTimer:
    """Samples per second over the optimizer steps, as DeepSpeed's engine keeps it
    (``engine.tput_timer``).

    ``start()`` opens a measured span (the engine calls it at each forward) and ``stop()``
    closes it (the engine calls it at each ``step()``, with ``global_step`` true on an
    accumulation boundary). The first ``start_step`` optimizer steps are not measured (warm-up:
    allocation, compilation); after them every span adds its time, and
    :meth:`avg_samples_per_sec` is ``batch_size`` over the mean time per optimizer step.
    With ``steps_per_output`` N, every Nth optimizer step logs the running and current rates
    (``report_speed``). ``config`` is the ``timers.throughput`` section (an object with
    ``enabled`` and ``synchronized``; None: both on); disabled, start and stop do nothing.
    """

    def __init__(self, config=None, batch_size=None, start_step: int = 2, steps_per_output=None,
                 monitor_memory: bool = False, logging_fn=None):
        self.config = _Settings() if config is None else config
        self.batch_size = 1 if batch_size is None else batch_size
        self.start_step = start_step
        self.steps_per_output = steps_per_output
        self.monitor_memory = monitor_memory
        if monitor_memory:
            try:
                import psutil  # noqa: F401
            except ImportError:
                raise ImportError("ThroughputTimer(monitor_memory=True) reports host memory through psutil: "
                                  "pip install psutil, or leave monitor_memory False") from None
        self.logging = log.info if logging_fn is None else logging_fn
        self.initialized = False
        self.started = False
        self.start_time = 0
        self.end_time = 0
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0
        self.step_elapsed_time = 0

    def update_epoch_count(self) -> None:
        """A new epoch: counted, and the micro-step count starts again."""
        self.epoch_count += 1
        self.micro_step_count = 0

    def start(self) -> None:
        if not self.config.enabled:
            return
        self.initialized = True
        self.started = True
        if self.global_step_count >= self.start_step:  # past the warm-up: this span is measured
            if self.config.synchronized:
                _device_sync()
            self.start_time = time.perf_counter()

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        """Closes the span start() opened (nothing when none is open); ``global_step``: it ends
        an optimizer step."""
        if not self.config.enabled or not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if self.start_time <= 0:  # still in the warm-up
            return
        if self.config.synchronized:
            _device_sync()
        self.end_time = time.perf_counter()
        span = self.end_time - self.start_time
        self.total_elapsed_time += span
        self.step_elapsed_time += span
        if not global_step:
            return
        if report_speed and self.steps_per_output and self.global_step_count % self.steps_per_output == 0:
            alloc, peak = _device_memory()
            self.logging(f"throughput: epoch {self.epoch_count} micro-step {self.micro_step_count} step "
                         f"{self.global_step_count}: {self.avg_samples_per_sec():.2f} samples/s on average, "
                         f"{self.batch_size / (self.step_elapsed_time + TIME_EPSILON):.2f} in this step; device "
                         f"memory {alloc:.2f} GiB allocated, {peak:.2f} GiB at most")
            if self.monitor_memory:
                import psutil
                self.logging(f"throughput: step {self.global_step_count}: host memory "
                             f"{psutil.virtual_memory().percent}% used, swap {psutil.swap_memory().percent}%")
        self.step_elapsed_time = 0

    def avg_samples_per_sec(self) -> float:
        """``batch_size`` over the mean measured time of an optimizer step after the warm-up;
        -inf before any optimizer step (and before the first measured one ends)."""
        measured = self.global_step_count - self.start_step
        if self.global_step_count <= 0 or measured <= 0 or self.total_elapsed_time <= 0:
            return float("-inf")
        return self.batch_size / (self.total_elapsed_time / measured)


class SynchronizedWallClockTimer:
    """Named wall-clock timers (``engine.timers``; ``timers("name").start()`` / ``.stop()``).
    A timer keeps each started-stopped span; ``elapsed()`` is their sum in milliseconds,
    ``mean()`` their trimmed mean (10% cut at each end). Each start and stop waits for the
    current CUDA stream first (hence "synchronized"), so a span covers the device work launched
    in it."""

    class Timer:
        def __init__(self, name: str):
            self.name_ = name
            self.started_ = False
            self.start_time = 0.0
            self.end_time = 0.0
            self.event_timers: list[float] = []  # the closed spans, seconds
            self.elapsed_records: list[float] | None = None

        def start(self) -> None:
            if self.started_:
                raise RuntimeError(f"timer {self.name_!r} was started twice: stop() it before starting it again")
            _device_sync()
            self.start_time = time.perf_counter()
            self.started_ = True

        def stop(self, reset: bool = False, record: bool = False) -> None:
            """Closes the open span (``reset`` and ``record``: DeepSpeed's arguments, no effect)."""
            del reset, record
            if not self.started_:
                raise RuntimeError(f"timer {self.name_!r} was stopped without being started")
            _device_sync()
            self.end_time = time.perf_counter()
            self.event_timers.append(self.end_time - self.start_time)
            self.started_ = False

        def reset(self) -> None:
            self.started_ = False
            self.elapsed_records = None
            self.event_timers.clear()

        def elapsed(self, reset: bool = True) -> float:
            """The spans' total in milliseconds (an open span counts up to now and stays open);
            ``reset``: the spans are dropped afterwards."""
            running = self.started_
            if running:
                self.stop()
            self.elapsed_records = [s * 1000.0 for s in self.event_timers]
            total = sum(self.elapsed_records)
            if reset:
                self.reset()
            if running:
                self.start()
            return total

        def mean(self) -> float:
            """The trimmed mean of the spans, milliseconds."""
            self.elapsed(reset=False)
            return trim_mean(self.elapsed_records, 0.1)

    def __init__(self):
        self.timers: dict[str, SynchronizedWallClockTimer.Timer] = {}

    def __call__(self, name: str) -> "SynchronizedWallClockTimer.Timer":
        t = self.timers.get(name)
        if t is None:
            t = self.timers[name] = self.Timer(name)
        return t

    def get_timers(self) -> dict:
        return self.timers

    @staticmethod
    def memory_usage() -> str:
        alloc, peak = _device_memory()
        return f" | device memory allocated {alloc:.4f} GiB, at most {peak:.4f} GiB"

    def log(self, names, normalizer: float = 1.0, reset: bool = True, memory_breakdown: bool = False,
            ranks=None) -> None:
        """Prints "time (ms) | name: total | ..." for the timers among ``names`` that exist,
        each divided by ``normalizer``, on ``ranks`` (default rank 0), whatever the log level."""
        from .logging import print_dist
        if not normalizer > 0:
            raise ValueError(f"timers.log: normalizer must be > 0, got {normalizer!r}")
        parts = [f"{n}: {self.timers[n].elapsed(reset=reset) / normalizer:.2f}" for n in names if n in self.timers]
        text = " | ".join(["time (ms)"] + parts) + (self.memory_usage() if memory_breakdown else "")
        print_dist(text, ranks=ranks or [0])

    def get_mean(self, names, normalizer: float = 1.0, reset: bool = True) -> dict:
        """{name: trimmed mean of its spans in milliseconds / normalizer} for the timers among
        ``names`` that exist (``reset``: DeepSpeed's argument; the spans are kept)."""
        del reset
        if not normalizer > 0:
            raise ValueError(f"timers.get_mean: normalizer must be > 0, got {normalizer!r}")
        return {n: self.timers[n].mean() / normalizer for n in names if n in self.timers}


class NoopTimer:
    """A stand-in for SynchronizedWallClockTimer that measures nothing."""

    class Timer:
        def start(self) -> None:
            pass

        def reset(self) -> None:
            pass

        def stop(self, **kwargs) -> None:
            pass

        def elapsed(self, **kwargs) -> float:
            return 0

        def mean(self) -> float:
            return 0

    def __init__(self):
        self.timer = self.Timer()

    def __call__(self, name: str):
        return self.timer

    def get_timers(self) -> dict:
        return {}

    def log(self, names, normalizer: float = 1.0, reset: bool = True, memory_breakdown: bool = False,
            ranks=None) -> None:
        pass

    def get_mean(self, names, normalizer: float = 1.0, reset: bool = True) -> dict:
        return {}
