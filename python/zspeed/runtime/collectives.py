"""How this run's collectives move tensors: the comm strategy, chosen once from the run plan.

Every collective the runtime issues (reduce-scatter of gradients, all-gather of weights,
all-reduce of statistics) goes through one :class:`Collectives` object, so the stage logic
above it never asks which backend runs or where the model lives:

- ``"none"``: one rank. A reduce-scatter or an all-gather is a copy, an all-reduce nothing.
- ``"device"`` (NCCL): the collective runs on the model's GPU.
- ``"host"`` (Gloo with a model in host memory): on host tensors.
- ``"staged"`` (Gloo with a CUDA model, as on Windows): the tensors go to host memory, the
  collective runs there, and the result comes back to where the caller wants it.

Callers pass tensors wherever they are; what is not on the collective's device is moved
there for the collective and the result copied back (a no-op when it already is). Gloo's
all-gather may not read from the tensor it writes, so an input that shares the output's
memory is copied first.
"""
from __future__ import annotations

import torch
import torch.distributed as td

__all__ = ["Collectives", "for_plan"]


class Collectives:
    """The collectives of one process group on one device (see the module docstring)."""

    def __init__(self, kind: str, device: torch.device, group=None):
        self.kind = kind
        self.device = device          # where the collectives' tensors live
        self.group = group
        self.solo = kind == "none"

    @property
    def on_host(self) -> bool:
        """Whether collectives read and write host memory (Gloo)."""
        return self.device.type == "cpu"

    def _local(self, t: torch.Tensor) -> torch.Tensor:
        # A copy to the GPU may be asynchronous (ordered on the current stream); one to the host
        # must not be (the collective reads it at once).
        return t if t.device == self.device else t.to(self.device, non_blocking=self.device.type == "cuda")

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, group=None) -> None:
        """``out`` (every rank's ``inp``, one after another) on any device."""
        if self.solo:  # asynchronous only into the GPU (a copy to the host is read at once)
            if inp.data_ptr() != out.data_ptr() or inp.device != out.device:  # (a shard published in place: nothing)
                out.copy_(inp.reshape(-1)[:out.numel()].view_as(out), non_blocking=out.is_cuda)
            return
        o = out if out.device == self.device else torch.empty(out.shape, dtype=out.dtype, device=self.device)
        i = self._local(inp)
        if _overlaps(i, o):
            i = i.clone()
        td.all_gather_into_tensor(o, i, group=self.group if group is None else group)
        if o is not out:
            out.copy_(o)

    def gathered(self, inp: torch.Tensor, numel: int, group=None) -> torch.Tensor:
        """Every rank's ``inp`` one after another (``numel`` elements in all), in a new tensor on
        the collective's device; with one rank ``inp`` itself."""
        if self.solo:
            return inp
        out = torch.empty(numel, dtype=inp.dtype, device=self.device)
        self.all_gather(out, inp, group=group)
        return out

    def reduce_scatter(self, inp: torch.Tensor, n: int, out: torch.Tensor | None = None, group=None):
        """Starts summing ``inp`` (every rank's, padded to n * world size elements) and returns
        (this rank's n summed elements on the collective's device, the work or None when it is
        done, what must stay alive until then). ``out``: where the sum may go directly, used
        when the collective can write it (its device, its dtype, contiguous)."""
        if self.solo:
            return inp[:n], None, None
        i = self._local(inp)
        if out is None or out.device != self.device or out.dtype != i.dtype or not out.is_contiguous():
            out = torch.empty(n, dtype=i.dtype, device=self.device)
        work = td.reduce_scatter_tensor(out, i, group=self.group if group is None else group, async_op=True)
        return out, work, i

    def all_reduce(self, t: torch.Tensor, group=None) -> None:
        """Sums ``t`` over the ranks, in place, on any device."""
        if self.solo:
            return
        x = self._local(t)
        td.all_reduce(x, group=self.group if group is None else group)
        if x is not t:
            t.copy_(x)

    def all_gather_object(self, obj) -> list:
        """Every rank's picklable ``obj``, in rank order."""
        if self.solo:
            return [obj]
        out: list = [None] * td.get_world_size(self.group)
        td.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if not self.solo:
            td.barrier(group=self.group)

    def new_group(self):
        """Another process group over the same ranks and backend (for collectives issued from
        another thread, which must not interleave with this group's), or None with one rank."""
        if self.solo:
            return None
        return td.new_group(ranks=list(range(td.get_world_size(self.group))),
                            backend=td.get_backend(self.group))


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def for_plan(plan) -> Collectives:
    """The strategy of the run plan's ``comm``."""
    device = plan.device if plan.comm in ("device", "none") else torch.device("cpu")
    return Collectives(plan.comm, device)
