"""The partition plan: which slice of each parameter group's flat space a rank owns.

ZeRO stages 1 and 2 give every data-parallel rank one contiguous slice of each
parameter group, laid out as the group's parameters flattened one after another. The
group is padded at its end so that its length is a multiple of ``world_size * align``,
and rank r owns ``[r * P, (r + 1) * P)`` with ``P = padded / world_size``: slices are
balanced to within ``align`` elements, and every slice starts on an ``align``
boundary (in elements), so that host buffers, NVMe partitions and 8-bit quantization
blocks of different ranks never straddle. With one rank the single slice is the whole
group and its pieces are the whole parameters, so nothing changes against an
unpartitioned run.

A slice is described by its *pieces*: the parts of parameters that fall inside it,
as ``Piece(param, offset in the param, offset in the slice, length)``. A parameter
may be split between two (or more) ranks; every element has exactly one owner.

Nothing here touches tensors: the plan is plain integers, computed identically on
every rank from the parameter counts, so that ranks agree on it without talking
(the engine checks the counts across ranks once, at start-up).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Piece", "GroupPlan", "PartitionPlan", "DEFAULT_ALIGN"]

# Elements: 256 is the 8-bit optimizer's quantization block and, at 2 bytes or more per
# element, a multiple of 512 bytes, so slices of low-precision buffers start on
# direct-I/O sector boundaries too.
DEFAULT_ALIGN = 256


@dataclass(frozen=True)
class Piece:
    param: int      # index of the parameter in its group
    offset: int     # first element of the piece inside the parameter (flattened)
    at: int         # first element of the piece inside the owning rank's slice
    length: int


@dataclass(frozen=True)
class GroupPlan:
    numels: tuple          # elements of each parameter of the group
    offsets: tuple         # start of each parameter in the group's flat space
    total: int             # sum of numels
    padded: int            # total rounded up to a multiple of world_size * align
    slice_len: int         # elements per rank (padded // world_size)

    def bounds(self, rank: int) -> tuple[int, int]:
        """Flat [start, end) of rank's slice, clipped to the real parameters."""
        start = rank * self.slice_len
        return min(start, self.total), min(start + self.slice_len, self.total)

    def owned(self, rank: int) -> int:
        """Real (unpadded) elements rank owns."""
        a, b = self.bounds(rank)
        return b - a

    def pieces(self, rank: int) -> list:
        """The parts of parameters inside rank's slice, in flat order."""
        a, b = self.bounds(rank)
        out = []
        for pi, (off, n) in enumerate(zip(self.offsets, self.numels)):
            lo, hi = max(a, off), min(b, off + n)
            if lo < hi:
                out.append(Piece(pi, lo - off, lo - a, hi - lo))
        return out

    def owner(self, flat_index: int) -> int:
        """The rank owning the element at flat_index of the group."""
        return flat_index // self.slice_len


class PartitionPlan:
    """Per parameter group, the ranks' slices (see the module docstring)."""

    def __init__(self, group_numels: list, world_size: int, rank: int, align: int = DEFAULT_ALIGN):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        if align < 1:
            raise ValueError("align must be >= 1")
        self.world_size, self.rank, self.align = world_size, rank, align
        self.groups: list[GroupPlan] = []
        for numels in group_numels:
            numels = tuple(int(n) for n in numels)
            if any(n < 0 for n in numels):
                raise ValueError("parameter sizes must be >= 0")
            offsets, pos = [], 0
            for n in numels:
                offsets.append(pos)
                pos += n
            unit = world_size * align
            padded = max(unit, -(-pos // unit) * unit)
            self.groups.append(GroupPlan(numels, tuple(offsets), pos, padded, padded // world_size))

    def pieces(self, group: int, rank: int | None = None) -> list:
        return self.groups[group].pieces(self.rank if rank is None else rank)

    def slice_len(self, group: int) -> int:
        return self.groups[group].slice_len

    def owned(self, group: int, rank: int | None = None) -> int:
        return self.groups[group].owned(self.rank if rank is None else rank)

    def signature(self) -> tuple:
        """What every rank must agree on: world size, alignment and every group's sizes."""
        return (self.world_size, self.align, tuple(g.numels for g in self.groups))
