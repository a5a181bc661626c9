"""ZeRO-Offload's data path: fp32 master weights and optimizer state in CPU memory.

Per parameter group, three flat host buffers (views per parameter):
  masters  fp32 master weights (the CPU optimizer's params)
  grads    gradients in the model's dtype, filled from the GPU     (CUDA only)
  lowp     updated weights in the model's dtype, copied back        (CUDA + bf16/fp16)
On CUDA the buffers are page-locked by registering them with the driver
(cudaHostRegister through torch.cuda.cudart) rather than allocated with
pin_memory=True, whose caching allocator rounds every block up to a power of two
(a 10 GiB request would take 16 GiB). If the driver refuses (memlock limits,
WSL2, some containers) the buffer stays pageable, copies become synchronous, and
a warning says so: slower, never wrong.

Timeline of one optimizer step on CUDA:
  backward of the boundary micro-batch: a post-accumulate-grad hook per parameter
    queues its (device-accumulated) gradient into a bucket; a full bucket is copied
    to the host grads buffer on a side stream after an event on the compute stream,
    so the copies overlap the rest of backward; the device gradient is released
    as soon as its copy completes (record_stream).
  step(): wait for the side stream; overflow/norm over the host grads; one host
    optimizer call (unscale*clip folded into grad_scale, low-precision copy-out);
    non-blocking H2D copies of the new weights on the compute stream (the next
    forward is ordered after them); an event guards the host buffers until then.
Gradient accumulation accumulates on the device (hooks stay idle until the
boundary). On a CPU-only machine the same object runs without streams: the
optimizer reads p.grad directly and writes bf16/fp16 weights straight into the
parameters.

With ``flat_host=True`` (offload_optimizer.device = nvme) no master copy is kept
here: the masters and states live in the NVMe swapper (nvme.py), which reads the
gradients from one flat host buffer per group and writes the updated weights
(in the model's dtype, fp32 included) into another; those two buffers exist on
the CPU-only path too, and the copy back into the model is the same as above.
"""
from __future__ import annotations

import logging
import math
import sys
import warnings
import weakref

import torch

log = logging.getLogger("zspeed.offload")

__all__ = ["CPUOffload", "pin_in_place"]

_LOWP = (torch.float16, torch.bfloat16)
_warned_pin = False


def _clear_cuda_error() -> None:
    """A failed runtime call leaves a sticky 'last error' that torch's next kernel-launch
    check would report as its own failure; read it back once to clear it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart" in line}
        for p in paths:
            ctypes.CDLL(p).cudaGetLastError()
    except OSError:  # best effort: nothing else to do if the runtime cannot be found
        pass


def pin_in_place(t: torch.Tensor) -> bool | None:
    """Registers a CPU tensor's memory with the CUDA driver.

    True: pinned. False: the driver refused (a warning says why). None: this torch
    has no cudaHostRegister binding (the caller may use pin_memory=True instead)."""
    global _warned_pin
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return True
    try:
        register = torch.cuda.cudart().cudaHostRegister
    except (AttributeError, RuntimeError):
        return None
    rc = register(t.data_ptr(), nbytes, 0)
    code = int(getattr(rc, "value", rc))
    if code == 0:
        return True
    _clear_cuda_error()
    if not _warned_pin:
        _warned_pin = True
        warnings.warn(
            f"zspeed: could not page-lock {nbytes / 2**20:.0f} MiB of host memory (cudaHostRegister "
            f"error {code}); offload buffers stay pageable, so host<->device copies will not overlap "
            f"computation. Raise the locked-memory limit (ulimit -l / the container's memlock) to fix this.",
            RuntimeWarning, stacklevel=3)
    return False


def _unpin(ptrs: list) -> None:
    try:
        cudart = torch.cuda.cudart()
        for p in ptrs:
            cudart.cudaHostUnregister(p)
    except Exception:  # interpreter shutdown: the driver releases everything anyway
        pass


class CPUOffload:
    """Owns the host buffers, the gradient hooks and the copies of one engine."""

    def __init__(self, groups: list, device: torch.device, model_dtype: torch.dtype, pin_memory: bool,
                 bucket_elems: int, chunk_elems: int = 1 << 26, flat_host: bool = False):
        self.device = device
        self.cuda = device.type == "cuda"
        self.lowp = model_dtype in _LOWP
        self.model_dtype = model_dtype
        self.params = [list(g["params"]) for g in groups]
        self.bucket_elems = max(1, int(bucket_elems))
        self._pinned: list[int] = []
        self._pinned_any = False
        self.pinned = False
        pin = self.cuda and pin_memory
        self.masters, self.host_grads, self.lowp_out = [], None, None
        self.flat_grads: list | None = None
        self.flat_out: list | None = None
        if flat_host:
            self._init_flat(model_dtype, pin)
        else:
            self._init_masters(model_dtype, pin)
        if self._pinned:
            weakref.finalize(self, _unpin, list(self._pinned))
        self.pinned = pin and self._pinned_any
        self._index = {id(p): (gi, pi) for gi, ps in enumerate(self.params) for pi, p in enumerate(ps)}
        # The optimizer step runs chunk by chunk (zero_optimization.sub_group_size elements, capped)
        # so that on CUDA the H2D copy of one chunk overlaps the CPU work of the next.
        self.chunks: list[list[tuple[int, int]]] = [[]]
        filled = 0
        for key in self._index.values():
            n = self.params[key[0]][key[1]].numel()
            if filled and filled + n > chunk_elems:
                self.chunks.append([])
                filled = 0
            self.chunks[-1].append(key)
            filled += n
        self._armed = False
        self._copied: set = set()
        self._pending: list = []
        self._pending_elems = 0
        self._h2d_done = None
        # CUDA: per-tensor fp32 gradient norms computed on the side stream
        # while the gradients are still on the device (nearly free there), so
        # the step needs no extra CPU pass over the host gradients.
        self._dev_norms: list = []
        self._hooks = []
        self._zeros: dict = {}
        if self.cuda:
            self.side = torch.cuda.Stream(device=device)
            for ps in self.params:
                for p in ps:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    # -- buffers ---------------------------------------------------------------------------
    def _init_masters(self, model_dtype, pin: bool) -> None:
        """fp32 masters in RAM (device=cpu), plus the grads / low-precision buffers the path needs."""
        share_cpu = (not self.cuda and all(p.is_contiguous() for ps in self.params for p in ps))
        if self.cuda:
            self.host_grads, self.lowp_out = [], ([] if self.lowp else None)
        elif self.lowp and share_cpu:
            self.lowp_out = [[p.data.view(-1) for p in ps] for ps in self.params]
        for ps in self.params:
            numels = [p.numel() for p in ps]
            if not self.cuda and not self.lowp and share_cpu:
                # fp32 model on the CPU: the parameters are the master weights.
                self.masters.append([p.data.view(-1) for p in ps])
                continue
            mflat = self._alloc(sum(numels), torch.float32, pin)
            mviews = self._views(mflat, numels)
            with torch.no_grad():
                for v, p in zip(mviews, ps):
                    v.copy_(p.detach().reshape(-1).to("cpu", torch.float32))
            self.masters.append(mviews)
            if self.cuda:
                self.host_grads.append(self._views(self._alloc(sum(numels), model_dtype, pin), numels))
                if self.lowp:
                    self.lowp_out.append(self._views(self._alloc(sum(numels), model_dtype, pin), numels))
        if not self.cuda and self.lowp and self.lowp_out is None:
            self.lowp_out = [self._views(self._alloc(sum(p.numel() for p in ps), model_dtype, False),
                                         [p.numel() for p in ps]) for ps in self.params]
            self._cpu_copy_back = True
        else:
            self._cpu_copy_back = not self.cuda and not self.lowp and not share_cpu

    def _init_flat(self, model_dtype, pin: bool) -> None:
        """No masters: one flat grads and one flat out buffer (model dtype) per group (device=nvme)."""
        self.masters = None
        self.flat_grads, self.flat_out, self.host_grads, self.lowp_out = [], [], [], []
        for ps in self.params:
            numels = [p.numel() for p in ps]
            for flats, views in ((self.flat_grads, self.host_grads), (self.flat_out, self.lowp_out)):
                flat = self._alloc(sum(numels), model_dtype, pin)
                flats.append(flat)
                views.append(self._views(flat, numels))
        self._cpu_copy_back = not self.cuda

    def _alloc(self, numel: int, dtype, pin: bool) -> torch.Tensor:
        t = torch.empty(numel, dtype=dtype)
        if not pin:
            return t
        ok = pin_in_place(t)
        if ok:
            self._pinned.append(t.data_ptr())
            self._pinned_any = True
        elif ok is None:  # no driver registration binding: torch's pinned allocator (rounds sizes up)
            try:
                t = torch.empty(numel, dtype=dtype, pin_memory=True)
                self._pinned_any = True
            except RuntimeError as e:
                warnings.warn(f"zspeed: pinned host allocation refused ({e}); offload buffers stay "
                              f"pageable and copies will not overlap computation.", RuntimeWarning,
                              stacklevel=3)
        return t

    @staticmethod
    def _views(flat: torch.Tensor, numels: list) -> list:
        out, off = [], 0
        for n in numels:
            out.append(flat[off:off + n])
            off += n
        return out

    # -- backward --------------------------------------------------------------------------
    def arm(self, boundary: bool) -> None:
        """Called before backward: hooks copy gradients only on the boundary micro-batch."""
        self._armed = boundary and self.cuda

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._armed or p.grad is None:
            return
        key = self._index[id(p)]
        self._pending.append((key, p.grad))
        self._pending_elems += p.grad.numel()
        self._copied.add(key)
        p.grad = None  # the pending list keeps it alive until its copy is queued
        if self._pending_elems >= self.bucket_elems:
            self._issue(torch.cuda.current_stream(self.device))

    def _issue(self, producer: torch.cuda.Stream) -> None:
        if not self._pending:
            return
        ready = torch.cuda.Event()
        ready.record(producer)
        self.side.wait_event(ready)
        with torch.cuda.stream(self.side):
            for (gi, pi), g in self._pending:
                self._dev_norms.append(torch.linalg.vector_norm(g, 2, dtype=torch.float32))
                self.host_grads[gi][pi].copy_(g.reshape(-1), non_blocking=True)
                g.record_stream(self.side)  # free the device copy only after the D2H is done
        self._pending.clear()
        self._pending_elems = 0

    def flush(self) -> None:
        """Called after backward: queue the last partial bucket."""
        if self.cuda and self._pending:
            self._issue(torch.cuda.current_stream(self.device))
        self._armed = False

    # -- step ------------------------------------------------------------------------------
    def gather_grads(self) -> list:
        """Host gradients of the boundary, per group; parameters without one get zeros."""
        if not self.cuda and self.flat_grads is not None:
            with torch.no_grad():
                for gi, ps in enumerate(self.params):
                    for p, h in zip(ps, self.host_grads[gi]):
                        if p.grad is None:
                            h.zero_()
                        else:
                            h.copy_(p.grad.reshape(-1))
            return self.host_grads
        if not self.cuda:
            out = []
            for gi, ps in enumerate(self.params):
                row = []
                for pi, p in enumerate(ps):
                    if p.grad is None:
                        row.append(self._zero(gi, pi, p))
                    else:
                        row.append(p.grad.detach().contiguous().view(-1))
                out.append(row)
            return out
        cur = torch.cuda.current_stream(self.device)
        for gi, ps in enumerate(self.params):
            for pi, p in enumerate(ps):
                if (gi, pi) in self._copied:
                    continue
                if p.grad is not None:  # accumulated earlier, no gradient in the boundary micro-batch
                    self._pending.append(((gi, pi), p.grad))
                    p.grad = None
                else:
                    self.host_grads[gi][pi].zero_()
                self._copied.add((gi, pi))
        self._issue(cur)
        self.side.synchronize()
        # _copied is cleared by release_grads(): a step that raised (NVMe I/O error) and is called
        # again gathers the same host gradients instead of zeros.
        return self.host_grads

    def device_grad_stats(self, scale: float):
        """CUDA only, after gather_grads: (sum of squares of scale*g, any inf/NaN)
        from the norms taken on the device (per-tensor fp32 norms summed in
        float64, as torch_grad_stats does); None on the CPU path."""
        if not self.cuda:
            return None
        # Kept until release_grads(): a step that fails (an NVMe I/O error)
        # and is called again must see the same norms.
        norms = self._dev_norms
        if not norms:
            return 0.0, False
        total = torch.stack(norms).to(torch.float64).square().sum().item() * float(scale) ** 2
        return total, not math.isfinite(total)

    def _zero(self, gi, pi, p):
        z = self._zeros.get((gi, pi))
        if z is None:
            z = self._zeros[(gi, pi)] = torch.zeros(p.numel(), dtype=p.dtype)
        return z

    def wait_host_buffers(self) -> None:
        """The previous step's H2D copies read lowp/masters: finish them before overwriting."""
        if self._h2d_done is not None:
            self._h2d_done.synchronize()
            self._h2d_done = None

    def select(self, grads: list, chunk: list) -> list:
        """``grads`` restricted to one chunk: None (skipped by the optimizer) elsewhere."""
        if len(self.chunks) == 1:
            return grads
        out = [[None] * len(row) for row in grads]
        for gi, pi in chunk:
            out[gi][pi] = grads[gi][pi]
        return out

    def write_back(self, chunk: list) -> None:
        """Copy the updated weights of one chunk into the model (asynchronous on CUDA)."""
        src = self.lowp_out if self.lowp_out is not None else self.masters
        if self.cuda:
            with torch.no_grad():
                for gi, pi in chunk:
                    p = self.params[gi][pi]
                    p.data.copy_(src[gi][pi].view(p.shape), non_blocking=True)
        elif self._cpu_copy_back:
            with torch.no_grad():
                for gi, pi in chunk:
                    p = self.params[gi][pi]
                    p.data.copy_(src[gi][pi].view(p.shape))

    def end_write_back(self) -> None:
        """The next step must not overwrite the host buffers before these copies are done."""
        if self.cuda:
            self._h2d_done = torch.cuda.Event()
            self._h2d_done.record(torch.cuda.current_stream(self.device))

    def release_grads(self) -> None:
        for ps in self.params:
            for p in ps:
                p.grad = None
        self._pending.clear()
        self._pending_elems = 0
        self._copied.clear()
        self._dev_norms = []

    def master_groups(self) -> list:
        return self.masters

    def reload_from_masters(self, masters: list | None = None) -> None:
        """After a checkpoint load wrote the masters: refresh the model's weights from them.

        ``masters`` (per group, per parameter fp32 tensors) replaces the held masters
        when there are none here (nvme: the swapper holds them)."""
        masters = self.masters if masters is None else masters
        with torch.no_grad():
            for ps, ms in zip(self.params, masters):
                for p, m in zip(ps, ms):
                    if p.data.data_ptr() != m.data_ptr():
                        p.data.copy_(m.view(p.shape).to(p.device, p.dtype))
            if self.lowp_out is not None:
                for ms, outs in zip(masters, self.lowp_out):
                    for m, o in zip(ms, outs):
                        if o.data_ptr() != m.data_ptr():
                            o.copy_(m)
