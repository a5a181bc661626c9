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


def job_folder(output_path: str, job_name: str, section: str) -> str:
    """``<output_path>/<job_name>`` of a monitor section, made (rank 0) and checked writable; a
    ConfigError naming the key where it cannot be (an unwritable or missing parent, a file in
    the way)."""
    import os
    from ..runtime.errors import ConfigError
    log_dir = os.path.join(output_path, job_name)
    probe = os.path.join(log_dir, f".zspeed-probe-{os.getpid()}")
    try:
        os.makedirs(log_dir, exist_ok=True)
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"{section}.output_path = {output_path!r}: the monitor cannot write its job folder "
                          f"{log_dir!r} ({e.strerror or e}); give an output_path you can write to, or disable "
                          f"{section}.") from None
    return log_dir


def open_append(path: str):
    """``path`` opened for appending text, never through a symbolic link (O_NOFOLLOW where the
    system has it; elsewhere a link is refused before opening)."""
    import os
    if os.path.islink(path):
        raise OSError(f"{path} is a symbolic link; the monitor does not write through links")
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, 0o644)
    return os.fdopen(fd, "a", newline="")
