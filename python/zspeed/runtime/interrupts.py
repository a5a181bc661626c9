"""Ctrl-C during an optimizer step waits for the step to end.

A step changes many things that must move together: every parameter's master and
optimizer state (chunk by chunk), the weights in the model, the loss scaler, the LR
scheduler and the engine's counters. A KeyboardInterrupt raised between two of them
would leave a torn step, which the common ``except KeyboardInterrupt: save_checkpoint()``
pattern would then write to disk. So while a step runs, the first SIGINT is held: a
warning says the step finishes first (it takes at most one step's time), and the
interrupt is delivered to the previous handler as soon as the step is over. A second
SIGINT is delivered at once, for a step that seems stuck; the step is then incomplete,
and the engine completes it at the next ``engine.step()`` (or a checkpoint load
replaces it).

Only the main thread can own signal handlers; elsewhere (and where the handler is not
Python's, e.g. SIG_IGN) the context changes nothing.
"""
from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("zspeed.engine")

__all__ = ["interrupts_deferred"]


class interrupts_deferred:
    """Context manager: SIGINT inside is held until the end (see the module docstring)."""

    def __init__(self, what: str = "the optimizer step"):
        self.what = what
        self._prev = None
        self._held = None
        self._installed = False

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            prev = signal.getsignal(signal.SIGINT)
        except (ValueError, OSError):
            return self
        if not callable(prev):  # SIG_IGN, SIG_DFL or a handler not installed from Python
            return self
        self._prev = prev
        try:
            signal.signal(signal.SIGINT, self._handler)
        except (ValueError, OSError):
            return self
        self._installed = True
        return self

    def _handler(self, signum, frame):
        if self._held is not None:  # the second Ctrl-C: deliver it now
            self._restore()
            self._held = None
            self._prev(signum, frame)
            return
        self._held = (signum, frame)
        log.warning("zspeed: interrupt received during %s: it completes first (at most one step); press "
                    "Ctrl-C again to interrupt it anyway (the next engine.step() then completes it).", self.what)

    def _restore(self) -> None:
        if self._installed:
            self._installed = False
            signal.signal(signal.SIGINT, self._prev)

    def __exit__(self, typ, exc, tb):
        self._restore()
        held, self._held = self._held, None
        if held is not None:
            self._prev(*held)  # default_int_handler raises KeyboardInterrupt here
        return False
