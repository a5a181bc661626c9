"""DeepSpeed's ``deepspeed.utils.z3_leaf_module``: zspeed's ZeRO-3 leaf modules
(runtime/z3_leaf.py), under DeepSpeed's module path."""
from __future__ import annotations

from ..runtime.z3_leaf import *  # noqa: F401,F403
from ..runtime.z3_leaf import __all__  # noqa: F401
