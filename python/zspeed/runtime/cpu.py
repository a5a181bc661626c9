"""ZeRO-Offload's optimizer path: fp32 masters and optimizer state in CPU memory
(zero_optimization.offload_optimizer.device = cpu).

It steps a parameter store's local space (store.py: on one rank at stages 1-2 the whole
model, one shard of degree 1). Per parameter group, host buffers (flat, views per entry of
that space; offload.py):
  grads    gradients in the model's dtype, landed there by the gradient reducer (dp.py)
  masters  fp32 master weights, the CPU optimizer's parameters
  out      updated weights in the model's dtype, which the store publishes into the model;
           for an fp32 model the masters themselves
Where the store's shards are in host memory (a CPU model, or ZeRO-3 shards offloaded there)
the buffers that can be their own storage are: an fp32 model's shards are its masters, and a
bf16/fp16 model's shards are the out buffer the optimizer writes into.

The step runs in chunks of about zero_optimization.sub_group_size elements
(capped, whole parameters), each followed by the copy of its weights back into
the model, so that on CUDA the H2D copy of one chunk overlaps the CPU work of
the next. Every parameter's update is independent, so the chunking changes no bit.

When the step runs -- inside engine.step(), overlapped with the next forward
(offload_optimizer.overlap_forward, exact) or delayed by one step
(offload_optimizer.delayed_update) -- is the step runner's (runner.py), chosen once from the
run plan; this path holds what every runner steps.
"""
from __future__ import annotations

import torch

from ..ops._torch_optim import _CPUOptimizer
from .layout import FlatLayout
from .memory import Need, Sizes, state_bytes
from .offload import HostBuffers, OffloadedPath
from .optimizers import build_host_optimizer
from .paths import copy_masters
from .runner import RUNNERS

__all__ = ["HostPath"]


class HostPath(OffloadedPath):
    """The CPU optimizer over fp32 masters in host memory; its step timed by a runner (runner.py)."""

    @property
    def takes_deferred(self) -> bool:  # (paths.OptimizerPath's): zspeed's CPU optimizers read them as they go
        return isinstance(self.optimizer, _CPUOptimizer)

    @classmethod
    def bytes_needed(cls, plan, config, s: Sizes) -> list:
        """What this path holds (memory.py): in host memory, the reduced gradients in the training
        dtype, the fp32 masters and the optimizer state of the CPU's share of the rank's part."""
        sd, per = state_bytes(config)
        n = int(s.local * s.cpu_share)
        grads = 0 if plan.grads_in_shards else s.esize * n  # else in the parameter shards' place
        return [Need("host", "gradients", grads), Need("host", "fp32 masters", 4 * n),
                Need("host", f"optimizer state ({sd})", int(per * n))]

    def __init__(self, layout: FlatLayout, buffers: HostBuffers, name: str | None, params: dict, *,
                 client: torch.optim.Optimizer | None, force_native: bool, chunk_elems: int,
                 num_threads: int | None = None, timing: str = "sync"):
        super().__init__(layout, buffers)
        if timing not in RUNNERS:
            raise ValueError(f"timing {timing!r} is not one of {sorted(RUNNERS)}")
        self.timing = timing
        lowp = buffers.model_dtype != torch.float32
        # Host parameters (a CPU model, or ZeRO-3 shards offloaded to host memory) can be the
        # buffers the optimizer writes (not with the delayed update: the model trains meanwhile).
        shared = RUNNERS[timing].writes_model_storage and all(p.device.type == "cpu" and p.is_contiguous()
                                                              for ps in layout.params for p in ps)
        own = [[p.data.view(-1) for p in ps] for ps in layout.params] if shared else None
        if own is not None and not lowp:
            self.host_masters = own
        else:
            # (not zeroed: every element, padding included, is written below or held already)
            flats, self.host_masters = buffers.alloc(torch.float32, zero=False)
            buffers.use_masters(flats)
            if not buffers.prefilled:  # (buffers taken over from an earlier path hold its masters)
                with torch.no_grad():
                    for ps, ms in zip(layout.params, self.host_masters):
                        for p, m in zip(ps, ms):
                            m.copy_(p.detach().reshape(-1))  # (converted by the copy: one pass)
        if not lowp:
            self.weights_out = self.host_masters
        elif own is not None:
            self.weights_out = own
        else:
            _, self.weights_out = buffers.alloc(buffers.model_dtype)
        # What the optimizer writes besides the masters: the low-precision weights.
        self.lowp_out = self.weights_out if lowp else None
        self.host = build_host_optimizer(name, params, layout.with_params(self.host_masters), client=client,
                                         force_native=force_native, num_threads=num_threads)
        self.optimizer = self.host.optimizer
        self.chunks = _chunks(layout, chunk_elems)
        self.chunk_of = {k: i for i, c in enumerate(self.chunks) for k in c}
        self.runner = RUNNERS[timing](self)

    @property
    def _inflight(self):
        """The background step's progress the next forward waits on (overlap), or None."""
        return self.runner.inflight

    def _wait_index(self, p: torch.Tensor) -> int | None:
        return self.runner.wait_index(p)

    def _host_grad_stats(self, tensors: list, scale: float) -> tuple[float, bool]:
        return self.host.grad_stats(tensors, scale)

    def gather(self) -> None:
        self.runner.before_gather()
        super().gather()

    def apply(self, factor: float) -> None:
        self.buffers.step_started()
        self.runner.start(factor)

    def flush(self) -> None:
        """Finishes a step running in the background and puts its weights into the model (no-op
        otherwise; see runner.py)."""
        self.runner.flush()

    def step_failed(self) -> bool:
        return self.runner.failed()

    def abandon_step(self) -> None:
        self.runner.abandon()
        self.buffers.abandoned()

    def hook_modules(self, module: torch.nn.Module) -> list:
        return self.runner.hooks(module)

    def before_backward(self, boundary: bool) -> None:
        self.runner.before_backward()
        super().before_backward(boundary)

    def param_states(self, saved: bool = False) -> list:
        self.flush()
        return super().param_states(saved)

    def close(self) -> None:
        self.runner.close()
        super().close()

    def chunk_grads(self, chunk: list) -> list:
        """The gradients restricted to one chunk: None (skipped by the optimizer) elsewhere."""
        if len(self.chunks) == 1:
            return self._grads
        out = [[None] * len(row) for row in self._grads]
        for gi, pi in chunk:
            out[gi][pi] = self._grads[gi][pi]
        return out

    def masters(self) -> list:
        self.flush()
        return self.host_masters

    def load_masters(self, masters: list) -> None:
        self.flush()
        copy_masters(self.host_masters, masters)
        self.buffers.refresh(self.host_masters, self.lowp_out)


def _chunks(layout: FlatLayout, chunk_elems: int) -> list:
    """Consecutive parameters, (group, parameter) keys, cut into chunks of at most
    chunk_elems elements (a larger parameter is a chunk of its own)."""
    chunks: list[list[tuple[int, int]]] = [[]]
    filled = 0
    for gi, pi in layout.keys:
        n = layout.numels[gi][pi]
        if filled and filled + n > chunk_elems:
            chunks.append([])
            filled = 0
        chunks[-1].append((gi, pi))
        filled += n
    return chunks
