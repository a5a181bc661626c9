"""The Monitor base and the helpers every monitor shares (monitor.py re-exports Monitor)."""
from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["Monitor"]


def _rank() -> int:
    from .. import comm
    return comm.get_rank()


def _events(event_list):
    """The events as (name, value, step) triples, a one-element tensor's value as a Python number."""
    out = []
    for event in event_list:
        if isinstance(event, (str, bytes)) or len(event) != 3:
            raise ValueError(f"write_events takes a list of (name, value, step) triples; got {event!r}")
        name, value, step = event
        item = getattr(value, "item", None)
        if callable(item) and getattr(value, "numel", lambda: 1)() == 1:
            value = item()
        out.append((str(name), value, int(step)))
    return out


class Monitor(ABC):
    """A writer of events: ``write_events([(name, value, step), ...])``."""

    @abstractmethod
    def __init__(self, monitor_config):
        self.monitor_config = monitor_config

    @abstractmethod
    def write_events(self, event_list):
        """Writes each (name, value, step) event."""
