"""DeepSpeed's timers (zspeed.utils.timer, runtime/timing.py): engine.tput_timer counts and
measures the steps as DeepSpeed's ThroughputTimer does, wall_clock_breakdown times and prints
the forward, backward and step, and the timers section is validated. Times are checked with a
fake clock (exact values), never against real durations."""
import logging

import pytest

torch = pytest.importorskip("torch", reason="the runtime needs torch")

import zspeed  # noqa: E402
from zspeed.runtime.config import ConfigError  # noqa: E402
from zspeed.utils import timer as T  # noqa: E402
from engine_helpers import config as cfg, mlp, regression_data, train  # noqa: E402


class FakeClock:
    """time.perf_counter advancing by ``tick`` seconds per call."""

    def __init__(self, start=100.0, tick=0.5):
        self.now, self.tick = start, tick

    def __call__(self):
        self.now += self.tick
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(T.time, "perf_counter", c)
    return c


def test_throughput_timer_skips_the_warm_up_and_averages_the_rest(clock):
    t = T.ThroughputTimer(batch_size=12, start_step=2)
    t.stop()  # not started: nothing
    assert (t.initialized, t.micro_step_count, t.start_time) == (False, 0, 0)
    assert t.avg_samples_per_sec() == float("-inf")
    for _ in range(4):  # two optimizer steps of two micro-batches: the warm-up, not measured
        t.start()
        t.stop(global_step=t.micro_step_count % 2 == 1)
    assert (t.global_step_count, t.micro_step_count, t.total_elapsed_time) == (2, 4, 0)
    assert t.avg_samples_per_sec() == float("-inf")
    for i in range(6):  # three measured optimizer steps; each span is one tick of the fake clock
        t.start()
        t.stop(global_step=i % 2 == 1)
        assert t.step_elapsed_time == (0 if i % 2 == 1 else clock.tick)
    assert t.global_step_count == 5 and t.total_elapsed_time == pytest.approx(6 * clock.tick)
    # 12 samples per optimizer step, two 0.5 s spans each: 12 samples/s
    assert t.avg_samples_per_sec() == pytest.approx(12 / (6 * clock.tick / 3))
    t.update_epoch_count()
    assert (t.epoch_count, t.micro_step_count) == (1, 0)


def test_throughput_timer_logs_every_steps_per_output_steps(clock):
    lines = []
    t = T.ThroughputTimer(batch_size=3, start_step=0, steps_per_output=2, logging_fn=lines.append)
    for _ in range(5):
        t.start()
        t.stop(global_step=True)
    assert len(lines) == 2 and "step 2:" in lines[0] and "step 4:" in lines[1]
    assert "samples/s" in lines[0]
    t.start()
    t.stop(global_step=True, report_speed=False)
    t.start()
    t.stop(global_step=True, report_speed=False)
    assert len(lines) == 2


def test_throughput_timer_disabled_counts_nothing(clock):
    class Off:
        enabled, synchronized = False, True
    t = T.ThroughputTimer(Off(), batch_size=4, start_step=0)
    t.start()
    t.stop(global_step=True)
    assert (t.initialized, t.global_step_count, t.micro_step_count) == (False, 0, 0)


def test_trim_mean_against_a_reference():
    g = torch.Generator().manual_seed(3)
    data = torch.rand(37, generator=g, dtype=torch.float64).tolist()
    for frac in (0.0, 0.1, 0.25):
        k = int(round(len(data) * frac))
        kept = sorted(data)[k:len(data) - k]
        assert T.trim_mean(data, frac) == pytest.approx(sum(kept) / len(kept), rel=1e-12)
    before = list(data)
    T.trim_mean(data, 0.1)
    assert data == before  # not reordered
    assert T.trim_mean([], 0.1) == 0
    with pytest.raises(ValueError, match="between 0 and 1"):
        T.trim_mean(data, 1.5)
    with pytest.raises(ValueError, match="leaves none"):
        T.trim_mean([1.0, 2.0], 0.5)


def test_wall_clock_timers_sum_spans_in_milliseconds(clock):
    timers = T.SynchronizedWallClockTimer()
    t = timers("fwd")
    assert timers("fwd") is t and list(timers.get_timers()) == ["fwd"]
    for _ in range(3):
        t.start()
        t.stop()
    with pytest.raises(RuntimeError, match="stopped without being started"):
        t.stop()
    t.start()
    with pytest.raises(RuntimeError, match="started twice"):
        t.start()
    # three closed spans and the open one (closed and reopened by elapsed): 4 ticks
    assert t.elapsed(reset=False) == pytest.approx(4 * clock.tick * 1000)
    assert t.started_
    t.stop()
    assert t.mean() == pytest.approx(clock.tick * 1000)
    assert timers.get_mean(["fwd", "absent"], normalizer=2) == {"fwd": pytest.approx(clock.tick * 500)}
    assert t.elapsed() > 0 and t.elapsed() == 0  # reset by the first call
    with pytest.raises(ValueError, match="normalizer"):
        timers.log(["fwd"], normalizer=0)


def test_noop_timer_measures_nothing():
    n = T.NoopTimer()
    n("x").start()
    n("x").stop()
    assert n("x").elapsed() == 0 and n("y").mean() == 0 and n.get_timers() == {} and n.get_mean(["x"]) == {}
    n.log(["x"])


def test_engine_tput_timer_counts_the_engines_steps():
    c = cfg(gradient_accumulation_steps=2, steps_per_print=2)
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    t = e.tput_timer
    assert t.batch_size == e.train_batch_size() == 12 and t.start_step == 2 and t.steps_per_output == 2
    assert not t.initialized and t.global_step_count == 0
    train(e, regression_data(10))  # 10 micro-batches: 5 optimizer steps
    assert (t.micro_step_count, t.global_step_count) == (10, 5)
    assert t.total_elapsed_time > 0 and t.avg_samples_per_sec() > 0
    assert e.get_wall_clock_timers() == {} and e.timers.get_timers() == {}  # breakdown off: nothing timed
    assert not e.wall_clock_breakdown()


def test_engine_logs_throughput_on_rank_0(caplog):
    e, *_ = zspeed.initialize(model=mlp(), config=cfg(steps_per_print=3))
    with caplog.at_level(logging.INFO, logger="zspeed"):
        train(e, regression_data(6))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("throughput:")]
    assert len(lines) == 2 and "step 3:" in lines[0] and "step 6:" in lines[1]


def test_throughput_timer_can_be_switched_off():
    c = cfg(timers={"throughput": {"enabled": False, "synchronized": False}})
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    train(e, regression_data(3))
    assert e.tput_timer.global_step_count == 0 and not e.tput_timer.initialized


def test_wall_clock_breakdown_prints_micro_and_global_times(capsys):
    e, *_ = zspeed.initialize(model=mlp(), config=cfg(wall_clock_breakdown=True, gradient_accumulation_steps=2))
    assert e.wall_clock_breakdown()
    data = regression_data(4)
    train(e, data, 1)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("[Rank 0] time (ms) | fwd_microstep: ")  # not a boundary: micro only
    for name in ("bwd_microstep", "bwd_inner_microstep", "bwd_allreduce_microstep", "step_microstep"):
        assert f"| {name}: " in out[0]
    train(e, data, 1, start=1)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and out[1].startswith("[Rank 0] time (ms) | fwd: ") and "| step: " in out[1]
    snap = e.get_wall_clock_timers()
    assert set(snap) == {T.FORWARD_MICRO_TIMER, T.BACKWARD_MICRO_TIMER, T.BACKWARD_INNER_MICRO_TIMER,
                         T.BACKWARD_REDUCE_MICRO_TIMER, T.STEP_MICRO_TIMER, T.FORWARD_GLOBAL_TIMER,
                         T.BACKWARD_GLOBAL_TIMER, T.BACKWARD_INNER_GLOBAL_TIMER, T.BACKWARD_REDUCE_GLOBAL_TIMER,
                         T.STEP_GLOBAL_TIMER}
    # the global forward time covers both micro-batches: at least the last one's
    assert snap[T.FORWARD_GLOBAL_TIMER] >= snap[T.FORWARD_MICRO_TIMER] > 0
    assert snap[T.BACKWARD_MICRO_TIMER] >= snap[T.BACKWARD_INNER_MICRO_TIMER]
    assert not any(t.started_ for t in e.timers.get_timers().values())


def test_a_failing_forward_leaves_no_timer_running():
    e, *_ = zspeed.initialize(model=mlp(), config=cfg(wall_clock_breakdown=True))
    with pytest.raises(RuntimeError):
        e(torch.zeros(2, 3))  # wrong width
    assert not any(t.started_ for t in e.timers.get_timers().values())
    train(e, regression_data(2))  # and training goes on


@pytest.mark.parametrize("section, match", [
    ({"throughput": {"enabled": "yes"}}, "timers.throughput.enabled"),
    ({"throughput": {"enabeld": True}}, "enabeld"),
    ({"througput": {}}, "througput"),
])
def test_timers_section_is_validated(section, match):
    with pytest.raises(ConfigError, match=match):
        zspeed.initialize(model=mlp(), config=cfg(timers=section))

