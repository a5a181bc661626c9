"""DeepSpeed's ``deepspeed.monitor.wandb``: ``wandb.init(project, group, entity=team)`` on rank 0,
then each event as ``wandb.log({name: value}, step=step)``."""
from __future__ import annotations

from ._base import Monitor, _events, _rank
from .utils import check_wandb_availability

__all__ = ["WandbMonitor"]


class WandbMonitor(Monitor):
    def __init__(self, wandb_config):
        super().__init__(wandb_config)
        self.enabled = wandb_config.enabled
        self.group = wandb_config.group
        self.team = wandb_config.team
        self.project = wandb_config.project
        if self.enabled and _rank() == 0:
            check_wandb_availability().init(project=self.project, group=self.group, entity=self.team)

    def log(self, data, step=None, commit=None):
        if self.enabled and _rank() == 0:
            import wandb
            return wandb.log(data, step=step, commit=commit)
        return None

    def write_events(self, event_list):
        if self.enabled and _rank() == 0:
            for name, value, step in _events(event_list):
                self.log({name: value}, step=step)
