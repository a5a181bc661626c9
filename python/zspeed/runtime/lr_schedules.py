"""DeepSpeed's ``deepspeed.runtime.lr_schedules``: zspeed's LR schedulers and DeepSpeed's names of
their config keys (runtime/schedulers.py), under DeepSpeed's module path."""
from __future__ import annotations

from .schedulers import *  # noqa: F401,F403
from .schedulers import __all__  # noqa: F401
