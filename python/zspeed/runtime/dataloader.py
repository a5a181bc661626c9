"""Data loading helpers with DeepSpeed's names (``deepspeed.runtime.dataloader``)."""
from __future__ import annotations

__all__ = ["RepeatingLoader"]


class RepeatingLoader:
    """Iterates over ``loader`` forever: when it is exhausted, a new pass starts (a
    DataLoader with shuffling reshuffles). An empty loader raises StopIteration rather
    than looping without end."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)
