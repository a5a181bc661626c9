"""DeepSpeed's accelerator abstraction (``deepspeed.accelerator.get_accelerator()``) for
the two devices zspeed trains on: CUDA GPUs and the CPU.

Scripts written for DeepSpeed ask the accelerator for the device name, set the device,
synchronize, read memory statistics and check bf16 support. :func:`get_accelerator`
returns the CUDA accelerator when torch sees a GPU and the CPU one otherwise, following
the same rule as the engine (``ZSPEED_DEVICE=cpu`` forces the CPU). Everything
forwards to torch; DeepSpeed's op builders (JIT-compiled C++ extensions) do not exist in
zspeed, whose native code is one prebuilt C library, so asking for one is an error that
says what to use instead.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

import torch

__all__ = ["get_accelerator", "set_accelerator", "is_current_accelerator_supported",
           "ZSpeedAccelerator", "CUDAAccelerator", "CPUAccelerator"]


class ZSpeedAccelerator:
    """What both accelerators share; see DeepSpeed's abstract accelerator for the names."""

    _name = "abstract"

    # -- behaviour flags DeepSpeed's engine reads -------------------------------------------------
    def is_synchronized_device(self) -> bool:
        return self._name == "cpu"

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    # -- RNG ---------------------------------------------------------------------------------------
    def random(self):
        return torch.random

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def initial_seed(self):
        return torch.initial_seed()

    # -- dtypes ------------------------------------------------------------------------------------
    def supported_dtypes(self) -> list:
        out = [torch.float32]
        if self.is_fp16_supported():
            out.append(torch.float16)
        if self.is_bf16_supported():
            out.append(torch.bfloat16)
        return out

    def is_triton_supported(self) -> bool:
        return False

    # -- profiling ranges (no-ops unless the device has them) ---------------------------------------
    def range_push(self, msg, domain=None, category=None):
        return None

    def range_pop(self, domain=None):
        return None

    def lazy_call(self, callback):
        return callback()

    # -- memory pinning ------------------------------------------------------------------------------
    def pin_memory(self, tensor, align_bytes=1, make_copy=True, match_shape=True):
        return tensor

    def is_pinned(self, tensor) -> bool:
        return bool(tensor.is_pinned()) if torch.cuda.is_available() else False

    def on_accelerator(self, tensor) -> bool:
        return tensor.device.type == self._name

    # -- legacy tensor types (torch.FloatTensor, torch.cuda.FloatTensor, ...) -----------------------
    def _legacy(self, name: str):
        return getattr(torch.cuda if self._name == "cuda" else torch, name)

    BFloat16Tensor = property(lambda self: self._legacy("BFloat16Tensor"))
    ByteTensor = property(lambda self: self._legacy("ByteTensor"))
    DoubleTensor = property(lambda self: self._legacy("DoubleTensor"))
    FloatTensor = property(lambda self: self._legacy("FloatTensor"))
    HalfTensor = property(lambda self: self._legacy("HalfTensor"))
    IntTensor = property(lambda self: self._legacy("IntTensor"))
    LongTensor = property(lambda self: self._legacy("LongTensor"))

    # -- DeepSpeed's C++ op builders ------------------------------------------------------------------
    def op_builder_dir(self) -> str:
        return "zspeed.ops"

    def create_op_builder(self, class_name):
        raise NotImplementedError(
            f"DeepSpeed's op builder {class_name!r} does not exist in zspeed: there is nothing to compile. "
            f"zspeed's native ops (CPU Adam/Adagrad/Lion, async I/O) come prebuilt in libzspeed: use "
            f"zspeed.ops.adam.DeepSpeedCPUAdam, zspeed.ops.aio.AsyncIOHandle, or the engine's offload.")

    get_op_builder = create_op_builder

    def build_extension(self):
        raise NotImplementedError("zspeed builds no torch extensions; its native code is libzspeed.")

    # -- environment -----------------------------------------------------------------------------------
    def export_envs(self) -> list:
        return []

    def visible_devices_envs(self) -> list:
        return []

    def set_visible_devices_envs(self, current_env, local_accelerator_ids):
        for env in self.visible_devices_envs():
            current_env[env] = ",".join(map(str, local_accelerator_ids))

    def get_compile_backend(self) -> str:
        return getattr(self, "_compile_backend", "inductor")

    def set_compile_backend(self, backend):
        self._compile_backend = backend

    def communication_backend_name(self) -> str:
        from .comm import default_backend
        return default_backend(torch.device(self._name))


class CUDAAccelerator(ZSpeedAccelerator):
    _name = "cuda"

    def device_name(self, device_index: Optional[int] = None) -> str:
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def device(self, device_index=None):
        return torch.cuda.device(device_index)

    def set_device(self, device_index):
        torch.cuda.set_device(device_index)

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}"

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def synchronize(self, device_index=None):
        return torch.cuda.synchronize(device_index)

    def set_rng_state(self, new_state, device_index=None):
        return torch.cuda.set_rng_state(new_state) if device_index is None else \
            torch.cuda.set_rng_state(new_state, device_index)

    def get_rng_state(self, device_index=None):
        return torch.cuda.get_rng_state() if device_index is None else torch.cuda.get_rng_state(device_index)

    def manual_seed(self, seed):
        return torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.cuda.manual_seed_all(seed)

    def initial_seed(self):
        return torch.cuda.initial_seed()

    def default_generator(self, device_index):
        return torch.cuda.default_generators[device_index]

    @property
    def Stream(self):
        return torch.cuda.Stream

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    @property
    def Event(self):
        return torch.cuda.Event

    def empty_cache(self):
        return torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_cached(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    def max_memory_cached(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    def reset_max_memory_cached(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_stats(self, device_index=None):
        return torch.cuda.memory_stats(device_index)

    def reset_peak_memory_stats(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    def total_memory(self, device_index=None):
        return torch.cuda.get_device_properties(device_index or 0).total_memory

    def available_memory(self, device_index=None):
        free, _ = torch.cuda.mem_get_info(device_index)
        return free

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()

    def is_fp16_supported(self) -> bool:
        return torch.cuda.is_available()

    def range_push(self, msg, domain=None, category=None):
        return torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain=None):
        return torch.cuda.nvtx.range_pop()

    def pin_memory(self, tensor, align_bytes=1, make_copy=True, match_shape=True):
        return tensor.pin_memory()

    def visible_devices_envs(self) -> list:
        return ["CUDA_VISIBLE_DEVICES"]

    def is_triton_supported(self) -> bool:
        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


class CPUAccelerator(ZSpeedAccelerator):
    _name = "cpu"

    def device_name(self, device_index: Optional[int] = None) -> str:
        return "cpu"

    def device(self, device_index=None):
        return None

    def set_device(self, device_index):
        return None

    def current_device(self) -> int:
        from .comm import get_local_rank
        return get_local_rank()

    def current_device_name(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        """DeepSpeed's CPU accelerator counts LOCAL_SIZE "devices" when that variable is set (its
        launchers and test harnesses set it to the processes a host may run); otherwise the
        processes on this host."""
        from .comm import _env_int, get_local_world_size
        size = _env_int("LOCAL_SIZE", 0)
        return size if size else get_local_world_size()

    def is_available(self) -> bool:
        return True

    def synchronize(self, device_index=None):
        return None

    def set_rng_state(self, new_state, device_index=None):
        return torch.set_rng_state(new_state)

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def manual_seed_all(self, seed):
        return torch.manual_seed(seed)

    def default_generator(self, device_index):
        return torch.default_generator

    class _NoStream:
        """The CPU runs everything in order: streams and events are no-ops."""

        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def synchronize(self):
            return None

        def wait_stream(self, other):
            return None

        def wait_event(self, event):
            return None

        def record_event(self, event=None):
            return event

        def record(self, stream=None):
            return None

        def query(self):
            return True

        def elapsed_time(self, other):
            return 0.0

    Stream = _NoStream
    Event = _NoStream

    def stream(self, stream):
        return self._NoStream()

    def current_stream(self, device_index=None):
        return self._NoStream()

    default_stream = current_stream

    def empty_cache(self):
        return None

    @staticmethod
    def _rss() -> int:
        try:
            if sys.platform == "win32":
                return _windows_working_set()
            if sys.platform.startswith("linux"):
                with open("/proc/self/statm") as f:
                    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            import resource
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return peak * (1 if sys.platform == "darwin" else 1024)
        except (OSError, ValueError, ImportError):
            return 0

    def memory_allocated(self, device_index=None):
        rss = self._rss()
        self._max = max(getattr(self, "_max", 0), rss)
        return rss

    def max_memory_allocated(self, device_index=None):
        self.memory_allocated()
        return self._max

    def reset_max_memory_allocated(self, device_index=None):
        self._max = self._rss()

    memory_cached = memory_allocated
    max_memory_cached = max_memory_allocated
    reset_max_memory_cached = reset_max_memory_allocated
    memory_reserved = memory_allocated
    max_memory_reserved = max_memory_allocated
    reset_peak_memory_stats = reset_max_memory_allocated

    def memory_stats(self, device_index=None):
        return {"allocated_bytes.all.current": self.memory_allocated(),
                "allocated_bytes.all.peak": self.max_memory_allocated()}

    def total_memory(self, device_index=None):
        from . import _native
        try:
            return int(_native.lib.zs_ram_bytes())
        except Exception:  # noqa: BLE001 - no library: ask the OS through Python
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def available_memory(self, device_index=None):
        return max(0, self.total_memory() - self.memory_allocated())

    def is_bf16_supported(self) -> bool:
        return True

    def is_fp16_supported(self) -> bool:
        return True


_accelerator: Optional[ZSpeedAccelerator] = None


def get_accelerator() -> ZSpeedAccelerator:
    """The accelerator of this process: CUDA when torch sees a GPU (and ZSPEED_DEVICE does
    not say cpu), else the CPU. Decided once."""
    global _accelerator
    if _accelerator is None:
        forced = os.environ.get("ZSPEED_DEVICE", "")
        use_cuda = torch.cuda.is_available() and not forced.startswith("cpu")
        _accelerator = CUDAAccelerator() if use_cuda else CPUAccelerator()
    return _accelerator


def set_accelerator(accel_obj: ZSpeedAccelerator) -> None:
    global _accelerator
    if not isinstance(accel_obj, ZSpeedAccelerator):
        raise TypeError(f"set_accelerator needs a zspeed accelerator, got {type(accel_obj).__name__}")
    _accelerator = accel_obj


def is_current_accelerator_supported() -> bool:
    return get_accelerator()._name in ("cuda", "cpu")


def _windows_working_set() -> int:
    """This process's working set in bytes (Windows: K32GetProcessMemoryInfo)."""
    import ctypes
    from ctypes import wintypes

    class Counters(ctypes.Structure):
        _fields_ = [("cb", wintypes.DWORD), ("PageFaultCount", wintypes.DWORD),
                    ("PeakWorkingSetSize", ctypes.c_size_t), ("WorkingSetSize", ctypes.c_size_t),
                    ("QuotaPeakPagedPoolUsage", ctypes.c_size_t), ("QuotaPagedPoolUsage", ctypes.c_size_t),
                    ("QuotaPeakNonPagedPoolUsage", ctypes.c_size_t), ("QuotaNonPagedPoolUsage", ctypes.c_size_t),
                    ("PagefileUsage", ctypes.c_size_t), ("PeakPagefileUsage", ctypes.c_size_t)]
    c = Counters()
    c.cb = ctypes.sizeof(Counters)
    k32 = ctypes.windll.kernel32
    k32.GetCurrentProcess.restype = wintypes.HANDLE
    k32.K32GetProcessMemoryInfo.argtypes = [wintypes.HANDLE, ctypes.c_void_p, wintypes.DWORD]
    k32.K32GetProcessMemoryInfo.restype = wintypes.BOOL
    if not k32.K32GetProcessMemoryInfo(k32.GetCurrentProcess(), ctypes.byref(c), c.cb):
        return 0
    return int(c.WorkingSetSize)
