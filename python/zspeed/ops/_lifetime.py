"""The lifetime protocol shared by objects that own a native handle."""
from __future__ import annotations


class NativeHandleOwner:
    """Mix-in: ``with obj:`` closes on exit, and garbage collection closes
    too (never raising from ``__del__``). Subclasses define an idempotent
    ``close()``."""

    def close(self) -> None:  # pragma: no cover - always overridden
        raise NotImplementedError

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from __del__
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
