"""DeepSpeed's monitors (``deepspeed.monitor``): the engine's training events written to
TensorBoard, CSV files, Weights & Biases or Comet, as the config's ``tensorboard``,
``csv_monitor``, ``wandb`` and ``comet`` sections ask.

An event is ``(name, value, step)``. At each optimizer step (the accumulation boundary,
skipped fp16 steps included) rank 0's engine writes ``Train/Samples/lr`` (the first group's
learning rate), with fp16 ``Train/Samples/loss_scale``, and with ``wall_clock_breakdown``
``Train/Samples/elapsed_time_ms_{forward,backward,backward_inner,backward_allreduce,step}``
(the step's summed timers), each at ``engine.global_samples``, as DeepSpeed's engine does.
Scripts add their own through ``engine.monitor.write_events([(name, value, step), ...])``
(``engine.monitor.enabled`` says whether any monitor is on). Only rank 0 writes; on other
ranks write_events does nothing. docs/COMPAT.md lists what differs from DeepSpeed.
"""
from .config import CometConfig, CSVConfig, DeepSpeedMonitorConfig, TensorBoardConfig, WandbConfig, get_monitor_config
from .monitor import Monitor, MonitorMaster

__all__ = ["Monitor", "MonitorMaster", "DeepSpeedMonitorConfig", "TensorBoardConfig", "WandbConfig", "CSVConfig",
           "CometConfig", "get_monitor_config"]
