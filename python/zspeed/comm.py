"""DeepSpeed's ``deepspeed.comm`` over ``torch.distributed``: process-group set-up and
the collectives training scripts call (``import zspeed.comm as dist``).

zspeed has no transport of its own. :func:`init_distributed` creates (or adopts) the
default torch.distributed process group the way DeepSpeed's does, from the variables
that launchers export (torchrun, DeepSpeed's launcher, ``zspeed launch``: RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or, when none are set, a
one-process group over an in-memory store (a file store on Windows, where torch has no
in-memory one; no port is opened either way). The backend is NCCL
for CUDA on Linux and Gloo everywhere else (Windows has no NCCL); ``dist_backend`` or
``ZSPEED_DIST_BACKEND`` overrides it.

The collectives forward to torch.distributed with its signatures; DeepSpeed's extra
keyword arguments (``prof``, ``log_name``, ``debug``) are accepted and ignored, since
zspeed has no communication logger. Unlike torch.distributed, the queries
(:func:`get_rank`, :func:`get_world_size`, :func:`get_local_rank`) answer 0 / 1 / 0
before any group exists, so rank-0 reporting in scripts works in one process too.
"""
from __future__ import annotations

import logging
import os
import sys
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as _td

from ._native import ZSpeedError

log = logging.getLogger("zspeed.comm")

__all__ = ["init_distributed", "is_initialized", "is_available", "destroy_process_group", "new_group",
           "get_rank", "get_world_size", "get_local_rank", "get_local_world_size", "get_global_rank",
           "get_all_ranks_from_group", "get_world_group", "get_backend", "default_backend",
           "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "all_reduce",
           "inference_all_reduce", "all_reduce_coalesced", "reduce", "all_gather", "all_gather_object",
           "all_gather_into_tensor", "allgather_fn", "all_gather_coalesced", "reduce_scatter",
           "reduce_scatter_tensor", "reduce_scatter_fn", "has_all_gather_into_tensor",
           "has_reduce_scatter_tensor", "has_all_reduce_coalesced", "has_coalescing_manager",
           "all_to_all_single", "all_to_all", "gather", "scatter", "send", "recv", "isend", "irecv",
           "ReduceOp", "DistributedError", "TORCH_DISTRIBUTED_DEFAULT_PORT", "default_pg_timeout"]

ReduceOp = _td.ReduceOp if _td.is_available() else None
TORCH_DISTRIBUTED_DEFAULT_PORT = 29500
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class DistributedError(ZSpeedError, RuntimeError):
    """The process group cannot be set up as asked (bad launcher variables, backend, ...)."""


def _timeout_from_env() -> timedelta:
    """DeepSpeed's default collective timeout: DEEPSPEED_TIMEOUT minutes, else 10."""
    raw = os.environ.get("DEEPSPEED_TIMEOUT", "10")
    try:
        minutes = float(raw)
    except ValueError:
        raise DistributedError(f"DEEPSPEED_TIMEOUT={raw!r} is not a number of minutes; fix or unset it.") from None
    if not minutes > 0:
        raise DistributedError(f"DEEPSPEED_TIMEOUT={raw!r} must be a positive number of minutes.")
    return timedelta(minutes=minutes)


default_pg_timeout = timedelta(minutes=10)


def _env_int(name: str, lo: int = 0) -> Optional[int]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        v = int(raw)
    except ValueError:
        raise DistributedError(f"environment variable {name}={raw!r} is not an integer; it is set by the "
                               f"launcher (torchrun, deepspeed, zspeed launch): fix or unset it.") from None
    if v < lo:
        raise DistributedError(f"environment variable {name}={raw!r} must be >= {lo}.")
    return v


def is_available() -> bool:
    return _td.is_available()


def is_initialized() -> bool:
    return _td.is_available() and _td.is_initialized()


def default_backend(device: Optional[torch.device] = None) -> str:
    """The backend zspeed picks: ZSPEED_DIST_BACKEND if set, else NCCL for CUDA on Linux
    (when torch has it), else Gloo. Without ``device``, the engine's: ZSPEED_DEVICE's when set
    (ZSPEED_DEVICE=cpu on a GPU machine trains on the CPU, over Gloo), else CUDA if there is one."""
    forced = os.environ.get("ZSPEED_DIST_BACKEND")
    if forced:
        return forced
    if device is None and os.environ.get("ZSPEED_DEVICE", "").strip():
        device = torch.device("cuda" if os.environ["ZSPEED_DEVICE"].strip().lower().startswith("cuda") else "cpu")
    cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
    if cuda and sys.platform.startswith("linux") and _td.is_nccl_available():
        return "nccl"
    return "gloo"


def get_local_rank() -> int:
    """The process's rank on its host: LOCAL_RANK as launchers export it (0 without one)."""
    v = _env_int("LOCAL_RANK")
    return 0 if v is None else v


_local_ws_cache: Optional[int] = None


def get_local_world_size() -> int:
    """Processes on this host: LOCAL_WORLD_SIZE as torchrun exports it, else counted once
    by gathering every rank's host name (1 before any group exists)."""
    global _local_ws_cache
    v = _env_int("LOCAL_WORLD_SIZE", 1)
    if v is not None:
        return v
    if not is_initialized() or get_world_size() == 1:
        return 1
    if _local_ws_cache is None:
        import socket
        names: list = [None] * get_world_size()
        _td.all_gather_object(names, socket.gethostname())
        _local_ws_cache = names.count(socket.gethostname())
    return _local_ws_cache


def _loopback_interface() -> Optional[str]:
    """The name of this host's loopback network interface (Linux: the one whose flags say
    IFF_LOOPBACK, usually ``lo``; macOS and the BSDs: ``lo0``), None where it is unknown."""
    if sys.platform.startswith("linux"):
        try:
            for name in sorted(os.listdir("/sys/class/net")):
                with open(f"/sys/class/net/{name}/flags") as f:
                    if int(f.read().strip(), 16) & 0x8:  # IFF_LOOPBACK
                        return name
        except (OSError, ValueError):
            pass
        return "lo"
    if sys.platform == "darwin" or "bsd" in sys.platform:
        return "lo0"
    return None  # Windows: the hostname always resolves there, Gloo never falls back


def _hostname_is_usable() -> bool:
    """Whether Gloo's default device would find an address of its own: the host name
    resolves to an address a socket can be bound to (Gloo's own test, with the same
    getaddrinfo call)."""
    import socket
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind((addr[0], 0) + tuple(addr[2:]))
                return True
        except OSError:
            continue
    return False


def _one_process_loopback(backend: str, world_size: Optional[int]) -> None:
    """A one-process Gloo group needs no network, but Gloo still makes a device for it from
    the host's name, and where that name does not resolve (a fresh container or chroot with
    no /etc/hosts line for it) Gloo falls back to the loopback address with a warning that
    asks the user to set GLOO_SOCKET_IFNAME. zspeed sets it to the loopback interface in
    exactly that case: Gloo would use the loopback anyway, so nothing changes but the warning
    (for every group of the process, e.g. those the engine creates later; a process with one
    rank has no peer elsewhere). A GLOO_SOCKET_IFNAME the user set is left alone, and several
    ranks keep Gloo's warning: there a host name that does not resolve is a real problem."""
    if backend != "gloo" or world_size != 1 or os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    iface = _loopback_interface()
    if iface is not None and not _hostname_is_usable():
        os.environ["GLOO_SOCKET_IFNAME"] = iface
        log.debug("zspeed: host name does not resolve; one-process Gloo group on the loopback (%s)", iface)


def _windows_env_store(rank: int, world_size: int, timeout: timedelta):
    """The store of the env:// rendezvous, made as torch's own env:// handler makes it
    (torch.distributed.rendezvous._create_c10d_store, then the "default_pg" prefix that
    init_process_group adds) but with use_libuv=False. torch's Windows wheels have no libuv
    TCPStore, and where a launcher's agent serves the store (torchrun, ``zspeed launch``)
    torch (2.15) creates the rank's client without saying which backend, so it asks for libuv
    and fails: "use_libuv was requested but PyTorch was built without libuv support". None
    where this torch's TCPStore takes no use_libuv (torch before 2.4: env:// is used)."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)  # torch's own test
    try:
        if agent:  # the agent serves the store: every rank is a client
            store = _td.TCPStore(host_name=addr, port=port, world_size=world_size, is_master=False,
                                 timeout=timeout, use_libuv=False)
        else:  # rank 0 serves it
            store = _td.TCPStore(host_name=addr, port=port, world_size=world_size, is_master=rank == 0,
                                 timeout=timeout, multi_tenant=True, use_libuv=False)
    except TypeError:
        return None
    return _td.PrefixStore("default_pg", store)


def _one_process_store():
    """The key-value store of a one-process group: torch's in-memory HashStore where torch has
    one (Linux, macOS); torch's Windows builds have none, so there it is a FileStore over a file
    in a private temporary folder, removed at exit. Neither opens a port."""
    if hasattr(_td, "HashStore"):
        return _td.HashStore()
    import atexit
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix="zspeed-store-")
    atexit.register(shutil.rmtree, folder, True)  # after _shutdown (atexit runs in reverse order)
    return _td.FileStore(os.path.join(folder, "store"), 1)


def init_distributed(dist_backend: Optional[str] = None, auto_mpi_discovery: bool = True,
                     distributed_port: int = TORCH_DISTRIBUTED_DEFAULT_PORT, verbose: bool = True,
                     timeout: Optional[timedelta] = None, init_method: Optional[str] = None,
                     dist_init_required: Optional[bool] = None, config: Any = None, rank: int = -1,
                     world_size: int = -1) -> None:
    """DeepSpeed's ``init_distributed``: sets up the default process group once.

    An existing group (created by the script or an earlier call) is used as it is.
    ``dist_init_required=False`` requires one to exist. Otherwise the group is created
    from ``init_method`` (with ``rank``/``world_size``), or from the launcher variables
    (``env://``), or, with none of them set, as a one-process group. MPI discovery
    (DeepSpeed's ``auto_mpi_discovery``) is not done: launch with torchrun,
    ``zspeed launch`` or DeepSpeed's launcher, which export the variables."""
    del auto_mpi_discovery, config
    if not _td.is_available():
        raise DistributedError("this torch build has no torch.distributed; zspeed's multi-process "
                               "training needs it (every official torch wheel has it).")
    if is_initialized():
        return
    if dist_init_required is False:
        raise DistributedError("dist_init_required=False, but no torch.distributed process group exists; "
                               "create one first (zspeed.init_distributed()) or leave dist_init_required unset.")
    timeout = timeout if timeout is not None else _timeout_from_env()
    backend = dist_backend or default_backend()
    missing = [v for v in _LAUNCH_VARS if v not in os.environ]
    if init_method is not None:
        _one_process_loopback(backend, world_size)
        _td.init_process_group(backend, init_method=init_method, timeout=timeout, rank=rank,
                               world_size=world_size)
    elif not missing:
        ws, r = _env_int("WORLD_SIZE", 1), _env_int("RANK")
        if r is not None and ws is not None and r >= ws:
            raise DistributedError(f"RANK={r} is not below WORLD_SIZE={ws}; check the launcher's settings.")
        _one_process_loopback(backend, ws)
        store = _windows_env_store(r, ws, timeout) if sys.platform == "win32" else None
        if store is not None:
            _td.init_process_group(backend, store=store, rank=r, world_size=ws, timeout=timeout)
        else:
            _td.init_process_group(backend, init_method="env://", timeout=timeout)
    elif len(missing) == len(_LAUNCH_VARS) or (_env_int("WORLD_SIZE", 1) or 1) == 1:
        # One process and no launcher: a group over an in-memory store, no port opened.
        os.environ.setdefault("LOCAL_RANK", "0")
        _one_process_loopback(backend, 1)
        store = _one_process_store()
        _td.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
    else:
        raise DistributedError(f"the launcher variables are incomplete: {', '.join(missing)} not set while "
                               f"WORLD_SIZE={os.environ.get('WORLD_SIZE')}. Start the job with torchrun, "
                               f"`zspeed launch` or DeepSpeed's launcher, or set {', '.join(missing)} "
                               f"(MASTER_PORT is usually {distributed_port}).")
    import atexit
    atexit.register(_shutdown)
    if verbose and get_rank() == 0:
        log.info("zspeed: torch.distributed initialized: backend %s, world size %d", get_backend(),
                 get_world_size())


_peer_lost = False  # set when a collective failed because another rank is gone

# -- a collective one rank waits in too long ---------------------------------------------------------
# Every rank must make zspeed's collectives in the same order. A call only some ranks make (a
# GatheredParameters, an evaluation forward or a save on rank 0 alone at ZeRO-3) leaves the others
# waiting until the collective timeout with nothing said; the watchdog says it after
# ZSPEED_COLLECTIVE_WARN_S seconds (default 60; 0 turns it off), once per wait, on each rank waiting.
ONE_RANK_HINT = ("every rank must make the same zspeed calls in the same order: a call that only some ranks make "
                 "(GatheredParameters, an evaluation forward or save_checkpoint on rank 0 alone at ZeRO-3, a "
                 "backward a rank skipped) waits for the others until the collective timeout")


def _warn_after() -> float:
    raw = os.environ.get("ZSPEED_COLLECTIVE_WARN_S", "60")
    try:
        v = float(raw)
    except ValueError:
        return 60.0
    return v if v >= 0 else 60.0


class _Watchdog:
    """One daemon thread for the process: it looks every half second at the collectives under way
    (:class:`guarded`) and logs a warning for each that has waited longer than the threshold."""

    def __init__(self):
        import threading
        self.lock = threading.Lock()
        self.active: dict = {}
        self.thread = None
        self.next = 0

    def add(self, what: str) -> int:
        import threading
        import time
        with self.lock:
            self.next += 1
            self.active[self.next] = [time.monotonic(), what, False]
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="zspeed-collective-watchdog", daemon=True)
                self.thread.start()
            return self.next

    def remove(self, token: int) -> None:
        with self.lock:
            self.active.pop(token, None)

    def _run(self) -> None:
        import time
        while True:
            time.sleep(0.5)
            limit = _warn_after()
            now = time.monotonic()
            with self.lock:
                due = [(k, v) for k, v in self.active.items() if limit and not v[2] and now - v[0] >= limit]
                for _k, v in due:
                    v[2] = True
            for _k, (start, where, _w) in due:
                log.warning("zspeed: rank %d of %d has waited %.0f s in a collective %s; %s (DEEPSPEED_TIMEOUT "
                            "minutes, default 10). Look at what the other ranks are doing.", get_rank(),
                            get_world_size(), now - start, where, ONE_RANK_HINT)


_WATCHDOG = _Watchdog()


_PEER_GONE_WORDS = ("Connection closed by peer", "Connection reset", "Timed out", "timed out", "Broken pipe", "NCCL",
                    "Gloo", "gloo")


class guarded:
    """Context around a call that makes collectives (several ranks only): the watchdog warns when
    it waits longer than ZSPEED_COLLECTIVE_WARN_S seconds, and a collective that fails because a
    peer is gone or stuck (a backend error, a timeout) becomes a DistributedError naming this
    rank, the call (``where``: "in engine.step()", ...) and ``why`` it most likely happened;
    other errors pass unchanged."""

    def __init__(self, where: str, why: str):
        self.where, self.why, self.token = where, why, None

    def __enter__(self):
        if is_initialized() and get_world_size() > 1 and _warn_after() > 0:
            self.token = _WATCHDOG.add(self.where)
        return self

    def __exit__(self, typ, exc, tb):
        if self.token is not None:
            _WATCHDOG.remove(self.token)
        if exc is None or isinstance(exc, DistributedError) or not is_initialized() or get_world_size() == 1:
            return False
        text = str(exc)
        backend_error = getattr(_td, "DistBackendError", ())
        if isinstance(exc, backend_error) or (isinstance(exc, RuntimeError) and any(
                k in text for k in _PEER_GONE_WORDS)):
            peer_lost()
            raise DistributedError(
                f"rank {get_rank()} of {get_world_size()}: a collective {self.where} failed "
                f"({text.splitlines()[0] if text else typ.__name__}). {self.why} The collective timeout is "
                f"DEEPSPEED_TIMEOUT minutes (default 10).") from exc
        return False


def peer_lost() -> None:
    """Records that another rank is gone: the ordered exit below does not wait for it."""
    global _peer_lost
    _peer_lost = True


def _shutdown() -> None:
    """At interpreter exit, the group zspeed created is destroyed on every rank, in three
    phases ordered through the launcher's key-value store: every rank first waits until all
    ranks are done communicating (a rank closing its connections while a peer is still
    finishing its last collective can abort that peer), then destroys its group, and rank 0,
    whose process serves the store, leaves last. A group left to the interpreter's teardown,
    or a store that disappears while another rank still tears down its group, can abort
    that rank from a communication thread ("terminate called without an active exception")
    after its work is done. Each wait gives up after 10 s, or at once when a peer is known
    to be gone."""
    if not is_initialized():
        return
    ws, rank, store = get_world_size(), get_rank(), None
    if ws > 1:
        try:
            from torch.distributed import distributed_c10d
            store = distributed_c10d._get_default_store()
        except Exception:  # noqa: BLE001 - an older torch: no ordered exit, still a clean destroy
            store = None
    if store is not None and not _peer_lost:
        _store_wait(store, "zspeed/quiet", ws)
    _td.destroy_process_group()
    if store is None:
        return
    if rank == 0 and not _peer_lost:
        _store_wait(store, "zspeed/exited", ws)
    else:
        try:
            store.add("zspeed/exited", 1)
        except Exception:  # noqa: BLE001 - rank 0 already gone: nothing left to order
            pass


def _store_wait(store, key: str, ws: int, limit: float = 10.0) -> None:
    """Counts this rank in ``key`` and waits (at most ``limit`` seconds) until all ``ws`` have."""
    import time
    try:
        store.add(key, 1)
        deadline = time.monotonic() + limit
        while store.add(key, 0) < ws and time.monotonic() < deadline:
            time.sleep(0.005)
    except Exception:  # noqa: BLE001 - another rank (the store's server) already gone
        pass


def destroy_process_group(group=None) -> None:
    if is_initialized():
        _td.destroy_process_group(group)


def new_group(ranks, **kwargs):
    return _td.new_group(ranks, **kwargs)


def get_world_group():
    return _td.group.WORLD


def get_backend(group=None) -> str:
    return str(_td.get_backend(group))


def get_rank(group=None) -> int:
    """This process's rank in ``group`` (the default group), 0 before any group exists."""
    return _td.get_rank(group) if is_initialized() else 0


def get_world_size(group=None) -> int:
    """Processes in ``group`` (the default group), 1 before any group exists."""
    return _td.get_world_size(group) if is_initialized() else 1


def get_global_rank(group=None, group_rank: int = 0) -> int:
    if group is None or not is_initialized():
        return group_rank
    return _td.get_global_rank(group, group_rank)


def get_all_ranks_from_group(group=None) -> list:
    return [get_global_rank(group, r) for r in range(get_world_size(group))]


# -- collectives: torch.distributed's signatures, DeepSpeed's extra keywords ignored ---------------
def _ds(kwargs: dict) -> dict:
    for k in ("prof", "log_name", "debug"):
        kwargs.pop(k, None)
    return kwargs


def barrier(group=None, async_op=False, device_ids=None, **kw):
    _ds(kw)
    return _td.barrier(group=group, async_op=async_op, device_ids=device_ids)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False, **kw):
    _ds(kw)
    return _td.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


def broadcast(tensor, src, group=None, async_op=False, **kw):
    _ds(kw)
    return _td.broadcast(tensor, src, group=group, async_op=async_op)


def broadcast_object_list(object_list, src, group=None, device=None):
    return _td.broadcast_object_list(object_list, src, group=group, device=device)


def all_reduce(tensor, op=None, group=None, async_op=False, **kw):
    _ds(kw)
    return _td.all_reduce(tensor, op=ReduceOp.SUM if op is None else op, group=group, async_op=async_op)


inference_all_reduce = all_reduce


def all_reduce_coalesced(tensors, op=None, group=None, async_op=False, **kw):
    _ds(kw)
    works = [_td.all_reduce(t, op=ReduceOp.SUM if op is None else op, group=group, async_op=async_op)
             for t in tensors]
    return works[-1] if async_op and works else None


def reduce(tensor, dst, op=None, group=None, async_op=False, **kw):
    _ds(kw)
    return _td.reduce(tensor, dst, op=ReduceOp.SUM if op is None else op, group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False, **kw):
    _ds(kw)
    return _td.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_object(object_list, obj, group=None, **kw):
    _ds(kw)
    return _td.all_gather_object(object_list, obj, group=group)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, **kw):
    _ds(kw)
    return _td.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def allgather_fn(output_tensor, input_tensor, group=None, async_op=False, **kw):
    return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op, **kw)


def all_gather_coalesced(output_tensors, input_tensors, group=None, async_op=False):
    works = [_td.all_gather_into_tensor(o, i, group=group, async_op=async_op)
             for o, i in zip(output_tensors, input_tensors)]
    return works[-1] if async_op and works else None


def reduce_scatter(output, input_list, op=None, group=None, async_op=False, **kw):
    _ds(kw)
    return _td.reduce_scatter(output, input_list, op=ReduceOp.SUM if op is None else op, group=group,
                              async_op=async_op)


def reduce_scatter_tensor(output_tensor, input_tensor, op=None, group=None, async_op=False, **kw):
    _ds(kw)
    return _td.reduce_scatter_tensor(output_tensor, input_tensor, op=ReduceOp.SUM if op is None else op,
                                     group=group, async_op=async_op)


def reduce_scatter_fn(output_tensor, tensor, op=None, group=None, async_op=False, prof=False, debug=None):
    del prof, debug
    return reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)


def has_all_gather_into_tensor() -> bool:
    return hasattr(_td, "all_gather_into_tensor")


def has_reduce_scatter_tensor() -> bool:
    return hasattr(_td, "reduce_scatter_tensor")


def has_all_reduce_coalesced() -> bool:
    return True


def has_coalescing_manager() -> bool:
    return False


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False, **kw):
    _ds(kw)
    return _td.all_to_all_single(output, tensor, output_split_sizes=output_split_sizes,
                                 input_split_sizes=input_split_sizes, group=group, async_op=async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    return _td.all_to_all(output_tensor_list, input_tensor_list, group=group, async_op=async_op)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, **kw):
    _ds(kw)
    return _td.gather(tensor, gather_list=gather_list, dst=dst, group=group, async_op=async_op)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, **kw):
    _ds(kw)
    return _td.scatter(tensor, scatter_list=scatter_list, src=src, group=group, async_op=async_op)


def send(tensor, dst, group=None, tag=0, **kw):
    _ds(kw)
    return _td.send(tensor, dst, group=group, tag=tag)


def recv(tensor, src=None, group=None, tag=0, **kw):
    _ds(kw)
    return _td.recv(tensor, src=src, group=group, tag=tag)


def isend(tensor, dst, group=None, tag=0, **kw):
    _ds(kw)
    return _td.isend(tensor, dst, group=group, tag=tag)


def irecv(tensor, src=None, group=None, tag=0, **kw):
    _ds(kw)
    return _td.irecv(tensor, src=src, group=group, tag=tag)


def _contradicting_single_rank_pg_error(dp_world_size: int, explicit_process_group, env=None) -> str | None:
    """The message for a process group of one rank where the launcher started several (its
    WORLD_SIZE says so), or None. That happens when a one-process group was created before the
    launcher's (a library's start-up code ran first): zero.Init would then keep every parameter
    whole on every rank, and each rank would run out of memory as if the model were too big. A
    group the caller passed explicitly is taken as meant; a WORLD_SIZE that is no number is
    ignored. (DeepSpeed's check of the same name.)"""
    if dp_world_size != 1 or explicit_process_group is not None:
        return None
    env = os.environ if env is None else env
    try:
        launched = int(env.get("WORLD_SIZE") or 0)
    except (TypeError, ValueError):
        return None
    if launched <= 1:
        return None
    return (f"zero.Init found a process group of 1 rank, but the launcher started WORLD_SIZE={launched} "
            f"processes: a one-process group was created before the launcher's (e.g. a library initialised "
            f"torch.distributed first), so the parameters would not be partitioned and every rank would hold "
            f"the whole model. Call zspeed.init_distributed() (deepspeed.init_distributed()) before anything "
            f"else creates a process group, then build the model under zero.Init.")
