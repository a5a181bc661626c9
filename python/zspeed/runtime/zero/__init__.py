"""DeepSpeed's ``deepspeed.zero`` (also ``deepspeed.runtime.zero``): ZeRO-3's construction
context and parameter access (runtime/zero3.py has the partitioning itself).

- :class:`Init`: modules created inside it get their parameters converted to the
  training dtype as each module's constructor finishes, and with several ranks
  partitioned right away (each rank keeps its shard; rank 0's values are broadcast
  first, as DeepSpeed does, so every rank starts from the same weights). The engine
  takes the shards as they are. With one rank the parameters stay whole, in host
  memory in the training dtype: half the memory of building the model in fp32.
  A parent module that initialises its children after building them (``self.apply(
  self._init_weights)`` in its constructor, as most models do) works as in DeepSpeed:
  inside the context ``Module.apply`` hands ``fn`` each module with its partitioned
  parameters whole, then keeps rank 0's values and partitions them again
  (``Init.override_module_apply = False`` turns this off).
- :class:`GatheredParameters`: the whole values of partitioned parameters inside the
  context (every rank must enter it); with ``modifier_rank`` the values that rank
  holds at exit are broadcast and written back into the shards and, once an engine
  trains the model, into its fp32 master weights. Without ``modifier_rank`` the values are
  read-only: an in-place edit is discarded, with a warning (RuntimeError at exit with
  zero_optimization.enable_sanity_checks, as in DeepSpeed). Below stage 3 parameters are whole already: the body just runs, and
  modifier_rank edits are broadcast at exit.
- :func:`register_external_parameter`: declares that a module uses a parameter of
  another module (zspeed also finds such uses itself during the first forward).
- :mod:`offload_config`: DeepSpeed's enums of offload devices and states.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os

import torch
import torch.distributed as td

from ..._native import ZSpeedError
from ..partition import DEFAULT_ALIGN
from . import offload_config  # noqa: F401
from ..param_status import (ZeroParamStatus, comm_device, init_gather, init_scatter, mark_partitioned, mark_whole,
                            shard_only, world)
from ...comm import _contradicting_single_rank_pg_error  # noqa: F401  (DeepSpeed's name here)

log = logging.getLogger("zspeed.zero")

__all__ = ["Init", "GatheredParameters", "ZeRO3NotSupported", "ZeroParamStatus", "offload_config",
           "register_external_parameter", "unregister_external_parameter", "unwrap_model_for_generation"]


class ZeRO3NotSupported(ZSpeedError, NotImplementedError):
    """A ZeRO-3 feature zspeed does not have (kept for scripts that catch it)."""


def _read_config(config):
    """The config zero.Init was given, a JSON/hjson path read once (as the engine's parser reads
    it); a dict or parsed config as it is."""
    if not isinstance(config, (str, os.PathLike)):
        return config
    from pathlib import Path
    from ..config import ConfigError, load_json_config
    try:
        return load_json_config(Path(config))
    except ConfigError as e:
        raise ConfigError(f"zero.Init(config_dict_or_path=...): {e}") from None


def _sanity_checks_from(config) -> bool:
    """zero_optimization.enable_sanity_checks of the config zero.Init was given (a dict or a
    parsed config, see _read_config; False without one). The engine's parser checks the config
    itself at initialize."""
    from ..config import ZSpeedConfig
    if config is None:
        return False
    if isinstance(config, ZSpeedConfig):
        return config.sanity_checks
    if not isinstance(config, dict):
        return False  # (_dtype_from has refused it already)
    zero = config.get("zero_optimization") or {}
    return bool(zero.get("enable_sanity_checks", False)) if isinstance(zero, dict) else False


def _padded(n: int, ws: int) -> int:
    q = ws * DEFAULT_ALIGN  # the engine's plan: one unit per parameter (partition.py)
    return max(q, -(-n // q) * q)


_INIT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _dtype_from(config, dtype):
    """The dtype zero.Init builds parameters in: ``dtype`` when given (one of DeepSpeed's three),
    else the config's fp16/bf16 sections as the engine's parser reads them (parse_precision: the
    same file reading, hjson and duplicate-key refusal, the same messages; batch sizes are not
    needed here), else fp16, DeepSpeed's default without a config."""
    from ..config import ConfigError, parse_precision
    if dtype is not None:
        if not isinstance(dtype, torch.dtype) or dtype not in _INIT_DTYPES.values():
            raise ConfigError(f"zero.Init(dtype={dtype!r}): parameters are built in torch.float32, torch.float16 "
                              f"or torch.bfloat16 (the dtypes DeepSpeed's zero.Init takes); pass one of them, or "
                              f"leave dtype out to take it from the config's fp16/bf16 sections.")
        return dtype
    if config is None:
        return torch.float16
    try:
        return _INIT_DTYPES[parse_precision(config)]
    except ConfigError as e:
        raise ConfigError(f"zero.Init(config_dict_or_path=...): {e}") from None


def _all_module_classes(root=torch.nn.Module):
    seen, todo = set(), [root]
    while todo:
        c = todo.pop()
        for sub in c.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return seen | {root}


class Init:
    """DeepSpeed's ``deepspeed.zero.Init`` (see the module docstring). Arguments as DeepSpeed's:
    ``config_dict_or_path`` (or ``config``: a dict, a JSON/hjson path or a parsed config, read
    as zspeed.initialize reads it, though only the bf16/fp16 sections matter here) gives the
    dtype unless ``dtype`` (torch.float32, float16 or bfloat16) is passed; ``remote_device`` "cpu", "nvme" or None builds the shards in host
    memory (the engine then moves them where offload_param says: with nvme, the parameters
    nothing trains go to NVMe, docs/ZERO3.md);
    ``enabled=False`` constructs normally. Other DeepSpeed arguments are accepted."""

    _active = 0
    override_module_apply = True  # DeepSpeed's switch: Module.apply sees whole parameters inside the context

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 zero_param_parallel_group=None, zero_quantized_weights=False, zero_quantized_nontrainable_weights=False,
                 sequence_data_parallel_group=None, param_swapper=None, **kwargs):
        del mem_efficient_linear, pin_memory, mpu, zero_param_parallel_group, param_swapper, kwargs
        del zero_quantized_weights, zero_quantized_nontrainable_weights, sequence_data_parallel_group
        if data_parallel_group is not None:
            raise ZeRO3NotSupported("zero.Init(data_parallel_group=...): zspeed partitions over the whole "
                                    "process group; leave data_parallel_group unset.")
        remote = getattr(remote_device, "value", remote_device)
        if remote not in (None, "none", "cpu", "nvme"):
            raise ZeRO3NotSupported(f"zero.Init(remote_device={remote!r}): remote_device is one of None, 'cpu' "
                                    f"and 'nvme'.")
        self.enabled = enabled
        cfg = _read_config(config_dict_or_path if config_dict_or_path is not None else config)
        self.dtype = _dtype_from(cfg, dtype)
        self._sanity = _sanity_checks_from(cfg)
        self._patched: list = []
        self._module = module
        self._depth: dict = {}
        self._build = self._build_ctx = self._rng_mode = None  # the build device and its contexts (__enter__)

    def __enter__(self):
        if not self.enabled:
            return self
        self._build = _build_device()  # (first: an error must leave nothing patched)
        # As DeepSpeed's Init: the process group exists afterwards (a one-process group without
        # a launcher), so code inside may ask torch.distributed for its rank.
        from ... import comm
        comm.init_distributed(verbose=False)
        self.rank, self.ws = world()
        problem = _contradicting_single_rank_pg_error(self.ws, None)
        if problem is not None:
            raise RuntimeError(problem)
        for cls in _all_module_classes():
            init = cls.__dict__.get("__init__")
            if init is not None and not getattr(init, "_zspeed_wrapped", False):
                self._patched.append((cls, init))
                setattr(cls, "__init__", self._wrap(init))
        self._orig_subclass = torch.nn.Module.__dict__.get("__init_subclass__")

        def init_subclass(cls, **kw):  # classes defined inside the context
            init = cls.__dict__.get("__init__")
            if init is not None and not getattr(init, "_zspeed_wrapped", False):
                self._patched.append((cls, init))
                cls.__init__ = self._wrap(init)
        torch.nn.Module.__init_subclass__ = classmethod(init_subclass)
        # torch.nn.utils.skip_init builds a module on the meta device, then to_empty() gives it
        # new (real) parameters: those are converted and partitioned there, as DeepSpeed's Init does.
        self._orig_to_empty = None
        if "_zspeed_wrapped" not in torch.nn.Module.to_empty.__dict__:
            self._orig_to_empty = torch.nn.Module.to_empty
            torch.nn.Module.to_empty = self._wrap_to_empty(self._orig_to_empty)
        self._orig_apply = None
        if Init.override_module_apply and "_zspeed_wrapped" not in torch.nn.Module.apply.__dict__:
            self._orig_apply = torch.nn.Module.apply
            torch.nn.Module.apply = self._wrap_apply(self._orig_apply)
        Init._active += 1
        # As DeepSpeed's Init, tensors are created on the accelerator (there the default
        # initialisations run many times faster than torch's one-threaded CPU generator) and
        # each module's parameters go to host memory, in the training dtype, as its constructor
        # returns. ZSPEED_INIT_DEVICE=cpu builds on the CPU.
        self._build_ctx = torch.device(self._build) if self._build is not None else None
        self._rng_mode = _FillsOnDevice(self._build) if self._build is not None else None
        if self._build_ctx is not None:
            self._build_ctx.__enter__()
            self._rng_mode.__enter__()
        if self._module is not None:  # an existing model: convert it now
            for m in self._module.modules():
                self._convert(m)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for cls, init in reversed(self._patched):
            cls.__init__ = init
        self._patched.clear()
        if self._orig_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._orig_subclass
        if self._orig_apply is not None:
            torch.nn.Module.apply = self._orig_apply
            self._orig_apply = None
        if self._orig_to_empty is not None:
            torch.nn.Module.to_empty = self._orig_to_empty
            self._orig_to_empty = None
        if self._build_ctx is not None:
            self._rng_mode.__exit__(None, None, None)
            self._build_ctx.__exit__(None, None, None)
            self._build_ctx = self._rng_mode = None
        Init._active -= 1
        return False

    def _wrap(self, init):

        @functools.wraps(init)
        def __init__(module, *args, **kwargs):
            key = id(module)
            self._depth[key] = self._depth.get(key, 0) + 1
            try:
                init(module, *args, **kwargs)
            finally:
                self._depth[key] -= 1
            if self._depth[key] == 0:
                del self._depth[key]
                self._convert(module)
        __init__._zspeed_wrapped = True
        return __init__

    def _wrap_to_empty(self, to_empty):
        """Module.to_empty inside the context: the new parameters of every module whose
        constructor has returned are converted (dtype, host memory, this rank's shard) as its
        constructor's were; a module still being built is converted when its constructor returns."""

        @functools.wraps(to_empty)
        def wrapped(module, *args, **kwargs):
            out = to_empty(module, *args, **kwargs)
            for m in module.modules():
                if id(m) not in self._depth:
                    self._convert(m)
            return out
        wrapped._zspeed_wrapped = True
        return wrapped

    def _wrap_apply(self, apply):
        """Module.apply inside the context: ``fn`` sees each module's partitioned parameters
        whole (gathered from the shards); afterwards rank 0's values are kept (broadcast) and
        partitioned again, so an initialisation a parent runs over children that were
        partitioned when their own constructors finished is not lost."""

        def on_module(fn):
            if getattr(fn, "_zspeed_gathers", False):  # Module.apply recursing into the children
                return fn

            def run(module):
                from ..zero3 import fetcher_of
                mine = [p for p in module.parameters(recurse=False)  # zero.Init's (not an engine's) shards
                        if hasattr(p, "ds_tensor") and p.numel() == 0 and fetcher_of(p) is None]
                with torch.no_grad():
                    for p in mine:
                        init_gather(p)
                # fn runs where the module was built (the accelerator: see __enter__), on its
                # parameters' whole values, which then go back to host memory
                away = self._to_build_device(module)
                try:
                    out = fn(module)
                except BaseException:
                    self._back_to_host(away)
                    for p in mine:  # the shards stay as they were
                        shard_only(p)
                    raise
                self._back_to_host(away)
                bad = next((p for p in mine if tuple(p.shape) != tuple(p.ds_shape)), None)
                if bad is not None:
                    for p in mine:
                        shard_only(p)
                    raise RuntimeError(
                        f"Module.apply inside zero.Init changed the shape of a partitioned parameter of "
                        f"{type(module).__name__} from {tuple(bad.ds_shape)} to {tuple(bad.shape)}; the change was "
                        f"discarded. Change values only, or build the parameter with its final shape.")
                with torch.no_grad():
                    _broadcast(mine, 0)
                    for p in mine:
                        init_scatter(p)
                if id(module) not in self._depth:  # new parameters fn put in place of the partitioned ones
                    self._convert(module)
                return out
            run._zspeed_gathers = True
            return run

        @functools.wraps(apply)
        def wrapped(module, fn):
            return apply(module, on_module(fn))
        wrapped._zspeed_wrapped = True
        return wrapped

    def _to_build_device(self, module) -> list:
        """The module's own parameters in host memory, moved to the build device (none without
        one); returns them."""
        if self._build is None:
            return []
        moved = [p for p in module.parameters(recurse=False) if p.device.type == "cpu" and p.numel()]
        with torch.no_grad():
            for p in moved:
                p.data = p.data.to(self._build)
        return moved

    @staticmethod
    def _back_to_host(params: list) -> None:
        with torch.no_grad():
            for p in params:
                p.data = _to_host(p.data, p.dtype)

    def _convert(self, module) -> None:
        """The module's own parameters: to the dtype in host memory and, with several ranks,
        cut to this rank's shard (``p.ds_tensor``; ``p.data`` emptied)."""
        with torch.no_grad():
            for p in module.parameters(recurse=False):
                if hasattr(p, "ds_shape") or p.device.type == "meta":
                    continue
                dt = self.dtype if p.is_floating_point() else p.dtype
                if self.ws == 1 or p.numel() == 0:
                    p.data = _to_host(p.data, dt)  # (converted where it was built: half the bytes to copy)
                    mark_whole(p, sanity_checks=self._sanity)  # (DeepSpeed's marks; whole, so AVAILABLE)
                    continue
                n, shape = p.numel(), p.shape
                dev = comm_device()
                full = torch.zeros(_padded(n, self.ws), dtype=dt, device=dev)
                full[:n].copy_(p.data.reshape(-1))
                td.broadcast(full, 0)
                s = full.numel() // self.ws
                p.ds_tensor = full[self.rank * s:(self.rank + 1) * s].to("cpu", copy=True)
                p.ds_shape, p.ds_numel = shape, n
                p.data = torch.empty(0, dtype=dt)
                mark_partitioned(p, sanity_checks=self._sanity)


def _to_host(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in host memory in ``dtype``, converted where it is; a large destination is advised to
    use huge pages (its first-touch page faults set the pace of a device-to-host copy)."""
    t = t.to(dtype)
    if t.device.type == "cpu":
        return t
    from ..hostmem import advise_huge_pages
    out = torch.empty(t.shape, dtype=dtype, device="cpu")
    advise_huge_pages(out)
    out.copy_(t)
    return out


# In-place random fills torch's nn.init uses; on the GPU they run many times faster than on
# torch's one-threaded CPU generator.
_RANDOM_FILLS = frozenset(getattr(torch.Tensor, n) for n in (
    "normal_", "uniform_", "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_", "random_"))
_FILL_ON_DEVICE_FROM = 1 << 16  # elements: smaller host tensors are filled where they are


class _FillsOnDevice(torch.overrides.TorchFunctionMode):
    """Inside zero.Init with a build device: a random fill of a large host tensor (a ``torch.nn.init``
    function or a tensor's in-place random method on a parameter that is in host memory already,
    e.g. a parent's scaled initialisation of its children's weights after they were built, as
    GPT-2-style models do) runs on the build device and is copied back, as the fills of tensors
    still on the device do. A fill with an explicit CPU generator stays on the CPU."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.moved = 0  # fills run on the device (for tests)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # (torch.nn.init's functions reach a mode as themselves, their tensor as tensor=, before
        # their tensor methods do)
        t = args[0] if args else kwargs.get("tensor")
        fill = func in _RANDOM_FILLS or getattr(func, "__module__", None) == "torch.nn.init"
        if fill and isinstance(t, torch.Tensor) and t.device.type == "cpu" and \
                t.numel() >= _FILL_ON_DEVICE_FROM and kwargs.get("generator") is None:
            with torch.no_grad():
                on = t.to(self.device)
                if args:
                    func(on, *args[1:], **kwargs)
                else:
                    func(**{**kwargs, "tensor": on})
                t.copy_(on)
            self.moved += 1
            return t
        return func(*args, **kwargs)


def _build_device() -> torch.device | None:
    """Where zero.Init creates tensors: the GPU the engine will use, when there is one (as
    DeepSpeed's Init, which creates them on the accelerator), unless ZSPEED_INIT_DEVICE=cpu;
    None: where torch creates them anyway (the CPU)."""
    import os
    from ..config import ConfigError
    choice = os.environ.get("ZSPEED_INIT_DEVICE", "").strip().lower()
    pick = _INIT_DEVICES.get(choice)
    if pick is None:
        raise ConfigError(f"ZSPEED_INIT_DEVICE={choice!r}: use cpu (zero.Init builds the model on the CPU) or "
                          f"cuda (on the GPU the engine will use, the default when there is one).")
    return pick()


def _engine_gpu() -> torch.device | None:
    """The GPU the engine will use, or None (no GPU, or ZSPEED_DEVICE=cpu)."""
    from ..device import pick_device
    dev = pick_device()
    return {"cuda": dev}.get(dev.type)


# ZSPEED_INIT_DEVICE -> where zero.Init builds
_INIT_DEVICES = {"": _engine_gpu, "cuda": _engine_gpu, "cpu": lambda: None}


def _init_edited(params) -> bool:
    """Whether this rank's part of a gathered zero.Init parameter differs from its shard (an edit
    through ``p.data``, which no version counter sees)."""
    rank, _ = world()
    with torch.no_grad():
        for p in params:
            s = p.ds_tensor.numel()
            flat = p.data.reshape(-1)
            lo, hi = rank * s, min((rank + 1) * s, p.ds_numel)
            if hi > lo and not torch.equal(flat[lo:hi].to(p.ds_tensor.device), p.ds_tensor.reshape(-1)[:hi - lo]):
                return True
    return False


def _broadcast(params, src: int) -> None:
    with torch.no_grad():
        for p in params:
            if td.get_backend() == "nccl" or p.device.type == "cpu":
                buf = p.data if p.data.is_contiguous() else p.data.contiguous()
                td.broadcast(buf, src=src)
                if buf is not p.data:
                    p.data.copy_(buf)
            else:
                buf = p.data.cpu()
                td.broadcast(buf, src=src)
                p.data.copy_(buf)


class GatheredParameters:
    """DeepSpeed's context for reading or editing partitioned parameters (see the module
    docstring). ``params``: a parameter or an iterable of them; ``modifier_rank``: the rank
    whose edits are kept (None: read only, edits are discarded as in DeepSpeed);
    ``enabled=False`` does nothing."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled: bool = True):
        del fwd_module
        self._versions: list = []
        if torch.is_tensor(params):
            params = [params]
        self.params = []
        seen = set()
        for p in (params or []):
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        self.modifier_rank = modifier_rank
        self.enabled = enabled
        self._groups: list = []
        self._init_params: list = []

    def __enter__(self):
        if not self.enabled:
            return None
        r = self.modifier_rank
        _, ws = world()
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < ws):
            raise ValueError(f"GatheredParameters(modifier_rank={r!r}): modifier_rank is None (read only) or the "
                             f"rank whose edits are kept, an integer from 0 to {ws - 1}.")
        from ..zero3 import fetcher_of, pin
        by_fetcher: dict = {}
        for p in self.params:
            f = fetcher_of(p)
            if f is not None:
                by_fetcher.setdefault(id(f), (f, []))[1].append(p)
            elif hasattr(p, "ds_tensor"):
                self._init_params.append(p)
        with torch.no_grad(), _collectives("entering"):
            for f, ps in by_fetcher.values():
                self._groups.append((f, pin(f, ps)))
            for p in self._init_params:
                init_gather(p)
        # What an in-place edit changes, to refuse edits without a modifier rank (DeepSpeed's rule).
        self._versions = [(st.p, st.p.data_ptr(), st.p._version) for _, sts in self._groups for st in sts] + \
            [(p, p.data_ptr(), p._version) for p in self._init_params]
        return None

    def __exit__(self, typ, exc, tb):
        if not self.enabled:
            return False
        from ..zero3 import edited_locally, unpin
        modified = exc is None and self.modifier_rank is not None
        edited = exc is None and self.modifier_rank is None and (
            any(p.data_ptr() != ptr or p._version != v for p, ptr, v in self._versions)
            or any(edited_locally(sts) for _f, sts in self._groups) or _init_edited(self._init_params))
        _, ws = world()
        if exc is None and self.modifier_rank is None and ws > 1:  # any rank's edit counts
            flag = torch.tensor([1.0 if edited else 0.0], device=comm_device())
            with _collectives("leaving"):
                td.all_reduce(flag, op=td.ReduceOp.MAX)
            edited = bool(flag.item())
        with torch.no_grad(), _collectives("leaving"):
            if modified and ws > 1:
                _broadcast(self.params, self.modifier_rank)
            for f, sts in self._groups:
                unpin(f, sts, modified)
            for p in self._init_params:
                if modified:
                    init_scatter(p)
                else:
                    shard_only(p)
        self._groups.clear()
        self._init_params.clear()
        self._versions = []
        if edited:
            msg = ("partitioned (ZeRO-3) parameters were modified in place inside GatheredParameters with "
                   "modifier_rank=None; the edits were discarded. Pass modifier_rank=<rank> (the rank whose values "
                   "are kept and broadcast) to keep them.")
            if any(getattr(p, "ds_enable_sanity_checks", False) for p in self.params):
                raise RuntimeError(msg)  # zero_optimization.enable_sanity_checks (DeepSpeed's rule)
            log.warning("zspeed: %s (zero_optimization.enable_sanity_checks true makes this an error, as in "
                        "DeepSpeed.)", msg)
        return False


def _collectives(when: str):
    """GatheredParameters' collectives on several ranks (comm.guarded): a long wait is said, and a
    failed one is a DistributedError saying every rank must enter the context with the same
    parameters (a raw backend error said nothing of it)."""
    from ... import comm
    return comm.guarded(f"of GatheredParameters ({when} the context)", f"Every rank must enter GatheredParameters "
                        f"with the same parameters at the same point; {comm.ONE_RANK_HINT}.")


def register_external_parameter(module, parameter) -> None:
    """DeepSpeed's ZeRO-3 declaration that ``module``'s forward uses ``parameter``, which another
    module owns: the parameter is gathered with the module's own. Below stage 3 (or before
    the engine exists) there is nothing to do."""
    from ..zero3 import fetcher_of
    f = fetcher_of(parameter)
    if f is not None:
        f.add_external(module, parameter)


def unregister_external_parameter(module, parameter) -> None:
    """Undoes :func:`register_external_parameter`."""
    from ..zero3 import fetcher_of
    f = fetcher_of(parameter)
    if f is not None:
        f.remove_external(module, parameter)



@contextlib.contextmanager
def unwrap_model_for_generation(model):
    """DeepSpeed's context for generating with a ZeRO-3 model (as TRL does; also
    ``runtime.zero.stage3.unwrap_model_for_generation``): inside it every parameter is whole on
    every rank (GatheredParameters over the model, read-only) and, for an engine, the ZeRO-3
    hooks are off (``engine.optimizer.parameter_offload.forward_hooks`` is empty), so
    ``model.generate`` runs without a gather or a hook per module; they are back on leaving it,
    also on an exception. It yields the model. Every rank must enter it. Below stage 3 the
    parameters are whole already and it just yields the model."""
    from ..zero3 import ParamFetcher
    fetcher = getattr(model, "_fetcher", None)  # an engine's (a plain module has none)
    fetcher = fetcher if isinstance(fetcher, ParamFetcher) else None
    with GatheredParameters(list(model.parameters())):
        if fetcher is None:
            yield model
            return
        fetcher._remove_module_hooks()
        for st in fetcher.states.values():
            st.p.ds_active_sub_modules.clear()
        try:
            yield model
        finally:
            fetcher._register_deepspeed_module(fetcher.module)
