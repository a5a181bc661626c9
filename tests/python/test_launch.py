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
