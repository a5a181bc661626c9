"""DeepSpeed's ``deepspeed.monitor.tensorboard``: events as scalars through torch's
``torch.utils.tensorboard.SummaryWriter``, in ``<output_path>/<job_name>``, flushed after each
list of events."""
from __future__ import annotations


from ._base import Monitor, _events, _rank, job_folder
from .utils import check_tb_availability

__all__ = ["TensorBoardMonitor"]


class TensorBoardMonitor(Monitor):
    def __init__(self, tensorboard_config):
        super().__init__(tensorboard_config)
        self.summary_writer = None
        self.enabled = tensorboard_config.enabled
        self.output_path = tensorboard_config.output_path
        self.job_name = tensorboard_config.job_name
        if self.enabled and _rank() == 0:
            check_tb_availability()
            self.get_summary_writer()

    def get_summary_writer(self):
        """The writer (made on first use, on rank 0 of an enabled section; None elsewhere)."""
        if self.enabled and _rank() == 0 and self.summary_writer is None:
            from torch.utils.tensorboard import SummaryWriter
            self.summary_writer = SummaryWriter(log_dir=job_folder(self.output_path, self.job_name, "tensorboard"))
        return self.summary_writer

    def write_events(self, event_list, flush: bool = True):
        if not (self.enabled and self.summary_writer is not None and _rank() == 0):
            return
        for name, value, step in _events(event_list):
            self.summary_writer.add_scalar(name, value, step)
        if flush:
            self.summary_writer.flush()

    def flush(self):
        if self.enabled and self.summary_writer is not None and _rank() == 0:
            self.summary_writer.flush()
