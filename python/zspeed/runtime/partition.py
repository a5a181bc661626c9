"""The partition plan: which part of each parameter group a data-parallel rank owns.

Each parameter group is a flat space: its parameters one after another (layout.py).
The plan cuts it into *units* of whole consecutive parameters, about
``unit_elems`` elements each (a larger parameter is a unit of its own). A unit is
the grain of communication: its gradients are reduce-scattered in one collective
as soon as they are all there, and its updated weights come back in one all-gather.
Each unit is padded at its end to a multiple of ``world_size * align`` elements and
split into ``world_size`` equal *shards*: rank r owns shard r of every unit. So
every collective moves equal parts for every rank, shards are balanced to within
``align`` elements, and every shard starts on an ``align`` boundary (in elements),
which keeps 8-bit quantization blocks (256) and direct-I/O sectors (512 bytes)
from straddling ranks.

A rank's *local space* in a group is its shards of the group's units, one after
another. What it owns is described by *pieces*: the parts of parameters that fall
into its shards, ``Piece(param, offset in the parameter, offset in the local
space, length, unit)``. A parameter may be split between ranks; every element has
exactly one owner. With one rank every piece is a whole parameter.

The plan is plain integers, computed identically on every rank from the parameter
sizes, so ranks agree on it without talking (the engine compares the sizes across
ranks once, at start-up).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Piece", "Unit", "GroupPlan", "PartitionPlan", "DEFAULT_ALIGN"]

# Elements: the 8-bit optimizer's quantization block; at 2 bytes or more per element
# also a multiple of 512 bytes (direct-I/O sectors).
DEFAULT_ALIGN = 256


@dataclass(frozen=True)
class Piece:
    param: int      # index of the parameter in its group
    offset: int     # first element of the piece inside the parameter (flattened)
    at: int         # first element of the piece in the owning rank's local space
    length: int
    unit: int       # index of the unit (in its group) the piece belongs to


@dataclass(frozen=True)
class Unit:
    first: int      # index of the unit's first parameter in the group
    count: int      # number of parameters
    start: int      # first element in the group's flat space
    length: int     # real elements (without padding)
    padded: int     # length rounded up to a multiple of world_size * align
    shard: int      # padded // world_size: elements per rank


class GroupPlan:
    """One parameter group: its parameters' sizes, its units, and per rank its pieces."""

    def __init__(self, numels: tuple, world_size: int, align: int, unit_elems: int):
        self.numels = numels
        self.offsets: list[int] = []
        pos = 0
        for n in numels:
            self.offsets.append(pos)
            pos += n
        self.total = pos
        self.world_size = world_size
        quantum = world_size * align
        self.units: list[Unit] = []
        first, start, filled = 0, 0, 0
        for pi, n in enumerate(numels):
            if filled and filled + n > unit_elems:
                self._close(first, pi, start, filled, quantum)
                first, start, filled = pi, self.offsets[pi], 0
            filled += n
        if first < len(numels) or not self.units:
            self._close(first, len(numels), start, filled, quantum)
        self.unit_of = [0] * len(numels)
        self.local_start: list[int] = []  # start of each unit's shard in a rank's local space
        pos = 0
        for ui, u in enumerate(self.units):
            for pi in range(u.first, u.first + u.count):
                self.unit_of[pi] = ui
            self.local_start.append(pos)
            pos += u.shard
        self.local_len = pos  # elements of every rank's local space (padding included)

    def _close(self, first: int, end: int, start: int, length: int, quantum: int) -> None:
        padded = max(quantum, -(-length // quantum) * quantum)
        self.units.append(Unit(first, end - first, start, length, padded, padded // self.world_size))

    def pieces(self, rank: int) -> list:
        """The parts of parameters in rank's shards, in local order."""
        out = []
        for ui, u in enumerate(self.units):
            lo, hi = u.start + rank * u.shard, u.start + (rank + 1) * u.shard  # group flat range
            for pi in range(u.first, u.first + u.count):
                off, n = self.offsets[pi], self.numels[pi]
                a, b = max(lo, off), min(hi, off + n)
                if a < b:
                    out.append(Piece(pi, a - off, self.local_start[ui] + a - lo, b - a, ui))
        return out

    def owned(self, rank: int) -> int:
        """Real (unpadded) elements rank owns in this group."""
        return sum(p.length for p in self.pieces(rank))


class PartitionPlan:
    """Per parameter group, the units and every rank's pieces (see the module docstring)."""

    def __init__(self, group_numels: list, world_size: int, rank: int, align: int = DEFAULT_ALIGN,
                 unit_elems: int = 1 << 24):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        if align < 1 or unit_elems < 1:
            raise ValueError("align and unit_elems must be >= 1")
        for numels in group_numels:
            if any(int(n) < 0 for n in numels):
                raise ValueError("parameter sizes must be >= 0")
        self.world_size, self.rank, self.align, self.unit_elems = world_size, rank, align, unit_elems
        self.groups = [GroupPlan(tuple(int(n) for n in ns), world_size, align, unit_elems)
                       for ns in group_numels]

    def pieces(self, group: int, rank: int | None = None) -> list:
        return self.groups[group].pieces(self.rank if rank is None else rank)

    def owned(self, group: int, rank: int | None = None) -> int:
        return self.groups[group].owned(self.rank if rank is None else rank)
