"""`zspeed launch`: DeepSpeed's launcher command line over torchrun."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="the launcher starts torch.distributed ranks")

from zspeed import launch  # noqa: E402


def _env():
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                           "MASTER_PORT", "OMP_NUM_THREADS")}
    e["ZSPEED_DEVICE"] = "cpu"
    return e


def test_two_ranks_get_local_rank_and_threads(tmp_path):
    script = tmp_path / "show.py"
    # Each rank writes its own file: the ranks share the launcher's stdout, where their lines can
    # interleave.
    script.write_text(textwrap.dedent("""
        import os, sys, zspeed
        zspeed.init_distributed()
        line = " ".join(map(str, ["ARGS", sys.argv[1:], "RANK", zspeed.comm.get_rank(), "WS",
                                  zspeed.comm.get_world_size(), "OMP", os.environ["OMP_NUM_THREADS"]]))
        with open(os.path.join(os.path.dirname(__file__), f"rank{zspeed.comm.get_rank()}.txt"), "w") as f:
            f.write(line)
    """))
    from distrun import free_port
    r = subprocess.run([sys.executable, "-m", "zspeed", "launch", "--num_gpus", "2", "--master_port",
                        str(free_port()), str(script), "--lr", "3"], env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [(tmp_path / f"rank{rank}.txt").read_text() for rank in range(2)]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for rank, line in enumerate(lines):
        assert f"['--local_rank={rank}', '--lr', '3'] RANK {rank} WS 2 OMP {max(1, cores // 2)}" in line, line


def test_no_local_rank_and_module(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import sys; print('ARGS', sys.argv[1:])\n")
    from distrun import free_port
    env = _env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "zspeed", "launch", "--num_gpus", "1", "--no_local_rank",
                        "--module", "--master_port", str(free_port()), "mypkg.train", "--x", "1"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ARGS ['--x', '1']" in r.stdout


@pytest.mark.parametrize("argv,needle", [
    (["--windows_optimization", "true", "t.py"], "zspeed needs no platform options"),
    (["--num_gpu", "2", "t.py"], "Did you mean --num_gpus?"),
    (["--launcher", "pdsh", "t.py"], "--launcher is a DeepSpeed launcher option zspeed does not have"),
    (["--autotuning", "run", "t.py"], "autotuner"),
    (["--node_rank", "2", "--num_nodes", "2", "--master_addr", "h", "t.py"], "not below the number of nodes"),
    (["--num_nodes", "2", "t.py"], "--master_addr"),
    (["--no_python", "--module", "t.py"], "cannot go together"),
])
def test_bad_command_lines_are_refused(argv, needle):
    with pytest.raises(launch.LaunchError, match=needle.replace("?", r"\?")):
        launch.build_command(argv, environ={})


def test_script_options_are_not_launcher_options():
    cmd, _ = launch.build_command(["--num_gpus", "1", "t.py", "--windows_optimization", "x"], environ={})
    assert cmd[-3:] == ["--", "--windows_optimization", "x"]


def test_hostfile_include_exclude(tmp_path, monkeypatch):
    hf = tmp_path / "hosts"
    hf.write_text("# two nodes\nnode-a slots=4\nnode-b slots=4\n")
    monkeypatch.setattr(launch, "_gpus_visible", lambda: 4)
    cmd, env = launch.build_command(["--hostfile", str(hf), "--node_rank", "1", "t.py"], environ={})
    assert "--nnodes=2" in cmd and "--nproc_per_node=4" in cmd and "--node_rank=1" in cmd
    assert "--master_addr=node-a" in cmd and env["OMP_NUM_THREADS"]
    cmd, env = launch.build_command(["--include", "localhost:1,3", "t.py"], environ={})
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3" and "--nproc_per_node=2" in cmd
    cmd, env = launch.build_command(["--exclude", "localhost:0", "t.py"], environ={"OMP_NUM_THREADS": "7"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1,2,3" and env["OMP_NUM_THREADS"] == "7"
    with pytest.raises(launch.LaunchError, match="each rank needs its own GPU"):
        launch.build_command(["--num_gpus", "5", "t.py"], environ={})
    hf.write_text("node-a slots=x\n")
    with pytest.raises(launch.LaunchError, match="slots=N"):
        launch.build_command(["--hostfile", str(hf), "t.py"], environ={})


# -- refusals of the `zspeed launch` command (cli.main is the `zspeed` command) -----------------------
@pytest.fixture
def zspeed_launch(monkeypatch, capsys):
    """Runs `zspeed launch ARGV` in this process with torchrun replaced by a recorder: returns
    (exit status, stderr, the command it would have run or None)."""
    from zspeed import cli
    ran = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, env=None: ran.append(cmd) or 0)
    monkeypatch.setattr(launch, "_gpus_visible", lambda: 0)
    # No test relies on 29500 being free here (another program may hold it: issue 56): the
    # default port is one that is free now; the tests of a busy default set their own.
    from distrun import free_port
    monkeypatch.setattr(launch, "DEFAULT_PORT", free_port())

    def run(*argv):
        rc = cli.main(["launch", *map(str, argv)])
        return rc, capsys.readouterr().err, (ran.pop() if ran else None)
    return run


def test_hostfile_naming_a_host_twice_is_refused(tmp_path, zspeed_launch):
    # Accepted, the job would wait in the rendezvous for a third node that never joins.
    hf = tmp_path / "hosts"
    hf.write_text("node-a slots=2\n# spare\nnode-b slots=2\n\nnode-a slots=2\n")
    rc, err, cmd = zspeed_launch("--hostfile", hf, "t.py")
    assert rc == 2 and cmd is None, err
    assert "'node-a'" in err and "lines 1 and 5" in err and str(hf) in err


def test_hostfile_that_is_not_utf8_is_refused_naming_the_byte(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_bytes(b"node-a slots=2\nn\xe9ud slots=2\n")
    r = subprocess.run([sys.executable, "-m", "zspeed", "launch", "--hostfile", str(hf), "t.py"], env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert str(hf) in r.stderr and "byte 16" in r.stderr and "UTF-8" in r.stderr, r.stderr


@pytest.mark.parametrize("argv,needle", [
    (["--num_gpus", "0"], "--num_gpus 0 must be between 1 and 65536"),
    (["--num_gpus", "-1"], "--num_gpus -1 must be between 1 and 65536"),
    (["--num_gpus", "100000"], "--num_gpus 100000 must be between 1 and 65536"),
    (["--num_nodes", "0"], "--num_nodes 0 must be between 1 and 65536"),
    (["--num_nodes", "-2", "--master_addr", "h"], "--num_nodes -2 must be between 1 and 65536"),
    (["--num_nodes", "70000", "--master_addr", "h"], "--num_nodes 70000 must be between 1 and 65536"),
    (["--num_nodes", "300", "--num_gpus", "300", "--master_addr", "h"], "90000 processes"),
    (["--node_rank", "-1", "--num_nodes", "2", "--master_addr", "h"], "--node_rank -1 must be >= 0"),
    (["--node_rank", "-3"], "--node_rank -3 must be >= 0"),
    (["--master_port", "0"], "--master_port 0 must be between 1 and 65535"),
    (["--master_port", "70000"], "--master_port 70000 must be between 1 and 65535"),
])
def test_counts_ranks_and_ports_out_of_range_are_refused(argv, needle, zspeed_launch):
    rc, err, cmd = zspeed_launch(*argv, "t.py")
    assert rc == 2 and cmd is None and needle in err, err


def test_hostfile_counts_are_checked(tmp_path, zspeed_launch):
    hf = tmp_path / "hosts"
    hf.write_text("node-a slots=100000\n")
    rc, err, _ = zspeed_launch("--hostfile", hf, "t.py")
    assert rc == 2 and "line 1" in err and "slots=100000" in err and "65536" in err, err
    hf.write_text("node-a slots=2\nnode-b slots=2\n")
    rc, err, _ = zspeed_launch("--hostfile", hf, "--num_nodes", "3", "t.py")
    assert rc == 2 and "--num_nodes 3" in err and "lists 2 hosts" in err, err
    # Each node starts the processes its own line gives (node-b: 1), not the first host's.
    hf.write_text("node-a slots=2\nnode-b slots=1\n")
    rc, err, cmd = zspeed_launch("--hostfile", hf, "--node_rank", "1", "t.py")
    assert rc == 0 and "--nproc_per_node=1" in cmd and "--nnodes=2" in cmd, err


@pytest.mark.parametrize("flag,spec,needle", [
    ("--include", "localhost:0,0", "lists GPU 0 twice"),
    ("--include", "localhost:1@localhost:1", "lists GPU 1 twice"),
    ("--exclude", "localhost:2,2", "lists GPU 2 twice"),
    ("--include", "localhost:-1", "'-1' is not a GPU index"),
])
def test_include_exclude_with_a_repeated_or_negative_index_are_refused(flag, spec, needle, zspeed_launch,
                                                                       monkeypatch):
    monkeypatch.setattr(launch, "_gpus_visible", lambda: 4)
    rc, err, cmd = zspeed_launch(flag, spec, "t.py")
    assert rc == 2 and cmd is None and needle in err, err


# -- issue 52, findings 11, 13, 21 ------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_hostfile_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path, zspeed_launch):
    fifo = tmp_path / "hosts"
    os.mkfifo(fifo)
    rc, err, cmd = zspeed_launch("--hostfile", fifo, "t.py")  # (reading it would block forever)
    assert rc == 2 and cmd is None and "not a regular file" in err, err
    if os.path.exists("/dev/zero"):
        rc, err, cmd = zspeed_launch("--hostfile", "/dev/zero", "t.py")  # (would be read until memory runs out)
        assert rc == 2 and cmd is None and "not a regular file" in err, err
    big = tmp_path / "big"
    big.write_bytes(b"#" * (launch._MAX_HOSTFILE + 1))
    rc, err, cmd = zspeed_launch("--hostfile", big, "t.py")
    assert rc == 2 and "bytes" in err, err


@pytest.mark.parametrize("line", ["node\x00evil slots=1", "no de slots=1", "-rf slots=1", "a/b slots=1"])
def test_host_names_that_are_not_hosts_are_refused(tmp_path, zspeed_launch, line):
    hf = tmp_path / "hosts"
    hf.write_text("node-a slots=1\n" + line + "\n")
    rc, err, cmd = zspeed_launch("--hostfile", hf, "t.py")
    if line.startswith("no de"):  # "no" is the host, "de" an unknown field: still a host name
        assert cmd is not None or rc == 2
        return
    assert rc == 2 and cmd is None and "line 2" in err and "not a host name" in err, err
    rc, err, cmd = zspeed_launch(f"--master_addr={line.split()[0]}", "--num_nodes", "2", "t.py")
    assert rc == 2 and cmd is None and "--master_addr" in err, err


def test_good_host_names_pass(tmp_path, zspeed_launch):
    hf = tmp_path / "hosts"
    hf.write_text("gpu-node01.cluster.local slots=2\n10.0.0.7 slots=2\n[fe80::1] slots=1\n")
    rc, err, cmd = zspeed_launch("--hostfile", hf, "t.py")
    assert rc == 0 and "--master_addr=gpu-node01.cluster.local" in cmd, err
    assert "--rdzv-conf=timeout=600" in cmd and "node 0 of 3" in err and "waits up to 600 s" in err


def test_a_rank_log_folder_that_cannot_be_written_is_refused(tmp_path, zspeed_launch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, err, cmd = zspeed_launch("--num_gpus", "1", "--enable_each_rank_log", blocker / "logs", "t.py")
    assert rc == 2 and cmd is None and "--enable_each_rank_log" in err and "cannot write" in err, err


def test_a_port_in_use_is_refused_or_replaced(monkeypatch, zspeed_launch):
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.listen(1)
        taken = s.getsockname()[1]
        rc, err, cmd = zspeed_launch("--num_gpus", "1", "--master_port", taken, "t.py")
        assert rc == 2 and cmd is None and f"--master_port {taken} is in use" in err, err
        monkeypatch.setattr(launch, "DEFAULT_PORT", taken)
        rc, err, cmd = zspeed_launch("--num_gpus", "1", "t.py")  # one host, no --master_port: a free one
        assert rc == 0, err
        port = int(next(c for c in cmd if c.startswith("--master_port=")).split("=")[1])
        assert port != taken and f"port {taken} is in use here; the ranks meet on port {port}" in err
        rc, err, cmd = zspeed_launch("--num_nodes", "2", "--master_addr", "127.0.0.1", "t.py")
        assert rc == 2 and "give every host the same free --master_port" in err, err


def test_python_m_zspeed_launch_is_zspeed_launch(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import sys, os; print('HELLO', os.environ['RANK'], sys.argv[1:])\n")
    r = subprocess.run([sys.executable, "-m", "zspeed.launch", "--num_gpus", "1", str(script), "--x", "1"],
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "HELLO 0 ['--local_rank=0', '--x', '1']" in r.stdout, r.stderr[-2000:]


def test_a_host_that_never_joins_is_announced_and_times_out(tmp_path):
    """Rank 0's host says at once that it waits for the others, how to start them and for how
    long; it stops after --join_timeout, not torch's 10 minutes of silence."""
    hf = tmp_path / "hosts"
    hf.write_text("127.0.0.1 slots=1\nnever-started-host slots=1\n")
    script = tmp_path / "t.py"
    script.write_text("print('should not run')\n")
    import time
    from distrun import free_port
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "zspeed", "launch", "-H", str(hf), "--join_timeout", "5",
                        "--master_port", str(free_port()), str(script)], env=_env(), capture_output=True, text=True,
                       timeout=240)
    took = time.monotonic() - t0
    assert r.returncode != 0 and "should not run" not in r.stdout
    first = r.stderr.strip().splitlines()[0]
    assert "node 0 of 2" in first and "waits up to 5 s" in first and "--node_rank" in first, r.stderr[-2000:]
    assert "did not join within --join_timeout" in r.stderr
    assert took < 120, took
