"""ZeRO-Infinity optimizer offload to NVMe, on libzspeed's C swapper.

:class:`NVMeOptimizerSwapper` keeps the fp32 master weights and optimizer
state of N parameter partitions in one file under ``nvme_path`` and runs a
whole optimizer step over them as a C pipeline (read partition i+1 while
stepping partition i while writing back i-1, through ``buffer_count``
page-locked buffers). Gradients and the optional low-precision copies of the
updated weights are the caller's buffers: numpy arrays, torch CPU tensors
(pinned or not) or other buffers (see zspeed.ops._tensors). The numerics are exactly those of the in-RAM kernels
(``zs_adam_step`` / ``zs_adagrad_step`` / ``zs_lion_step``), bit for bit.

Error guarantee (see include/zspeed/swap.h): when :meth:`step` raises
(ENOSPC, EIO, a truncated file, ...), every partition is still exactly at
the previous step, :attr:`steps` has not moved, and calling :meth:`step`
again with the same gradients is safe. The ``out`` buffers of a failed step
must be ignored.

Only numpy is needed; torch is used only when tensors are passed in.
"""
from __future__ import annotations

import ctypes
import os
import secrets
from typing import Any, Sequence

import numpy as np

from .._native import ZSpeedError, check, lib
from .._optimizers import ALGORITHMS
from .._signatures.aio import AioConfig
from .._signatures.optim import BF16, F16, F32, OPTIM_QBLOCK, Q8
from .._signatures.swap import SwapConfig, SwapOptimizer, SwapStats, SwapStepArgs
from ._lifetime import NativeHandleOwner
from ._tensors import INT32, INT64, UINT64, buf, integer, is_torch
from .aio import BACKENDS, DIRECT

__all__ = ["NVMeOptimizerSwapper", "OPTIMIZERS", "STATE_DTYPES"]

# Names of gradient / output dtypes (grad_dtype=, out_dtype=).
_DT_NAMES = {"fp32": F32, "float32": F32, "bf16": BF16, "bfloat16": BF16,
             "fp16": F16, "float16": F16}
# name -> (zs_swap_optimizer, adamw_mode)
OPTIMIZERS = {"adamw": (SwapOptimizer.ADAM, 1), "adam": (SwapOptimizer.ADAM, 0),
              "adagrad": (SwapOptimizer.ADAGRAD, 1), "lion": (SwapOptimizer.LION, 1)}
STATE_DTYPES = {"fp32": F32, "bf16": BF16, "int8": Q8}
# numpy dtype of the stored fp32 / bf16 state elements (bf16 as bit patterns).
_STORED = {F32: np.float32, BF16: np.uint16}
# torch's state key names per optimizer: (key of m, key of v), the kernel's two state slots.
_STATE_KEYS = {OPTIMIZERS[a.kernel][0]: a.slots for a in ALGORITHMS.values()}


def _view(obj: Any, what: str, n: int, dtype: str | None = None) -> tuple[int, int]:
    """(address, DType) of a buffer of n fp32, bf16 or fp16 elements; dtype
    (a name of _DT_NAMES), when given, must be the buffer's."""
    b = buf(obj, what)
    if dtype is not None and _DT_NAMES.get(dtype) != b.dtype:
        raise TypeError(f"{what} has dtype {b.kind}, but dtype={dtype!r} was given")
    if b.n != n:
        raise ValueError(f"{what} has {b.n} elements, the partition has {n}")
    return b.ptr, b.dtype


def _f32(obj: Any, what: str, n: int) -> tuple[int, Any]:
    """Address of n fp32 values to read: the buffer itself if it is one,
    else a float32 numpy copy (numpy uint16 read as bf16 bits, as everywhere
    in zspeed). Returns (address, the object that owns the memory)."""
    try:
        b = buf(obj, what)
    except (TypeError, ValueError):
        b = None  # not usable as it is: converted below
    if b is not None and b.dtype == F32 and b.n == n:
        return b.ptr, obj
    if is_torch(obj):
        arr = obj.detach().float().cpu().numpy()
    else:
        arr = np.asarray(obj)
        if arr.dtype == np.uint16:
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if arr.size != n:
        raise ValueError(f"{what} has {arr.size} elements, the partition has {n}")
    return arr.ctypes.data, arr


def _typed(obj: Any, what: str, dtype: Any, count: int) -> tuple[int, Any]:
    """(address, owner) of ``count`` C-contiguous elements of exactly ``dtype``
    (uint16 accepts torch bfloat16 tensors: their bit patterns), through the one
    buffer adapter."""
    b = buf(obj, what, allowed=None)
    kind = "uint16" if b.kind == "bfloat16" else b.kind
    if kind != np.dtype(dtype).name:
        raise TypeError(f"{what} has dtype {b.kind}; this partition stores it as {np.dtype(dtype)}")
    if b.n != count:
        raise ValueError(f"{what} has {b.n} elements; the partition's array has {count}")
    return b.ptr, b


class NVMeOptimizerSwapper(NativeHandleOwner):
    """Optimizer state of ``len(sizes)`` partitions on NVMe, stepped in C.

    Arguments:
      sizes: elements of each partition (ints >= 1).
      nvme_path: directory for the swap file (DeepSpeed's
        ``offload_optimizer.nvme_path``); it must exist.
      optimizer: "adamw" (default), "adam" (L2 weight decay), "adagrad",
        "lion".
      lr, betas, eps, weight_decay: hyperparameters; None = the optimizer's
        default (optim.h). bias_correction: Adam only.
      state_dtype: "fp32" (default), "bf16", or "int8" (Adam only).
      buffer_count: pinned buffers (DeepSpeed's ``buffer_count``; >= 3
        overlaps read, compute and write).
      name: file stem (default ``zspeed_swap_<random>``, new for every
        swapper, so a restarted process never meets a file of its
        predecessor); the file is ``<nvme_path>/<name>.swap`` and is deleted
        by :meth:`close`.
      overwrite: replace an existing file of that name (default False).
      num_threads: compute threads incl. the caller (0 = all).
      block_size, queue_depth, intra_op_parallelism, backend: the aio
        engine's settings (DeepSpeed's ``aio`` section; backend auto |
        io_uring | threads | iocp), single_submit, overlap_events (None:
        the aio engine's default). direct: auto | on | off.
      sync_each_step: fsync the file before committing each step.
      compact: one slot per partition plus a few spares (about half the
        disk; "Compact layout" in swap.h): every step must then be
        resumable, and :meth:`abandon_step` drops the stepped partitions'
        state (each must be written again, e.g. from a checkpoint).
    """

    def __init__(self, sizes: Sequence[int], nvme_path: str | os.PathLike, *,
                 optimizer: str = "adamw", lr: float | None = None,
                 betas: tuple[float, float] | None = None, eps: float | None = None,
                 weight_decay: float | None = None, bias_correction: bool = True,
                 state_dtype: str = "fp32", buffer_count: int = 4,
                 name: str | None = None, overwrite: bool = False,
                 num_threads: int = 0, block_size: int = 4 << 20,
                 queue_depth: int = 32, intra_op_parallelism: int = 1,
                 backend: str = "auto", direct: str = "auto",
                 sync_each_step: bool = False, single_submit: bool = False,
                 overlap_events: bool | None = None, compact: bool = False):
        self._h = None
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype must be one of {sorted(STATE_DTYPES)}, "
                             f"got {state_dtype!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
        if direct not in DIRECT:
            raise ValueError(f"direct must be one of {sorted(DIRECT)}, got {direct!r}")
        self.sizes = [integer(n, f"sizes[{i}]", UINT64) for i, n in enumerate(sizes)]
        if not self.sizes:
            raise ValueError("sizes must name at least one partition")
        self.optimizer, self.state_dtype = optimizer, state_dtype
        kind, adamw = OPTIMIZERS[optimizer]
        self._kind = kind
        cfg = SwapConfig()
        lib.zs_swap_config_init(ctypes.byref(cfg))
        self._sizes_c = (ctypes.c_uint64 * len(self.sizes))(*self.sizes)
        self._path_b = os.fsencode(os.fspath(nvme_path))
        if name is None:
            name = f"zspeed_swap_{secrets.token_hex(8)}"
        self._name_b = os.fsencode(name)
        cfg.path, cfg.name, cfg.overwrite = self._path_b, self._name_b, int(bool(overwrite))
        cfg.partitions, cfg.sizes = len(self.sizes), self._sizes_c
        cfg.buffer_count, cfg.optimizer = integer(buffer_count, "buffer_count", INT32), kind
        cfg.state_dtype = STATE_DTYPES[state_dtype]
        if lr is not None:
            cfg.lr = float(lr)
        if betas is not None:
            cfg.beta1, cfg.beta2 = float(betas[0]), float(betas[1])
        if eps is not None:
            cfg.eps = float(eps)
        if weight_decay is not None:
            cfg.weight_decay = float(weight_decay)
        cfg.adamw_mode, cfg.bias_correction = adamw, int(bool(bias_correction))
        cfg.num_threads = integer(num_threads, "num_threads", INT32)
        cfg.direct = DIRECT[direct]
        cfg.sync_each_step = int(bool(sync_each_step))
        cfg.compact = int(bool(compact))
        self._aio = AioConfig()
        lib.zs_aio_config_init(ctypes.byref(self._aio))
        self._aio.block_size = integer(block_size, "block_size", INT64)
        self._aio.queue_depth = integer(queue_depth, "queue_depth", INT32)
        self._aio.intra_op_parallelism = integer(intra_op_parallelism, "intra_op_parallelism", INT32)
        self._aio.backend = BACKENDS[backend]
        self._aio.single_submit = int(bool(single_submit))
        if overlap_events is not None:
            self._aio.overlap_events = int(bool(overlap_events))
        cfg.aio = ctypes.cast(ctypes.byref(self._aio), ctypes.c_void_p)
        h = ctypes.c_void_p()
        check(lib.zs_swap_create(ctypes.byref(h), ctypes.byref(cfg)), "zs_swap_create")
        self._h = h

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Frees the buffers and deletes the swap file (idempotent)."""
        if self._h is not None:
            h, self._h = self._h, None
            check(lib.zs_swap_destroy(h), "zs_swap_destroy")

    @property
    def _handle(self):
        if self._h is None:
            raise ZSpeedError("this NVMeOptimizerSwapper is closed")
        return self._h

    def _part(self, i: int) -> int:
        i = integer(i, "partition", INT32)
        if not 0 <= i < len(self.sizes):
            raise IndexError(f"partition {i} out of range [0, {len(self.sizes)})")
        return i

    # ---------------------------------------------------------------- step
    def init_partition(self, i: int, params: Any) -> None:
        """Sets partition i's fp32 master weights (any float array/tensor of
        its size, converted to fp32) and zeroes its optimizer state."""
        addr, _keep = _f32(params, "params", self.sizes[self._part(i)])
        check(lib.zs_swap_init_partition(self._handle, i, ctypes.c_void_p(addr)),
              "zs_swap_init_partition")

    def step(self, grads: Sequence[Any], grad_scale: float = 1.0,
             out: Sequence[Any] | None = None, *, lr: float | None = None,
             step: int | None = None, grad_dtype: str | None = None,
             out_dtype: str | None = None, resumable: bool = False) -> None:
        """One optimizer step over every partition.

        grads: one buffer per partition (all float32, all bfloat16 or all
          float16; numpy uint16 arrays hold bf16 bits). grad_dtype /
          out_dtype ("fp32", "bf16", "fp16"), when given, must match them.
          Each gradient is multiplied by grad_scale (e.g. clip coefficient /
          loss scale) inside the kernel.
        out: None, or one buffer per partition (an entry may be None)
          receiving the updated weights in bf16, fp16 or fp32 (all the same
          dtype; fp32 is a copy of the updated masters).
        lr: this step's learning rate (None = the current one, see
          :meth:`set_hparams`). step: Adam's step number for bias correction
          (None = :attr:`steps` + 1).
        resumable: each partition commits on its own, so that a step that
          fails partway is completed by calling step again with the same
          buffers (each partition stepped once; an out buffer may then be
          its partition's gradient buffer) or undone by
          :meth:`abandon_step`; see "Resumable steps" in swap.h.
        Raises NativeError on failure; see the module docstring for the
        guarantee."""
        n = len(self.sizes)
        if len(grads) != n:
            raise ValueError(f"grads has {len(grads)} entries, there are {n} partitions")
        gptr = (ctypes.c_void_p * n)()
        gdt = None
        for i, g in enumerate(grads):
            addr, dt = _view(g, f"grads[{i}]", self.sizes[i], grad_dtype)
            if gdt is not None and dt != gdt:
                raise ValueError("every gradient must have the same dtype")
            gptr[i], gdt = addr, dt
        args = SwapStepArgs()
        lib.zs_swap_step_args_init(ctypes.byref(args))
        args.grads = ctypes.cast(gptr, ctypes.POINTER(ctypes.c_void_p))
        args.grad_dtype = gdt
        if out is not None:
            if len(out) != n:
                raise ValueError(f"out has {len(out)} entries, there are {n} partitions")
            optr = (ctypes.c_void_p * n)()
            odt = None
            for i, o in enumerate(out):
                if o is None:
                    continue
                addr, dt = _view(o, f"out[{i}]", self.sizes[i], out_dtype)
                if odt is not None and dt != odt:
                    raise ValueError("every out buffer must have the same dtype")
                optr[i], odt = addr, dt
            if odt is not None:
                args.outs = ctypes.cast(optr, ctypes.POINTER(ctypes.c_void_p))
                args.out_dtype = odt
        args.grad_scale = float(grad_scale)
        if lr is not None:
            args.lr = float(lr)
        if step is not None:
            args.step = integer(step, "step", INT64)
        args.resumable = 1 if resumable else 0
        check(lib.zs_swap_step(self._handle, ctypes.byref(args)), "zs_swap_step")

    @property
    def incomplete_step(self) -> int:
        """The number of a resumable step that failed partway (0: none)."""
        return int(lib.zs_swap_incomplete_step(self._handle))

    def abandon_step(self) -> None:
        """Returns every partition to the last completed step after a
        resumable step failed partway (no-op when none did); with the
        compact layout the partitions it had stepped hold no state
        afterwards (until set_state / write_image / init_partition)."""
        check(lib.zs_swap_abandon_step(self._handle), "zs_swap_abandon_step")

    # ------------------------------------------------------ hyperparameters
    def set_hparams(self, lr: float | None = None, betas: tuple[float, float] | None = None,
                    eps: float | None = None, weight_decay: float | None = None) -> None:
        """Changes hyperparameters for later steps (None keeps a value)."""
        b1, b2 = betas if betas is not None else (-1.0, -1.0)
        check(lib.zs_swap_set_hparams(
            self._handle, -1.0 if lr is None else float(lr), float(b1), float(b2),
            -1.0 if eps is None else float(eps),
            -1.0 if weight_decay is None else float(weight_decay)), "zs_swap_set_hparams")

    @property
    def hparams(self) -> dict[str, float]:
        v = [ctypes.c_double() for _ in range(5)]
        lib.zs_swap_get_hparams(self._handle, *[ctypes.byref(x) for x in v])
        return {"lr": v[0].value, "betas": (v[1].value, v[2].value), "eps": v[3].value,
                "weight_decay": v[4].value}

    @property
    def lr(self) -> float:
        return self.hparams["lr"]

    @property
    def steps(self) -> int:
        """Committed steps (the step number of the state on disk)."""
        return int(lib.zs_swap_steps(self._handle))

    @steps.setter
    def steps(self, value: int) -> None:
        check(lib.zs_swap_set_steps(self._handle, integer(value, "steps", INT64)),
              "zs_swap_set_steps")

    # ------------------------------------------------------- state access
    @property
    def state_keys(self) -> tuple[str, ...]:
        """Names of the optimizer states (torch's: exp_avg, exp_avg_sq, sum)."""
        return tuple(k for k in _STATE_KEYS[self._kind] if k)

    def get_state(self, i: int) -> dict[str, np.ndarray]:
        """Partition i as fp32 numpy arrays: {"param": ..., <state_keys>...}
        (bf16 / int8 states converted exactly as the kernel sees them)."""
        n = self.sizes[self._part(i)]
        km, kv = _STATE_KEYS[self._kind]
        res = {"param": np.empty(n, np.float32)}
        if km:
            res[km] = np.empty(n, np.float32)
        if kv:
            res[kv] = np.empty(n, np.float32)
        ptr = [ctypes.c_void_p(res[k].ctypes.data) if k else None
               for k in ("param", km, kv)]
        check(lib.zs_swap_get_state(self._handle, i, *ptr), "zs_swap_get_state")
        return res

    def set_state(self, i: int, param: Any, **states: Any) -> None:
        """Replaces partition i's weights and states from fp32-convertible
        buffers; a state not given is zero (keys: :attr:`state_keys`)."""
        n = self.sizes[self._part(i)]
        km, kv = _STATE_KEYS[self._kind]
        unknown = set(states) - {km, kv} - {None}
        if unknown:
            raise ValueError(f"unknown state {sorted(unknown)}; {self.optimizer} keeps "
                             f"{list(self.state_keys)}")
        keep = []
        ptr = []
        for key, obj in (("param", param), (km, states.get(km) if km else None),
                         (kv, states.get(kv) if kv else None)):
            if obj is None:
                ptr.append(None)
                continue
            addr, k = _f32(obj, key, n)
            keep.append(k)
            ptr.append(ctypes.c_void_p(addr))
        check(lib.zs_swap_set_state(self._handle, i, *ptr), "zs_swap_set_state")

    def _array_specs(self, i: int) -> dict[str, tuple[int, Any, int]]:
        """name -> (argument slot of zs_swap_read/write_arrays, numpy dtype, elements) of
        partition i's arrays."""
        n = self.sizes[self._part(i)]
        km, kv = _STATE_KEYS[self._kind]
        sd = STATE_DTYPES[self.state_dtype]
        mdt, vdt = (np.int8, np.uint8) if sd == Q8 else (_STORED[sd],) * 2
        specs: dict[str, tuple[int, Any, int]] = {"param": (0, np.float32, n)}
        if km:
            specs[km] = (1, mdt, n)
        if kv:
            specs[kv] = (2, vdt, n)
        if sd == Q8:
            nb = (n + OPTIM_QBLOCK - 1) // OPTIM_QBLOCK
            specs[km + "_scale"] = (3, np.float32, nb)
            specs[kv + "_scale"] = (4, np.float32, nb)
        return specs

    def read_arrays(self, i: int, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Partition i's arrays exactly as stored, without conversion: "param"
        (float32), the states named by :attr:`state_keys` (float32; bf16 states
        as their uint16 bit patterns; 8-bit states as int8 exp_avg and uint8
        exp_avg_sq) and, for state_dtype "int8", their block scales
        "exp_avg_scale" and "exp_avg_sq_scale" (float32, one per block of 256
        elements). keys: the arrays to read (default: all of them); 8-bit
        codes come with their scales."""
        specs = self._array_specs(i)
        keys = list(specs) if keys is None else list(keys)
        unknown = set(keys) - set(specs)
        if unknown:
            raise ValueError(f"unknown array {sorted(unknown)}; partition {i} has {list(specs)}")
        res = {k: np.empty(specs[k][2], specs[k][1]) for k in keys}
        ptr: list[Any] = [None] * 5
        for k, arr in res.items():
            ptr[specs[k][0]] = ctypes.c_void_p(arr.ctypes.data)
        check(lib.zs_swap_read_arrays(self._handle, i, *ptr), "zs_swap_read_arrays")
        return res

    def write_arrays(self, i: int, **arrays: Any) -> None:
        """Replaces the named arrays of partition i, typed exactly as
        :meth:`read_arrays` returns them (numpy arrays, or torch CPU tensors of
        the same dtype, bfloat16 for bf16 states); every array not named keeps
        its stored bytes bit for bit. ``write_arrays(i, param=w)`` replaces the
        master weights and leaves 8-bit states as they are (not
        requantized)."""
        specs = self._array_specs(i)
        unknown = set(arrays) - set(specs)
        if unknown:
            raise ValueError(f"unknown array {sorted(unknown)}; partition {i} has {list(specs)}")
        ptr: list[Any] = [None] * 5
        keep = []
        for k, obj in arrays.items():
            slot, dt, count = specs[k]
            addr, owner = _typed(obj, k, dt, count)
            keep.append(owner)
            ptr[slot] = ctypes.c_void_p(addr)
        check(lib.zs_swap_write_arrays(self._handle, i, *ptr), "zs_swap_write_arrays")

    def read_image(self, i: int) -> np.ndarray:
        """Partition i's raw state image (uint8), for bit-exact checkpoints
        of any state dtype."""
        nb = check(lib.zs_swap_image_bytes(self._handle, self._part(i)), "zs_swap_image_bytes")
        buf = np.empty(nb, np.uint8)
        check(lib.zs_swap_read_image(self._handle, i, ctypes.c_void_p(buf.ctypes.data), nb),
              "zs_swap_read_image")
        return buf

    def layout(self, i: int) -> dict[str, int]:
        """Byte offsets in partition i's raw image of "param" (fp32), "m", "v",
        "m_scale", "v_scale" (-1 when absent) and its "total" bytes, for
        inspecting raw images; :meth:`read_arrays` / :meth:`write_arrays` reach
        the arrays by name."""
        v = [ctypes.c_int64() for _ in range(6)]
        check(lib.zs_swap_layout(self._handle, self._part(i), *[ctypes.byref(x) for x in v]),
              "zs_swap_layout")
        return dict(zip(("param", "m", "v", "m_scale", "v_scale", "total"), (x.value for x in v)))

    def write_image(self, i: int, image: np.ndarray) -> None:
        img = np.ascontiguousarray(image, dtype=np.uint8)
        check(lib.zs_swap_write_image(self._handle, self._part(i),
                                      ctypes.c_void_p(img.ctypes.data), img.size),
              "zs_swap_write_image")

    def state_dict(self, raw: bool = False) -> dict[str, Any]:
        """Everything needed to resume: step count, hyperparameters and each
        partition's state, as fp32 arrays (portable across state dtypes) or,
        with raw=True, as raw images (bit-exact, same state_dtype only)."""
        parts = [{"image": self.read_image(i)} if raw else self.get_state(i)
                 for i in range(len(self.sizes))]
        return {"optimizer": self.optimizer, "state_dtype": self.state_dtype,
                "sizes": list(self.sizes), "steps": self.steps,
                "hparams": self.hparams, "partitions": parts}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restores a :meth:`state_dict` (hyperparameters included)."""
        if list(sd["sizes"]) != self.sizes:
            raise ValueError(f"checkpoint partition sizes {list(sd['sizes'])[:4]}... do not "
                             f"match this swapper's {self.sizes[:4]}...")
        if OPTIMIZERS[sd["optimizer"]][0] != self._kind:
            raise ValueError(f"checkpoint is for {sd['optimizer']}, this swapper runs "
                             f"{self.optimizer}")
        for i, p in enumerate(sd["partitions"]):
            if "image" in p:
                if sd["state_dtype"] != self.state_dtype:
                    raise ValueError("raw images need the same state_dtype; save "
                                     "with raw=False to convert")
                self.write_image(i, p["image"])
            else:
                self.set_state(i, p["param"], **{k: p[k] for k in self.state_keys if k in p})
        hp = sd.get("hparams")
        if hp:
            self.set_hparams(hp["lr"], tuple(hp["betas"]), hp["eps"], hp["weight_decay"])
        self.steps = sd["steps"]

    # -------------------------------------------------------- information
    @property
    def file_path(self) -> str:
        return os.fsdecode(lib.zs_swap_file_path(self._handle))

    @property
    def file_bytes(self) -> int:
        return int(lib.zs_swap_file_bytes(self._handle))

    def holds_state(self, i: int) -> bool:
        """Whether partition i holds state: initialized or written, and not
        dropped by an abandoned step of a compact file."""
        return bool(lib.zs_swap_holds_state(self._handle, self._part(i)))

    @property
    def compact(self) -> bool:
        """Whether the swap file has the compact layout (one slot per
        partition plus spares)."""
        return bool(lib.zs_swap_compact(self._handle))

    @property
    def direct(self) -> tuple[bool, str]:
        """(direct I/O in use, why)."""
        return (bool(lib.zs_swap_direct(self._handle)),
                lib.zs_swap_direct_why(self._handle).decode())

    @property
    def backend(self) -> str:
        return lib.zs_swap_backend(self._handle).decode()

    @property
    def buffers_locked(self) -> bool:
        return bool(lib.zs_swap_buffers_locked(self._handle))

    def io_pass(self, reads: bool = True, writes: bool = True, chunk: int = 16 << 20,
                slots: int = 16) -> float:
        """Seconds of one step's I/O without the optimizer, on this swap file
        (zs_swap_io_pass): every committed image read and as many bytes
        written to slots that hold no state, in requests of ``chunk`` bytes
        with ``slots`` reads in flight. The state does not change; the disk
        speed it gives (:attr:`file_bytes` moved) bounds a step."""
        chunk = integer(chunk, "chunk", INT64)
        slots = integer(slots, "slots", INT32)
        if chunk < 1 or not 1 <= slots <= 64:
            raise ValueError(f"chunk = {chunk} must be >= 1 and slots = {slots} in [1, 64]")
        align = 4096  # direct I/O's alignment for the buffers
        rbuf = np.empty(chunk * slots + align, np.uint8)
        wbuf = np.zeros(chunk + align, np.uint8)
        rp = rbuf.ctypes.data + (-rbuf.ctypes.data) % align
        wp = wbuf.ctypes.data + (-wbuf.ctypes.data) % align
        ns = ctypes.c_uint64()
        check(lib.zs_swap_io_pass(self._handle, ctypes.c_void_p(rp), slots, ctypes.c_void_p(wp), chunk,
                                  int(bool(reads)), int(bool(writes)), ctypes.byref(ns)), "zs_swap_io_pass")
        return ns.value / 1e9

    def stats(self, reset: bool = False) -> dict[str, int]:
        """Cumulative statistics (see zs_swap_stats): bytes moved and where
        the step's time went (compute_ns vs read_wait_ns + write_wait_ns)."""
        st = SwapStats()
        lib.zs_swap_stats_get(self._handle, ctypes.byref(st))
        if reset:
            lib.zs_swap_stats_reset(self._handle)
        return {name: int(getattr(st, name)) for name, _ in SwapStats._fields_}
