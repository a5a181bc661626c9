"""``deepspeed.runtime.activation_checkpointing.checkpointing``: zspeed.checkpointing itself
(this module replaces itself with it on import, so both names are one module)."""
import sys

from ... import checkpointing as _checkpointing

sys.modules[__name__] = _checkpointing
