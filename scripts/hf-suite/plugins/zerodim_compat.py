"""pytest plugin (opt-in with `-p zerodim_compat`), for transformers' tests/deepspeed/test_deepspeed.py.

The tests' RegressionPreTrainedModel (tests/trainer/test_trainer.py) has 0-dim (scalar) parameters `a` and `b`.
Real DeepSpeed 0.19.8's DeepSpeedEngine._broadcast_model does `dist.broadcast(p.data.view(torch.uint8), ...)`, which
raises "self.dim() cannot be 0 to view Half as Byte (different element sizes)" for them, on any device, so ~22 Trainer
tests fail on real DeepSpeed before training starts. zspeed has no such problem. This gives `a` and `b` shape (1,)
instead (forward and `.item()` behave the same), so that the rest of those tests gets compared. Applied to both
sides alike. (accelerate's suite runs without it: its RegressionModel keeps 0-dim parameters.)"""
import torch
from torch import nn

import tests.trainer.test_trainer as _tt

_orig_init = _tt.RegressionPreTrainedModel.__init__


def _init_1d(self, config):
    _orig_init(self, config)
    self.a = nn.Parameter(torch.tensor([config.a]).float())
    self.b = nn.Parameter(torch.tensor([config.b]).float())


_tt.RegressionPreTrainedModel.__init__ = _init_1d


def pytest_report_header(config):
    return "zerodim_compat: RegressionPreTrainedModel.a/.b have shape (1,) (real DeepSpeed 0.19.8 _broadcast_model bug)"
