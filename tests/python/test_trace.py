"""The engine's timeline (runtime/trace.py): off costs nothing and writes nothing; on, it
writes a Chrome trace whose spans nest and carry the names given."""
import json
import threading

import pytest

pytest.importorskip("torch", reason="the runtime needs torch")

from zspeed.runtime import trace  # noqa: E402


def test_off_is_one_shared_null_context(monkeypatch):
    monkeypatch.delenv("ZSPEED_TRACE", raising=False)
    t = trace.tracer_from(None)
    assert t is trace.OFF and not t.enabled
    assert t.span("a") is t.span("b")  # no allocation per call
    with t.span("x"), t.cuda_span("y"):
        t.instant("z")
    t.flush()


def test_spans_are_written_as_chrome_trace(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    monkeypatch.setenv("ZSPEED_TRACE", str(path))
    t = trace.tracer_from(None, rank=1, world_size=2)
    assert t.path.endswith("t.rank1.json")
    with t.span("step", cat="engine", n=3):
        with t.span("optimizer chunk"):
            pass
        t.instant("overflow")

    def worker():
        with t.span("io"):
            pass
    th = threading.Thread(target=worker, name="zspeed-io")
    th.start()
    th.join()
    t.flush()
    doc = json.loads(open(t.path).read())
    ev = {e["name"]: e for e in doc["traceEvents"] if e["ph"] in ("X", "i")}
    assert set(ev) == {"step", "optimizer chunk", "overflow", "io"}
    outer, inner = ev["step"], ev["optimizer chunk"]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3
    assert outer["args"] == {"n": 3} and outer["pid"] == 1
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "zspeed-io" in names and ev["io"]["tid"] != outer["tid"]


def test_missing_folder_is_a_config_error(tmp_path):
    from zspeed.runtime.config import ConfigError
    with pytest.raises(ConfigError, match="does not exist"):
        trace.tracer_from(str(tmp_path / "no" / "t.json"))


def test_engine_writes_its_phases(tmp_path):
    import engine_helpers as eh
    import zspeed
    path = tmp_path / "engine.json"
    cfg = eh.config(zero_optimization=eh.OFFLOAD, zspeed_trace=str(path))
    e, *_ = zspeed.initialize(model=eh.mlp(), config=cfg)
    eh.train(e, eh.regression_data(3))
    e.close()
    doc = json.loads(path.read_text())
    names = [ev["name"] for ev in doc["traceEvents"] if ev["ph"] == "X"]
    for n in ("forward", "backward", "optimizer step", "gather gradients", "gradient statistics", "apply",
              "cpu step"):
        assert names.count(n) >= 3 or (n == "cpu step" and names.count(n) >= 3), (n, names)


def test_activation_checkpointing_section_configures_checkpointing():
    import engine_helpers as eh
    import zspeed
    from zspeed import checkpointing
    checkpointing.reset()
    zspeed.initialize(model=eh.mlp(), config=eh.config(activation_checkpointing={"cpu_checkpointing": True,
                                                                                "profile": True}))
    assert checkpointing.is_configured() and checkpointing._setting("cpu_checkpointing") is True
    checkpointing.reset()


# -- a trace path that someone else can write (issue 24, item 10) --------------------------------------
@pytest.mark.parametrize("kind", ["folder", "fifo", "symlink", "device"])
def test_a_trace_path_that_is_not_a_regular_file_is_refused_at_start(tmp_path, kind, monkeypatch):
    import os
    import stat
    import sys
    import engine_helpers as eh
    import zspeed
    from zspeed.runtime.config import ConfigError
    monkeypatch.delenv("ZSPEED_TRACE", raising=False)
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    p = tmp_path / "trace.json"
    if kind == "folder":
        p.mkdir()
    elif kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs")
        os.mkfifo(p)  # a start only looks at it (lstat): nothing can block
    elif kind == "symlink":
        if sys.platform == "win32":
            pytest.skip("symlinks need privileges on Windows")
        os.symlink(victim, p)
    else:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full")
        p = type(p)("/dev/full")
    with pytest.raises(ConfigError, match="zspeed_trace.*not a regular file") as ei:
        zspeed.initialize(model=eh.mlp(), config=eh.config(zspeed_trace=str(p)))
    assert str(p) in str(ei.value)
    assert victim.read_text() == "precious"
    assert os.path.lexists(p) and not stat.S_ISREG(os.lstat(p).st_mode)
    monkeypatch.setenv("ZSPEED_TRACE", str(p))
    with pytest.raises(ConfigError, match="ZSPEED_TRACE.*not a regular file"):
        trace.tracer_from(None)


def test_the_trace_flush_never_writes_through_a_planted_name(tmp_path, monkeypatch):
    import os
    import sys
    if sys.platform == "win32":
        pytest.skip("symlinks need privileges on Windows")
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    p = tmp_path / "trace.json"
    monkeypatch.delenv("ZSPEED_TRACE", raising=False)
    t = trace.tracer_from(str(p))
    with t.span("a"):
        pass
    # The temporary name an older zspeed used, planted as a link to the victim.
    os.symlink(victim, f"{p}.tmp-{os.getpid()}")
    t.flush()
    assert victim.read_text() == "precious" and json.loads(p.read_text())["traceEvents"]
    # The trace path replaced by a folder or a symlink after the start: never replaced, and the
    # flush (the engine's, every 20 steps) does not raise: training goes on.
    p.unlink()
    p.mkdir()
    t.flush()
    assert p.is_dir() and not p.is_symlink() and not os.listdir(p)
    p.rmdir()
    os.symlink(victim, p)
    t.flush()
    assert os.readlink(p) == str(victim) and victim.read_text() == "precious"
    assert sorted(n for n in os.listdir(tmp_path) if "tmp" in n) == [f"trace.json.tmp-{os.getpid()}"]
