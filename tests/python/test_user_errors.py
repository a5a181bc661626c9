"""zspeed's own errors (ZSpeedError: ConfigError and the like) that end a program print their
message once, first, without a traceback: on one process (the hook `import zspeed` adds) and
under `zspeed launch` (the agent prints each distinct message once for every rank).
ZSPEED_TRACEBACK=1 brings the tracebacks back; other exceptions keep theirs."""
import os
import subprocess
import sys
import textwrap

import pytest

from zspeed import _user_errors as ue

HINT = "ZSPEED_TRACEBACK=1"
BAD_CONFIG = textwrap.dedent("""
    import torch, zspeed
    m = torch.nn.Linear(8, 8)
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2, "offload_optimizr": {"device": "cpu"}}}
    zspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)
""")
MESSAGE = "unknown config key 'offload_optimizr' in section 'zero_optimization'. Did you mean 'offload_optimizer'?"


def _env(**extra):
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                           "MASTER_PORT", "OMP_NUM_THREADS", ue.ENV_TRACEBACK,
                                                           ue.ENV_ERROR_DIR)}
    e["ZSPEED_DEVICE"] = "cpu"
    e.update(extra)
    return e


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", code], env=_env(**env), capture_output=True, text=True,
                          timeout=120)


def test_one_process_prints_the_message_without_a_traceback():
    r = _python("import zspeed\nraise zspeed.ConfigError('the batch size is 0; give train_batch_size > 0')")
    assert r.returncode == 1
    assert r.stderr == ("zspeed: ConfigError: the batch size is 0; give train_batch_size > 0\n"
                        f"(zspeed's own errors print without a traceback; set {HINT} to see it)\n")


def test_zspeed_traceback_brings_the_traceback_back():
    r = _python("import zspeed\nraise zspeed.ConfigError('bad')", ZSPEED_TRACEBACK="1")
    assert r.returncode == 1
    assert "Traceback (most recent call last)" in r.stderr and "ConfigError: bad" in r.stderr


def test_other_exceptions_keep_their_traceback_and_the_programs_own_hook():
    r = _python("import zspeed\nraise RuntimeError('a bug')")
    assert r.returncode == 1 and "Traceback (most recent call last)" in r.stderr and "RuntimeError: a bug" in r.stderr
    # A hook the program set before importing zspeed still sees what is not zspeed's.
    code = textwrap.dedent("""
        import sys
        sys.excepthook = lambda t, e, tb: sys.stderr.write(f"MINE {t.__name__}\\n")
        import zspeed
        if sys.argv[-1] == "z":
            raise zspeed.ConfigError("cfg")
        raise KeyError("k")
    """)
    r = subprocess.run([sys.executable, "-c", code, "k"], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.stderr == "MINE KeyError\n"
    r = subprocess.run([sys.executable, "-c", code, "z"], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.stderr.startswith("zspeed: ConfigError: cfg\n")


def test_a_misspelled_key_in_a_real_script_is_one_line():
    pytest.importorskip("torch")
    r = _python(BAD_CONFIG)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.count(MESSAGE) == 1, r.stderr


def test_job_report_groups_equal_messages_and_returns_the_unexplained_ranks():
    recs = [{"rank": 0, "type": "ConfigError", "message": "m1"}, {"rank": 2, "type": "ConfigError", "message": "m1"},
            {"rank": 1, "type": "CheckpointError", "message": "m2"}]
    text, rest = ue.job_report(recs, [0, 1, 2, 3])
    assert text.splitlines() == ["zspeed: ConfigError on ranks 0 and 2: m1", "zspeed: CheckpointError on rank 1: m2",
                                 f"(zspeed's own errors print without a traceback; set {HINT} to see it)"]
    assert rest == [3]
    assert ue.job_report([], [0]) == ("", [0])


def test_record_writes_only_zspeed_errors_into_the_launchers_folder(tmp_path, monkeypatch):
    import zspeed
    monkeypatch.setenv(ue.ENV_ERROR_DIR, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.delenv(ue.ENV_TRACEBACK, raising=False)
    assert not ue.record(RuntimeError("x"))
    assert ue.record(zspeed.ConfigError("multi\nline"))
    assert ue.read_records(tmp_path) == [{"rank": 3, "type": "ConfigError", "message": "multi\nline"}]
    (tmp_path / "rank4.json").write_text("{not json")  # a torn file is left out, not fatal
    assert len(ue.read_records(tmp_path)) == 1
    monkeypatch.setenv(ue.ENV_TRACEBACK, "1")
    assert not ue.record(zspeed.ConfigError("y"))
    monkeypatch.setenv(ue.ENV_TRACEBACK, "0")
    monkeypatch.setenv(ue.ENV_ERROR_DIR, str(tmp_path / "missing"))
    assert not ue.record(zspeed.ConfigError("z"))  # no folder: the rank prints it itself


def _launch(tmp_path, script_text, **env):
    pytest.importorskip("torch", reason="the launcher starts torch.distributed ranks")
    from distrun import free_port
    script = tmp_path / "train.py"
    script.write_text(script_text)
    return subprocess.run([sys.executable, "-m", "zspeed", "launch", "--num_gpus", "2", "--master_port",
                           str(free_port()), str(script)], env=_env(**env), capture_output=True, text=True,
                          timeout=300)


def test_under_the_launcher_the_message_is_printed_once_for_every_rank(tmp_path):
    r = _launch(tmp_path, BAD_CONFIG)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert out.count(MESSAGE) == 1, out
    assert "Traceback" not in out and "ChildFailedError" not in out and "[rank" not in out, out
    assert f"zspeed: ConfigError on ranks 0 and 1: {MESSAGE}" in out or (
        # torchrun stops the other rank when the first fails; it may not have got as far
        "stopped by the launcher after the error above" in out), out
    assert len(out.strip().splitlines()) <= 4, out


def test_under_the_launcher_zspeed_traceback_prints_each_ranks_traceback(tmp_path):
    r = _launch(tmp_path, BAD_CONFIG, ZSPEED_TRACEBACK="1")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Traceback" in out and MESSAGE in out


def test_under_the_launcher_another_failure_keeps_torchruns_report(tmp_path):
    r = _launch(tmp_path, textwrap.dedent("""
        import os
        raise RuntimeError(f"a bug of the script on rank {os.environ['RANK']}")
    """))
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "Traceback" in out and "a bug of the script on rank" in out
    assert "FAILED" in out and "Root Cause" in out, out  # torchrun's failure table
