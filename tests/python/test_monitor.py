"""DeepSpeed's monitors (zspeed.monitor; config sections tensorboard, csv_monitor, wandb, comet):
the engine writes DeepSpeed's events at each optimizer step on rank 0 (the learning rate, the fp16
loss scale, the step's timers with wall_clock_breakdown, at global_samples), scripts add theirs
through engine.monitor.write_events, and each monitor hands them to its package as DeepSpeed's
does. CSV files are read back; TensorBoard, wandb and Comet are replaced by recording stand-ins
of their packages (the calls zspeed makes are what is tested, not those packages)."""
import csv
import math
import os
import sys
import types

import pytest

torch = pytest.importorskip("torch", reason="the runtime needs torch")

import zspeed  # noqa: E402
from zspeed.monitor import DeepSpeedMonitorConfig, MonitorMaster, get_monitor_config  # noqa: E402
from zspeed.monitor.utils import MonitorUnavailableError  # noqa: E402
from zspeed.runtime.errors import ConfigError  # noqa: E402
from engine_helpers import config as cfg, mlp, regression_data, train  # noqa: E402
from distrun import run_ranks  # noqa: E402

WARMUP = {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2,
                                         "warmup_type": "linear"}}
TIMERS = ("forward", "backward", "backward_inner", "backward_allreduce", "step")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_csv_monitor_writes_the_engines_events(tmp_path):
    c = cfg(gradient_accumulation_steps=2, scheduler=WARMUP,
            csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "job"})
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    assert e.monitor.enabled and e.monitor.csv_monitor is not None and e.monitor.tb_monitor is None
    lrs = []
    data = regression_data(8)
    for i in range(8):  # 8 micro-batches, 4 optimizer steps of 12 samples
        train(e, data, 1, start=i)
        if i % 2 == 1:
            lrs.append(e.get_lr()[0])
    job = tmp_path / "job"
    assert sorted(os.listdir(job)) == ["Train_Samples_lr.csv"]  # no fp16: no loss scale; no breakdown: no times
    rows = read_csv(job / "Train_Samples_lr.csv")
    assert rows[0] == ["step", "lr"]
    assert [int(r[0]) for r in rows[1:]] == [12, 24, 36, 48]  # global_samples after each step
    assert [float(r[1]) for r in rows[1:]] == pytest.approx(lrs, rel=1e-12)  # the lr after the step's scheduler
    assert len(set(lrs)) == 4  # the warm-up moved it each step
    # a script's own events: a one-element tensor is written as its number
    e.monitor.write_events([("Train/Samples/train_loss", torch.tensor(0.25), 48), ("eval acc", 0.5, 48)])
    assert read_csv(job / "Train_Samples_train_loss.csv") == [["step", "train_loss"], ["48", "0.25"]]
    assert read_csv(job / "eval_acc.csv") == [["step", "eval acc"], ["48", "0.5"]]
    with pytest.raises(ValueError, match=r"\(name, value, step\) triples"):
        e.monitor.write_events([("no step", 1.0)])


def test_fp16_loss_scale_and_wall_clock_timers_are_events(tmp_path):
    class InfAt(torch.nn.Module):  # inf outputs on chosen calls: an fp16 overflow, a skipped step
        def __init__(self, inner, bad):
            super().__init__()
            self.inner, self.bad, self.calls = inner, bad, 0

        def forward(self, x):
            self.calls += 1
            out = self.inner(x)
            return out * float("inf") if self.calls in self.bad else out

    c = cfg(fp16={"enabled": True, "initial_scale_power": 10}, wall_clock_breakdown=True,
            csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "j"})
    e, *_ = zspeed.initialize(model=InfAt(mlp(), {2}), config=c)
    scales, applied = [], []
    for x, y in regression_data(3):
        e.backward(torch.nn.functional.mse_loss(e(x.half()).float(), y))
        e.step()
        scales.append(e.loss_scale)
        applied.append(e.was_step_applied())
    assert applied == [True, False, True]
    job = tmp_path / "j"
    names = {f"Train_Samples_elapsed_time_ms_{t}.csv" for t in TIMERS} | {"Train_Samples_lr.csv",
                                                                          "Train_Samples_loss_scale.csv"}
    assert set(os.listdir(job)) == names
    rows = read_csv(job / "Train_Samples_loss_scale.csv")
    assert rows[0] == ["step", "loss_scale"]
    # the skipped step writes its events too (as DeepSpeed's), with the lowered scale
    assert [(int(s), float(v)) for s, v in rows[1:]] == [(6, scales[0]), (12, scales[1]), (18, scales[2])]
    assert scales[1] == scales[0] / 2
    for t in TIMERS:
        rows = read_csv(job / f"Train_Samples_elapsed_time_ms_{t}.csv")
        assert rows[0] == ["step", f"elapsed_time_ms_{t}"] and len(rows) == 4
        assert all(float(v) >= 0 and math.isfinite(float(v)) for _, v in rows[1:])
    fwd = [float(v) for _, v in read_csv(job / "Train_Samples_elapsed_time_ms_forward.csv")[1:]]
    assert all(v > 0 for v in fwd)


def test_monitors_off_write_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    e, *_ = zspeed.initialize(model=mlp(), config=cfg(csv_monitor={"enabled": False}, wandb={"project": "p"}))
    assert not e.monitor.enabled
    train(e, regression_data(2))
    e.monitor.write_events([("x", 1.0, 1), ("not even checked",)])  # nothing is on: nothing is read or written
    assert os.listdir(tmp_path) == []


class _Recorder:
    def __init__(self):
        self.calls = []


def _fake_tensorboard(monkeypatch):
    rec = _Recorder()

    class SummaryWriter:
        def __init__(self, log_dir):
            rec.calls.append(("init", log_dir))

        def add_scalar(self, name, value, step):
            rec.calls.append(("scalar", name, value, step))

        def flush(self):
            rec.calls.append(("flush",))

    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = SummaryWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    monkeypatch.setitem(sys.modules, "tensorboard", types.ModuleType("tensorboard"))
    return rec


def test_tensorboard_monitor_writes_scalars_and_flushes(tmp_path, monkeypatch):
    rec = _fake_tensorboard(monkeypatch)
    out = str(tmp_path / "tb")
    c = cfg(scheduler=WARMUP, tensorboard={"enabled": True, "output_path": out, "job_name": "run1"})
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    assert rec.calls == [("init", os.path.join(out, "run1"))] and os.path.isdir(os.path.join(out, "run1"))
    lrs = []
    for i in range(2):
        train(e, regression_data(2), 1, start=i)
        lrs.append(e.get_lr()[0])
    assert rec.calls[1:] == [("scalar", "Train/Samples/lr", lrs[0], 6), ("flush",),
                             ("scalar", "Train/Samples/lr", lrs[1], 12), ("flush",)]


def test_a_missing_monitor_package_stops_initialize_with_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard raises ImportError
    with pytest.raises(MonitorUnavailableError, match=r"pip install tensorboard.*\"enabled\": false"):
        zspeed.initialize(model=mlp(), config=cfg(tensorboard={"enabled": True}))
    assert issubclass(MonitorUnavailableError, ImportError)
    monkeypatch.setitem(sys.modules, "comet_ml", types.SimpleNamespace(__version__="3.40.2"))
    with pytest.raises(MonitorUnavailableError, match=r"comet_ml >= 3.41.0, found 3.40.2"):
        zspeed.initialize(model=mlp(), config=cfg(comet={"enabled": True}))


def test_wandb_monitor_inits_and_logs(monkeypatch):
    rec = _Recorder()
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: rec.calls.append(("init", kw))
    fake.log = lambda data, step=None, commit=None: rec.calls.append(("log", data, step, commit))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    c = cfg(wandb={"enabled": True, "project": "proj", "group": "g", "team": "t"})
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    train(e, regression_data(1))
    assert rec.calls == [("init", {"project": "proj", "group": "g", "entity": "t"}),
                         ("log", {"Train/Samples/lr": e.get_lr()[0]}, 6, None)]


def test_comet_monitor_starts_an_experiment_and_thins_events(monkeypatch):
    rec = _Recorder()

    class Experiment:
        def set_name(self, name):
            rec.calls.append(("name", name))

        def log_metric(self, name, value, step=None):
            rec.calls.append(("metric", name, value, step))

    fake = types.ModuleType("comet_ml")
    fake.__version__ = "3.49.1"
    fake.start = lambda **kw: (rec.calls.append(("start", kw)), Experiment())[1]
    monkeypatch.setitem(sys.modules, "comet_ml", fake)
    c = cfg(comet={"enabled": True, "samples_log_interval": 12, "project": "p", "experiment_name": "x",
                   "mode": "create", "online": False})
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    assert rec.calls == [("start", {"api_key": None, "project": "p", "workspace": None, "experiment_key": None,
                                    "mode": "create", "online": False}), ("name", "x")]
    train(e, regression_data(5))  # events at 6, 12, 18, 24, 30 samples; sent at 6, 18, 30 (every 12)
    assert [c[3] for c in rec.calls[2:]] == [6, 18, 30]
    assert all(c[:2] == ("metric", "Train/Samples/lr") for c in rec.calls[2:])


def test_monitor_config_objects():
    d = DeepSpeedMonitorConfig()
    assert not d.enabled and d.tensorboard.job_name == "DeepSpeedJobName" and d.tensorboard.output_path == ""
    assert d.wandb.project == "deepspeed" and d.wandb.group is None and d.comet.samples_log_interval == 100
    m = get_monitor_config({"train_batch_size": 2, "csv_monitor": {"enabled": True, "job_name": "j"}})
    assert m.enabled and m.csv_monitor.job_name == "j" and not m.tensorboard.enabled
    from zspeed.runtime.ds_config import DeepSpeedConfig
    ds = DeepSpeedConfig({"train_batch_size": 2, "wandb": {"enabled": False, "team": "t"}})
    assert ds.monitor_config.wandb.team == "t" and not ds.monitor_config.enabled
    # a bad section raises what DeepSpeed's pydantic models raise (a ValueError either way), naming the key
    with pytest.raises(ValueError, match="csv_monitor.enabled"):
        DeepSpeedMonitorConfig(csv_monitor={"enabled": "yes"})
    with pytest.raises(ValueError, match="enabeld"):
        DeepSpeedMonitorConfig(tensorboard={"enabeld": True})
    with pytest.raises(ConfigError, match="'comet.mode'|comet.mode"):
        zspeed.initialize(model=mlp(), config=cfg(comet={"mode": "sometimes"}))
    # MonitorMaster from a config object with nothing on holds no monitors
    mm = MonitorMaster(d)
    assert (mm.tb_monitor, mm.wandb_monitor, mm.csv_monitor, mm.comet_monitor) == (None, None, None, None)


RANKS = """
import csv, os, sys, torch, zspeed
sys.path.insert(0, {helpers!r})
from engine_helpers import config, mlp, regression_data, train
out = {out!r}
c = config(csv_monitor={{"enabled": True, "output_path": out, "job_name": "job"}})
e, *_ = zspeed.initialize(model=mlp(), config=c)
train(e, regression_data(3))
e.monitor.write_events([("rank", float(e.global_rank), 1)])
print("ENABLED", e.monitor.enabled, e.monitor.csv_monitor is not None)
"""


def test_only_rank_0_writes(tmp_path):
    out = str(tmp_path / "logs")
    res = run_ranks(2, RANKS.format(helpers=os.path.dirname(__file__), out=out), timeout=240)
    for r in res:
        assert r.returncode == 0, r
    assert "ENABLED True True" in res[0].stdout and "ENABLED True False" in res[1].stdout
    assert read_csv(os.path.join(out, "job", "rank.csv")) == [["step", "rank"], ["1", "0.0"]]
    rows = read_csv(os.path.join(out, "job", "Train_Samples_lr.csv"))
    assert [int(r[0]) for r in rows[1:]] == [12, 24, 36]  # 2 ranks x micro-batch 6 per step


MISSING = """
import sys, torch, zspeed
sys.path.insert(0, {helpers!r})
sys.modules["tensorboard"] = None  # the package is not installed on any rank
from engine_helpers import config, mlp
from zspeed.monitor.utils import MonitorUnavailableError
try:
    zspeed.initialize(model=mlp(), config=config(tensorboard={{"enabled": True}}))
except MonitorUnavailableError as e:
    print("REFUSED", "pip install tensorboard" in str(e))
"""


def test_a_missing_package_stops_every_rank(tmp_path):
    # checked on every rank, not only on rank 0 (which alone writes): no rank is left waiting
    res = run_ranks(2, MISSING.format(helpers=os.path.dirname(__file__)), timeout=180, fresh=True)
    for r in res:
        assert r.returncode == 0 and "REFUSED True" in r.stdout, r


# -- issue 52, findings 15, 16 ---------------------------------------------------------------------
@pytest.mark.parametrize("section", ["csv_monitor", "tensorboard"])
@pytest.mark.parametrize("job", ["../..", "..", "/tmp/elsewhere", "a/b", "", "x\\y"])
def test_a_job_name_that_leaves_output_path_is_refused(tmp_path, section, job):
    c = cfg(**{section: {"enabled": True, "output_path": str(tmp_path / "runs"), "job_name": job}})
    with pytest.raises(ConfigError, match=f"{section}.job_name"):
        zspeed.initialize(model=mlp(), config=c)
    assert not (tmp_path / "runs").exists()


def test_an_unwritable_output_path_is_a_config_error_naming_the_key(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    c = cfg(csv_monitor={"enabled": True, "output_path": str(blocker / "runs"), "job_name": "job"})
    with pytest.raises(ConfigError, match="csv_monitor.output_path") as info:
        zspeed.initialize(model=mlp(), config=c)
    assert "give an output_path you can write to" in str(info.value)


def test_an_unwritable_output_path_fails_initialize_on_every_rank(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    res = run_ranks(2, f"""
        import time, torch, zspeed
        from zspeed.runtime.errors import ConfigError
        zspeed.init_distributed()
        t0 = time.monotonic()
        try:
            zspeed.initialize(model=torch.nn.Linear(4, 4), config={{"train_micro_batch_size_per_gpu": 1,
                "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}},
                "csv_monitor": {{"enabled": True, "output_path": {str(blocker / "runs")!r}, "job_name": "j"}}}})
            print("NO ERROR")
        except ConfigError as e:
            print("CONFIGERROR", round(time.monotonic() - t0, 1), str(e)[:200])
    """, timeout=120)
    for r in res:
        assert r.returncode == 0, r
        line = [x for x in r.stdout.splitlines() if x.startswith(("CONFIGERROR", "NO ERROR"))][0]
        assert line.startswith("CONFIGERROR") and "csv_monitor.output_path" in line, r.stdout
        assert float(line.split()[1]) < 8, line  # at once, not after a collective timeout


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges on Windows")
def test_the_csv_monitor_never_writes_through_a_link_planted_in_its_folder(tmp_path, caplog):
    job = tmp_path / "job"
    job.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (job / "Train_Samples_lr.csv").symlink_to(victim)
    c = cfg(csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "job"})
    e, *_ = zspeed.initialize(model=mlp(), config=c)
    import logging
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        train(e, regression_data(2), 2)  # the steps stand; the write is refused and logged
    assert e.global_steps == 2
    assert victim.read_text() == "precious\n"
    assert "writing the monitors' step events failed" in caplog.text
