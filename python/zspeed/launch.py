"""``zspeed launch``: DeepSpeed's launcher command line over torch.distributed's own launcher.

People who type ``deepspeed train.py --deepspeed_config ds.json`` type
``zspeed launch train.py --deepspeed_config ds.json``. The ranks are started by
torchrun's elastic agent (``torch.distributed.run``), which exports RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT and stops
every rank when one fails. Like DeepSpeed's launcher, each rank's script also gets
``--local_rank=N`` (``--no_local_rank`` leaves it out).

One host: ``--num_gpus N`` (default: every visible GPU, or one process on a machine
without GPUs; ``--include``/``--exclude`` pick GPUs as DeepSpeed's ``localhost:0,1``).
Several hosts: run the same command on each host with ``--num_nodes M --node_rank
K --master_addr HOST`` (zspeed does not log in to other hosts: start it there with
your scheduler or ssh); a DeepSpeed hostfile (``--hostfile``, lines ``host
slots=N``, each host once) gives the number of nodes, each node's processes (its
own line's slots), and, as its first host, the master address. Counts are checked
before anything starts: 1 to 65536 processes per node, nodes and processes in all,
node ranks >= 0, ports 1 to 65535, each GPU of --include/--exclude once.

Threads: each rank gets ``cores / ranks on this host`` for torch's CPU work
(OMP_NUM_THREADS, which torchrun would otherwise set to 1) unless the variable is
already set; zspeed's own CPU optimizer sizes its threads the same way by itself.
Windows has no NCCL: the ranks use Gloo there (zspeed picks it). torch's Windows wheels
are built without libuv for TCPStore, yet TCPStore asks for it by default, so plain
torchrun fails there ("use_libuv was requested but PyTorch was built without libuv
support"): the agent runs through this module (``python -m zspeed.launch --torchrun ...``),
which on Windows gives torchrun's rendezvous a TCPStore that asks for the other backend
unless USE_LIBUV=1 says otherwise.

Errors: a zspeed error (ConfigError and the like, a ZSpeedError) that ends the ranks is
printed once, after the job, naming the ranks that raised it, without tracebacks and without
torchrun's failure report (which is still printed for ranks that failed another way);
ZSPEED_TRACEBACK=1 prints every rank's traceback as torchrun would.

Flags that DeepSpeed's launcher has and this one does not (pdsh/mpi launchers,
autotuning, elastic training, core binding) are refused by name; unknown flags are
refused naming the closest real one.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import signal
import sys
from typing import List, NamedTuple, Optional

__all__ = ["main", "LaunchError", "build_command"]


class LaunchError(Exception):
    """The command line cannot be launched as given (the message says why and what to do)."""


_DS_ONLY = {
    "--launcher": "zspeed starts the ranks with torch.distributed's launcher (torchrun) on each host; "
                  "start zspeed launch on every host with --node_rank instead of pdsh/mpi/slurm",
    "--launcher_args": "there is no pdsh/mpi launcher to pass arguments to",
    "--autotuning": "DeepSpeed's autotuner is not part of zspeed",
    "--elastic_training": "elastic training is not supported; torchrun's own --max-restarts is "
                          "available through `python -m torch.distributed.run`",
    "--min_elastic_nodes": "elastic training is not supported",
    "--max_elastic_nodes": "elastic training is not supported",
    "--bind_cores_to_rank": "zspeed sizes each rank's threads but does not pin cores; use numactl "
                            "or taskset around the command",
    "--bind_core_list": "zspeed does not pin cores; use numactl or taskset",
    "--force_multi": "zspeed launch runs on one host per invocation (--node_rank for the others)",
    "--no_ssh": "zspeed launch never uses ssh",
    "--no_ssh_check": "zspeed launch never uses ssh",
    "--ssh_port": "zspeed launch never uses ssh",
    "--venv_script": "activate the environment before running zspeed launch",
    "--save_pid": "not supported",
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="zspeed launch", allow_abbrev=False,
        description="Start a training script on several processes (DeepSpeed's `deepspeed` command "
                    "line, run by torch.distributed's launcher).")
    # None: not given (DeepSpeed's -1), so that every value a user types is checked.
    ap.add_argument("--num_gpus", "--num_accelerators", type=int, default=None,
                    help="processes on this host (default: every visible GPU, or 1 without GPUs)")
    ap.add_argument("--num_nodes", type=int, default=None, help="hosts in the job (default 1, or the hostfile's)")
    ap.add_argument("--node_rank", type=int, default=None, help="this host's index among them (default 0)")
    ap.add_argument("--master_addr", type=str, default="", help="host of rank 0 (default: this one, or the "
                                                              "hostfile's first)")
    ap.add_argument("--master_port", type=int, default=None, help="port of rank 0's rendezvous (default 29500; on "
                    "one host, a free port when 29500 is taken)")
    ap.add_argument("--join_timeout", type=int, default=600, help="seconds rank 0's host waits for the other hosts "
                    "to join (several hosts; default 600, torchrun's)")
    ap.add_argument("-H", "--hostfile", type=str, default="", help="DeepSpeed hostfile: lines 'host slots=N'")
    ap.add_argument("-i", "--include", type=str, default="", help="GPUs to use, DeepSpeed style: 'localhost:0,1'")
    ap.add_argument("-e", "--exclude", type=str, default="", help="GPUs not to use: 'localhost:2'")
    ap.add_argument("--module", action="store_true", help="run the script as a module (python -m)")
    ap.add_argument("--no_python", action="store_true", help="run the script as an executable, not with python")
    ap.add_argument("--no_local_rank", action="store_true", help="do not pass --local_rank to the script")
    ap.add_argument("--enable_each_rank_log", type=str, default="None",
                    help="folder for one log file per rank (default: output to this terminal)")
    ap.add_argument("--log_level", type=str, default="info", help="accepted (the ranks' logging is theirs)")
    ap.add_argument("user_script", type=str, help="the training script (or module with --module)")
    ap.add_argument("user_args", nargs=argparse.REMAINDER, help="its arguments")
    return ap


def _check_flags(argv: List[str], ap: argparse.ArgumentParser) -> None:
    """Refuse DeepSpeed-only and unknown launcher flags before the script name, by name."""
    known = [s for a in ap._actions for s in a.option_strings]
    takes_value = {s for a in ap._actions if a.nargs != 0 for s in a.option_strings}
    skip = False
    for tok in argv:
        if skip:  # the value of the option before, such as the -1 of --num_gpus -1
            skip = False
            continue
        if not tok.startswith("-"):
            return  # the script: what follows is the script's
        flag = tok.split("=", 1)[0]
        skip = flag in takes_value and "=" not in tok
        if flag in _DS_ONLY:
            raise LaunchError(f"zspeed launch: {flag} is a DeepSpeed launcher option zspeed does not have: "
                              f"{_DS_ONLY[flag]}.")
        if flag not in known and flag not in ("-h", "--help"):
            if re.search(r"windows|win32|win64|linux|macos|wsl|platform", flag, re.I):
                raise LaunchError(f"zspeed launch: unknown option {flag}: zspeed needs no platform options; the "
                                  f"same command works on Linux and Windows (Gloo is chosen where NCCL is "
                                  f"missing). Remove {flag}.")
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]}?" if close else f" Known options: {', '.join(sorted(known))}."
            raise LaunchError(f"zspeed launch: unknown option {flag}.{hint} Options for the training script "
                              f"go after the script's name.")


def _gpus_visible() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def _parse_ids(spec: str, what: str) -> List[int]:
    """'localhost:0,1' or '0,1' -> [0, 1] (this host only)."""
    out = []
    for part in spec.split("@"):
        host, _, ids = part.rpartition(":")
        if host not in ("", "localhost", "127.0.0.1"):
            raise LaunchError(f"zspeed launch: {what} '{spec}' names host '{host}'; zspeed launch selects GPUs "
                              f"of the host it runs on (write localhost:0,1).")
        for x in ids.split(","):
            try:
                gpu = int(x)
            except ValueError:
                gpu = -1
            if gpu < 0:
                raise LaunchError(f"zspeed launch: {what} '{spec}': '{x}' is not a GPU index (a whole number "
                                  f">= 0, as in localhost:0,1).")
            if gpu in out:  # two ranks would share one GPU
                raise LaunchError(f"zspeed launch: {what} '{spec}' lists GPU {gpu} twice; list each GPU once.")
            out.append(gpu)
    return out


# Bounds that catch typos and overflows: no job of this launcher runs more processes than this.
MAX_PROCS = 65536


def _check_count(flag: str, n: int, why: str = "") -> None:
    if not 1 <= n <= MAX_PROCS:
        raise LaunchError(f"zspeed launch: {flag} {n} must be between 1 and {MAX_PROCS}{why}.")


_MAX_HOSTFILE = 1 << 20  # bytes: a hostfile is a few lines
# A host name, an IPv4 address or an IPv6 address (optionally in brackets).
# The exit codes of ranks torchrun stops itself (SIGTERM, then SIGKILL) once another has failed
# (Windows has no SIGKILL: its number is the same 9).
_STOPPED_BY_TORCHRUN = (-int(signal.SIGTERM), -int(getattr(signal, "SIGKILL", 9)))
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*|[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?)$")


def _read_hostfile(path: str) -> List[tuple]:
    """[(host, slots)] in the file's order; a host named twice is refused (as DeepSpeed's runner
    does), since torchrun would then wait for a node that never joins. Only a regular file of
    at most 1 MiB is read (a FIFO or a device would block or never end)."""
    import stat
    hosts, seen = [], {}
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise LaunchError(f"zspeed launch: the hostfile '{path}' is not a regular file (a pipe, a device or a "
                              f"folder); write the hosts into a file, one 'host slots=N' per line.")
        if st.st_size > _MAX_HOSTFILE:
            raise LaunchError(f"zspeed launch: the hostfile '{path}' is {st.st_size} bytes; a hostfile holds one "
                              f"'host slots=N' line per host (at most {_MAX_HOSTFILE} bytes).")
        with open(path, "rb") as f:
            raw = f.read(_MAX_HOSTFILE + 1)
    except OSError as e:
        raise LaunchError(f"zspeed launch: cannot read the hostfile '{path}': {e.strerror or e}.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LaunchError(f"zspeed launch: the hostfile '{path}' is not UTF-8 text (byte {e.start}: "
                          f"{raw[e.start:e.start + 1]!r}); write it as plain 'host slots=N' lines.") from None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for p in parts[1:]:
            if p.startswith("slots="):
                try:
                    slots = int(p[len("slots="):])
                except ValueError:
                    slots = -1
        if not 1 <= slots <= MAX_PROCS:
            raise LaunchError(f"zspeed launch: hostfile '{path}' line {n}: '{line}' needs 'slots=N' with N "
                              f"between 1 and {MAX_PROCS}.")
        host = parts[0]
        if not _HOST.match(host) or len(host) > 253:
            raise LaunchError(f"zspeed launch: hostfile '{path}' line {n}: {host!r} is not a host name or an IP "
                              f"address.")
        if host in seen:
            raise LaunchError(f"zspeed launch: hostfile '{path}' names the host '{host}' twice (lines {seen[host]} "
                              f"and {n}); each node gets one line: keep one and add its slots there.")
        seen[host] = n
        hosts.append((host, slots))
    if not hosts:
        raise LaunchError(f"zspeed launch: the hostfile '{path}' lists no hosts.")
    return hosts


class _Launch(NamedTuple):
    """What a command line launches: the torchrun command, its environment, and where the nodes meet."""
    cmd: list
    env: dict
    nnodes: int
    node_rank: int
    master: str
    port: int
    join_timeout: int


def build_command(argv: List[str], environ: Optional[dict] = None) -> tuple[list, dict]:
    """(the torchrun command, the environment to run it with) for a `zspeed launch` command line."""
    launch = _build(argv, environ)
    return launch.cmd, launch.env


def _build(argv: List[str], environ: Optional[dict] = None) -> _Launch:
    env = dict(os.environ if environ is None else environ)
    ap = _parser()
    _check_flags(argv, ap)
    a = ap.parse_args(argv)
    if a.num_gpus is not None:
        _check_count("--num_gpus", a.num_gpus, " (leave it out to use every visible GPU)")
    if a.num_nodes is not None:
        _check_count("--num_nodes", a.num_nodes)
    if a.node_rank is not None and a.node_rank < 0:
        raise LaunchError(f"zspeed launch: --node_rank {a.node_rank} must be >= 0 (this host's index among the "
                          f"nodes, 0 for rank 0's host).")
    if a.master_port is not None and not 1 <= a.master_port <= 65535:
        raise LaunchError(f"zspeed launch: --master_port {a.master_port} must be between 1 and 65535 (a TCP "
                          f"port free on rank 0's host; default 29500).")
    if a.join_timeout < 1:
        raise LaunchError(f"zspeed launch: --join_timeout {a.join_timeout} must be >= 1 (seconds).")
    if a.master_addr and (not _HOST.match(a.master_addr) or len(a.master_addr) > 253):
        raise LaunchError(f"zspeed launch: --master_addr {a.master_addr!r} is not a host name or an IP address.")
    node_rank = a.node_rank or 0
    nnodes, nproc, master = 1, a.num_gpus, a.master_addr
    if a.hostfile:
        hosts = _read_hostfile(a.hostfile)
        if a.num_nodes is not None and a.num_nodes > len(hosts):
            raise LaunchError(f"zspeed launch: --num_nodes {a.num_nodes} but the hostfile '{a.hostfile}' lists "
                              f"{len(hosts)} hosts; the missing nodes would never join. Lower --num_nodes or "
                              f"add the hosts.")
        nnodes = len(hosts)
        if nproc is None and node_rank < len(hosts):
            nproc = hosts[node_rank][1]  # this node's own line
        master = master or hosts[0][0]
    if a.num_nodes is not None:
        nnodes = a.num_nodes
    if node_rank >= nnodes:
        raise LaunchError(f"zspeed launch: --node_rank {node_rank} is not below the number of nodes ({nnodes}).")
    gpus = list(range(_gpus_visible()))
    if a.include:
        gpus = _parse_ids(a.include, "--include")
    if a.exclude:
        gone = set(_parse_ids(a.exclude, "--exclude"))
        gpus = [g for g in gpus if g not in gone]
    if a.include or a.exclude:
        if not gpus:
            raise LaunchError("zspeed launch: --include/--exclude leave no GPU to run on.")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    if nproc is None:
        nproc = len(gpus) if gpus else 1
    if nproc * nnodes > MAX_PROCS:
        raise LaunchError(f"zspeed launch: {nnodes} nodes x {nproc} processes = {nproc * nnodes} processes; at "
                          f"most {MAX_PROCS} are supported. Check --num_nodes and --num_gpus (or the hostfile).")
    if gpus and nproc > len(gpus):
        raise LaunchError(f"zspeed launch: {nproc} processes but {len(gpus)} GPU(s) visible here; each rank needs "
                          f"its own GPU (or set ZSPEED_DEVICE=cpu to train on the CPU).")
    if nnodes > 1 and not master:
        raise LaunchError("zspeed launch: several nodes need --master_addr (rank 0's host) or a hostfile.")
    port = _pick_port(a.master_port, nnodes, node_rank)
    if "OMP_NUM_THREADS" not in env:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env["OMP_NUM_THREADS"] = str(max(1, cores // nproc))
    if sys.platform == "win32":
        env.setdefault("USE_LIBUV", "0")  # torch's libuv store is missing from some Windows builds
    cmd = [sys.executable, "-m", "zspeed.launch", "--torchrun", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
           f"--node_rank={node_rank}", f"--master_addr={master or '127.0.0.1'}", f"--master_port={port}"]
    if nnodes > 1:
        cmd.append(f"--rdzv-conf=timeout={a.join_timeout}")
    if a.enable_each_rank_log not in ("None", ""):
        try:
            os.makedirs(a.enable_each_rank_log, exist_ok=True)
            probe = os.path.join(a.enable_each_rank_log, f".zspeed-launch-{os.getpid()}")
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as e:
            raise LaunchError(f"zspeed launch: --enable_each_rank_log {a.enable_each_rank_log!r}: cannot write log "
                              f"files there ({e.strerror or e}); give a folder you can write to.") from None
        cmd += [f"--log-dir={a.enable_each_rank_log}", "--redirects=3", "--tee=0"]
    if a.no_python and a.module:
        raise LaunchError("zspeed launch: --no_python and --module cannot go together.")
    mode = "--exec" if a.no_python else "--module" if a.module else "--script"
    cmd += ["-m", "zspeed._rank_entry", mode, a.user_script,
            "--no-local-rank" if a.no_local_rank else "--local-rank", "--", *a.user_args]
    return _Launch(cmd, env, nnodes, node_rank, master or "127.0.0.1", port, a.join_timeout)


DEFAULT_PORT = 29500


def _port_free(port: int) -> bool:
    """Whether a TCP port can be bound on this host now (as rank 0's rendezvous store binds it)."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _pick_port(given: Optional[int], nnodes: int, node_rank: int) -> int:
    """The rendezvous port: the one given (checked free where this host is rank 0's), else 29500,
    or on one host a free port when 29500 is taken (as torchrun's standalone mode does). Several
    hosts must agree on the port, so there the default is never changed."""
    hosts_rank0 = node_rank == 0
    if given is not None:
        if hosts_rank0 and not _port_free(given):
            raise LaunchError(f"zspeed launch: --master_port {given} is in use on this host (another job, or a "
                              f"launch that did not end?); pick a free port, or leave --master_port out"
                              f"{' to use a free one' if nnodes == 1 else ''}.")
        return given
    if nnodes > 1 or _port_free(DEFAULT_PORT):
        if nnodes > 1 and hosts_rank0 and not _port_free(DEFAULT_PORT):
            raise LaunchError(f"zspeed launch: the default rendezvous port {DEFAULT_PORT} is in use on this host; "
                              f"give every host the same free --master_port.")
        return DEFAULT_PORT
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    sys.stderr.write(f"zspeed launch: port {DEFAULT_PORT} is in use here; the ranks meet on port {port} instead "
                     f"(--master_port picks one).\n")
    return port


def main(argv: Optional[List[str]] = None) -> int:
    import subprocess
    try:
        launch = _build(list(sys.argv[1:] if argv is None else argv))
    except LaunchError as e:
        sys.stderr.write(f"{e}\n")
        return 2
    n = launch.nnodes
    if n > 1:
        sys.stderr.write(
            f"zspeed launch: this is node {launch.node_rank} of {n}; the nodes meet at {launch.master}:{launch.port} "
            f"(rank 0's host). Start the same command on every other host with its own --node_rank (0 to "
            f"{n - 1}); this one waits up to {launch.join_timeout} s for them (--join_timeout), then stops.\n")
    rc = subprocess.call(launch.cmd, env=launch.env)
    if rc != 0 and n > 1:
        sys.stderr.write(f"zspeed launch: the job ended with status {rc}; if the output above is a rendezvous "
                         f"timeout, a node did not join within --join_timeout: start it with the same command "
                         f"and its --node_rank.\n")
    return rc


def _patch_tcpstore_for_windows() -> None:
    """torchrun's rendezvous stores made as torch's Windows wheels can make them: the rendezvous
    creates its TCPStore without saying which backend, TCPStore then asks for libuv, and those
    builds have none. The rank processes need nothing of this: their env:// rendezvous already
    picks the other backend on Windows."""
    import importlib

    import torch.distributed as td
    base = td.TCPStore

    class TCPStore(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", os.environ.get("USE_LIBUV", "0") == "1")
            super().__init__(*args, **kwargs)

    td.TCPStore = TCPStore
    for name in ("torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
                 "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"):
        try:
            mod = importlib.import_module(name)
        except ImportError:  # another torch: nothing to adjust there
            continue
        if getattr(mod, "TCPStore", None) is base:
            mod.TCPStore = TCPStore


def _agent(argv: List[str]) -> int:
    """The agent zspeed launch starts on each host: torchrun (``torch.distributed.run``) with the
    ranks' zspeed errors reported once. The ranks write a zspeed error that ends them to a folder
    made here (zspeed._user_errors); when the job fails, each distinct message is printed once
    with the ranks that raised it, and torchrun's failure report (its traceback and table) only
    for ranks that failed another way. ZSPEED_TRACEBACK=1: torchrun's own output, unchanged."""
    import logging
    import shutil
    import tempfile

    from ._user_errors import ENV_ERROR_DIR, job_report, read_records, wants_traceback
    if sys.platform == "win32":
        _patch_tcpstore_for_windows()
    from torch.distributed.run import main as torchrun_main, parse_args, run
    if wants_traceback():
        torchrun_main(argv)
        return 0
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    args = parse_args(argv)
    folder = tempfile.mkdtemp(prefix="zspeed-errors-")
    os.environ[ENV_ERROR_DIR] = folder  # the ranks inherit the agent's environment
    # torchrun logs each failed rank before raising; the report below says the same, once.
    quiet = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        run(args)
        return 0
    except ChildFailedError as e:
        failures = dict(getattr(e, "failures", {}) or {})
        text, rest = job_report(read_records(folder), failures.keys())
        # Ranks torchrun stopped itself (SIGTERM, then SIGKILL) once another had failed.
        stopped = [r for r in rest if getattr(failures[r], "exitcode", None) in _STOPPED_BY_TORCHRUN]
        others = {r: failures[r] for r in rest if r not in stopped}
        if not text:
            sys.stderr.write(e.format_msg() + "\n")
        else:
            if others:  # ranks that failed without a zspeed error: torchrun's report of them
                sys.stderr.write(ChildFailedError(e.name, others).format_msg() + "\n")
            if stopped:
                text += (f"zspeed launch: {'rank' if len(stopped) == 1 else 'ranks'} "
                         f"{', '.join(str(r) for r in stopped)} stopped by the launcher after the error above.\n")
        sys.stderr.write(text)
        sys.stderr.flush()
        return 1
    finally:
        quiet.setLevel(level)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--torchrun"]:  # the agent zspeed launch starts on each host
        sys.exit(_agent(sys.argv[2:]))
    else:  # python -m zspeed.launch ARGS is zspeed launch ARGS
        sys.exit(main())
