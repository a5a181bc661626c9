"""The order in which a ZeRO-3 model's forward needs its parameters (zero3.py's prefetch).

The first forward is recorded: one tuple of parameter states per module call that gathers.
Later forwards follow it (a call that differs from the recorded one starts a new recording: the
model took another path), so the fetcher knows which gathers come next; a backward runs the
module calls in about the reverse order, so it prefetches the earlier ones. A state used again
within ``stage3_max_reuse_distance`` elements of gathers is kept gathered after its module
instead of released (DeepSpeed's rule).
"""
from __future__ import annotations

__all__ = ["AccessOrder"]


class AccessOrder:
    """The recorded order of gathers and where the current forward and backward are in it."""

    def __init__(self, reuse: int):
        self.reuse = int(reuse)
        self.trace: list | None = None  # the recorded forward: one tuple of states per module call
        self.recording: list | None = []  # the forward being recorded, or None while following one
        self.cursor = 0  # the next position the forward should reach
        self.bw_cursor: int | None = None  # the position the backward reached (it walks back)
        self.keep_at: list | None = None  # per position: ids of the states kept gathered after it

    def begin_forward(self) -> None:
        self.cursor = 0

    def note_forward(self, sts: list) -> int | None:
        """A module call of the forward gathering ``sts``: its position in the recorded order, or
        None while recording (also when the call differs from the recorded one: recorded anew)."""
        if self.recording is not None:
            self.recording.append(tuple(sts))
            return None
        tr = self.trace
        if tr is None or self.cursor >= len(tr) or list(tr[self.cursor]) != sts:
            self.trace, self.recording, self.keep_at = None, [tuple(sts)], None
            return None
        pos = self.cursor
        self.cursor += 1
        return pos

    def ahead(self, pos: int) -> range:
        """The positions after ``pos`` (what the forward needs next)."""
        return range(pos + 1, len(self.trace))

    def end_forward(self) -> None:
        """The forward is over: a recording becomes the order (and its reuse plan); the backward
        starts from the end."""
        if self.recording:
            self.trace, self.recording = self.recording, None
            self.keep_at = self._plan_reuse(self.trace)
        self.bw_cursor = len(self.trace) if self.trace else None

    def kept_after(self, pos: int | None):
        """The ids of the states the call at ``pos`` keeps gathered for a reuse (empty: none)."""
        return self.keep_at[pos] if pos is not None and self.keep_at and pos < len(self.keep_at) else ()

    def behind(self, sts: list) -> range | None:
        """A module's backward gathering ``sts``: the positions before its call in the forward
        (what the backward needs next), or None where the call is not found."""
        tr = self.trace
        if not tr or self.bw_cursor is None:
            return None
        i = self.bw_cursor - 1
        while i >= 0 and list(tr[i]) != sts:
            i -= 1
        if i < 0:
            return None
        self.bw_cursor = i
        return range(i - 1, -1, -1)

    def _plan_reuse(self, tr: list) -> list:
        """Per position, the states used again within ``reuse`` elements of gathers."""
        cum = [0]
        for e in tr:
            cum.append(cum[-1] + sum(st.numel for st in e))
        keep: list = [set() for _ in tr]
        nxt: dict = {}
        for i in range(len(tr) - 1, -1, -1):
            for st in tr[i]:
                j = nxt.get(id(st))
                if j is not None and cum[j] - cum[i + 1] <= self.reuse:
                    keep[i].add(id(st))
            for st in tr[i]:
                nxt[id(st)] = i
        return keep
