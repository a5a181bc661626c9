"""The flat parameter space the optimizer paths share.

Each parameter group is one flat space: its parameters one after the other, in
group order, parameter ``pi`` of group ``gi`` at ``offsets[gi][pi]`` with
``numels[gi][pi]`` elements. Host buffers are one contiguous tensor per group
and reach a parameter through an (offset, length) view, so whatever works on
ranges of the flat space (the NVMe swapper's partitions, the chunks of the CPU
step, and later the slice of it a rank owns when several share the work) is
plain arithmetic on these numbers.
"""
from __future__ import annotations

import torch

__all__ = ["FlatLayout"]


class FlatLayout:
    """Parameter groups (dicts with "params" and hyperparameters) laid out flat."""

    def __init__(self, groups: list):
        self.groups = groups
        self.params: list[list[torch.Tensor]] = [list(g["params"]) for g in groups]
        # A ZeRO-3 partitioned parameter is empty; ds_numel is its real size.
        self.numels: list[list[int]] = [[int(getattr(p, "ds_numel", p.numel())) for p in ps]
                                        for ps in self.params]
        self.offsets: list[list[int]] = []
        self.totals: list[int] = []
        for ns in self.numels:
            offs, at = [], 0
            for n in ns:
                offs.append(at)
                at += n
            self.offsets.append(offs)
            self.totals.append(at)
        # (group, parameter) in flat order, and the key of each parameter object.
        self.keys: list[tuple[int, int]] = [(gi, pi) for gi, ps in enumerate(self.params)
                                            for pi in range(len(ps))]
        self.index: dict[int, tuple[int, int]] = {id(self.params[gi][pi]): (gi, pi) for gi, pi in self.keys}

    def views(self, flat: torch.Tensor, gi: int) -> list[torch.Tensor]:
        """One view per parameter of group gi into ``flat`` (that group's flat buffer)."""
        return [flat[off:off + n] for off, n in zip(self.offsets[gi], self.numels[gi])]

    def with_params(self, params: list) -> list[dict]:
        """The groups' hyperparameters over other tensors (per group, per parameter)."""
        return [{**{k: v for k, v in g.items() if k != "params"}, "params": ps}
                for g, ps in zip(self.groups, params)]
