"""DeepSpeed's ``deepspeed.monitor.monitor``: the Monitor base and MonitorMaster, which the
engine keeps as ``engine.monitor`` and which hands each list of events to every enabled
monitor (rank 0 only)."""
from __future__ import annotations

from ._base import Monitor, _events, _rank
from .comet import CometMonitor
from .csv_monitor import csvMonitor
from .tensorboard import TensorBoardMonitor
from .utils import check_comet_availability, check_tb_availability, check_wandb_availability
from .wandb import WandbMonitor

__all__ = ["Monitor", "MonitorMaster"]


class MonitorMaster(Monitor):
    """Every monitor the config enables (tb_monitor, wandb_monitor, csv_monitor, comet_monitor;
    None where off or on ranks other than 0); ``enabled`` is true when any section is on, on
    every rank, as DeepSpeed's."""

    def __init__(self, monitor_config):
        super().__init__(monitor_config)
        self.tb_monitor = self.wandb_monitor = self.csv_monitor = self.comet_monitor = None
        self.enabled = bool(monitor_config.enabled)
        # every rank checks the packages of the enabled monitors, so that a missing one stops
        # initialize() on all ranks alike (not rank 0 alone, leaving the others in a collective)
        for section, check in ((monitor_config.tensorboard, check_tb_availability),
                               (monitor_config.wandb, check_wandb_availability),
                               (monitor_config.comet, check_comet_availability)):
            if section.enabled:
                check()
        if _rank() == 0:
            if monitor_config.tensorboard.enabled:
                self.tb_monitor = TensorBoardMonitor(monitor_config.tensorboard)
            if monitor_config.wandb.enabled:
                self.wandb_monitor = WandbMonitor(monitor_config.wandb)
            if monitor_config.csv_monitor.enabled:
                self.csv_monitor = csvMonitor(monitor_config.csv_monitor)
            if monitor_config.comet.enabled:
                self.comet_monitor = CometMonitor(monitor_config.comet)

    def _monitors(self):
        return [m for m in (self.tb_monitor, self.wandb_monitor, self.csv_monitor, self.comet_monitor)
                if m is not None]

    def write_events(self, event_list):
        monitors = self._monitors()
        if not monitors or _rank() != 0:
            return
        events = _events(event_list)
        for m in monitors:
            m.write_events(events)

    def flush(self):
        """Writes out what the monitors buffer (TensorBoard's writer)."""
        for m in self._monitors():
            flush = getattr(m, "flush", None)
            if callable(flush):
                flush()
