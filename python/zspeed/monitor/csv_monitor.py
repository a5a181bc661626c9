"""DeepSpeed's ``deepspeed.monitor.csv_monitor``: one CSV file per event name in
``<output_path>/<job_name>``, named after the event ('/' and ' ' become '_'), rows
``step,value`` under a header ``step,<last part of the name>`` written the first time this
monitor writes that file (files of an earlier run are appended to, as DeepSpeed's)."""
from __future__ import annotations

import csv
import os

from ._base import Monitor, _events, _rank, job_folder, open_append

__all__ = ["csvMonitor"]


class csvMonitor(Monitor):  # noqa: N801  (DeepSpeed's name)
    def __init__(self, csv_config):
        super().__init__(csv_config)
        self.filenames: list[str] = []
        self.enabled = csv_config.enabled
        self.output_path = csv_config.output_path
        self.job_name = csv_config.job_name
        self.log_dir = self.setup_log_dir()

    def setup_log_dir(self):
        """The job's folder, made on rank 0 of an enabled section (None elsewhere)."""
        if self.enabled and _rank() == 0:
            return job_folder(self.output_path, self.job_name, "csv_monitor")
        return None

    def write_events(self, event_list):
        if not (self.enabled and self.log_dir is not None and _rank() == 0):
            return
        for name, value, step in _events(event_list):
            filename = name.replace("/", "_").replace(" ", "_")
            with open_append(os.path.join(self.log_dir, filename + ".csv")) as f:
                writer = csv.writer(f)
                if filename not in self.filenames:
                    self.filenames.append(filename)
                    writer.writerow(["step", name.split("/")[-1]])
                writer.writerow([step, value])
