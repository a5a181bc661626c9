"""The streams a part overlaps its copies on, chosen once from the model's device: on a GPU a
side stream, events and waits; on the CPU everything runs in program order and the same calls
do nothing. The parts that copy (the ZeRO-3 fetcher) then read the same either way."""
from __future__ import annotations

import contextlib

import torch

__all__ = ["streams_for", "HostStreams", "DeviceStreams"]


class HostStreams:
    """A model in host memory: one order, nothing to wait for."""

    side = None

    def on_side(self):
        """Context: what runs inside is queued on the side stream."""
        return contextlib.nullcontext()

    def side_after_current(self) -> None:
        """The side stream's next work comes after the compute stream's work so far."""

    def mark(self):
        """An event after the side stream's work so far (None: nothing to wait for)."""
        return None

    def mark_current(self):
        """An event after the compute stream's work so far (None: nothing to wait for)."""
        return None

    def wait(self, event) -> None:
        """The compute stream waits for ``event`` (a mark())."""

    def synchronize_current(self) -> None:
        """The host waits for the compute stream."""


class DeviceStreams(HostStreams):
    """A model on a CUDA device: a side stream of its own."""

    def __init__(self, device: torch.device):
        self.device = device
        self.side = torch.cuda.Stream(device=device)

    def on_side(self):
        return torch.cuda.stream(self.side)

    def side_after_current(self) -> None:
        self.side.wait_stream(torch.cuda.current_stream(self.device))

    def mark(self):
        ev = torch.cuda.Event()
        ev.record(self.side)
        return ev

    def mark_current(self):
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def wait(self, event) -> None:
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def synchronize_current(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()


def streams_for(device: torch.device) -> HostStreams:
    return DeviceStreams(device) if device.type == "cuda" else HostStreams()
