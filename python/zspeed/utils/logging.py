"""DeepSpeed's ``deepspeed.utils.logging``: zspeed's logger and the helpers around it
(runtime/logs.py), under DeepSpeed's module path (deepspeed.utils re-exports them)."""
from __future__ import annotations

from ..runtime.logs import *  # noqa: F401,F403
from ..runtime.logs import __all__  # noqa: F401
