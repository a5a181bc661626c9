"""DeepSpeed's ``deepspeed.monitor.comet``: ``comet_ml.start(...)`` on rank 0 (the section's
api_key, project, workspace, experiment_key, mode, online; experiment_name set after), then
each event as a metric at step = the engine's sample count, an event name sent again only
once ``samples_log_interval`` more samples have passed (EventsLogScheduler)."""
from __future__ import annotations

from ._base import Monitor, _events, _rank
from .utils import check_comet_availability

__all__ = ["CometMonitor", "EventsLogScheduler"]


class EventsLogScheduler:
    """Which events to send: the first of each name, then one whenever ``samples_log_interval``
    samples have passed since that name was last sent."""

    def __init__(self, samples_log_interval: int):
        self._samples_log_interval = samples_log_interval
        self._last_logged_events_samples: dict = {}

    def needs_logging(self, name: str, current_sample: int) -> bool:
        last = self._last_logged_events_samples.get(name)
        if last is None or current_sample - last >= self._samples_log_interval:
            self._last_logged_events_samples[name] = current_sample
            return True
        return False


class CometMonitor(Monitor):
    def __init__(self, comet_config):
        super().__init__(comet_config)
        self.enabled = comet_config.enabled
        self._samples_log_interval = comet_config.samples_log_interval
        self._experiment = None
        if self.enabled and _rank() == 0:
            comet_ml = check_comet_availability()
            self._experiment = comet_ml.start(api_key=comet_config.api_key, project=comet_config.project,
                                              workspace=comet_config.workspace,
                                              experiment_key=comet_config.experiment_key, mode=comet_config.mode,
                                              online=comet_config.online)
            if comet_config.experiment_name is not None:
                self._experiment.set_name(comet_config.experiment_name)
        self._events_log_scheduler = EventsLogScheduler(comet_config.samples_log_interval)

    @property
    def experiment(self):
        """The Comet experiment (None when off or on ranks other than 0)."""
        return self._experiment

    @property
    def samples_log_interval(self) -> int:
        return self._samples_log_interval

    def write_events(self, event_list) -> None:
        if not self.enabled or self._experiment is None or _rank() != 0:
            return
        for name, value, samples in _events(event_list):
            if self._events_log_scheduler.needs_logging(name, samples):
                self._experiment.log_metric(name, value, step=samples)
