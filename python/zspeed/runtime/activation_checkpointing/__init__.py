"""DeepSpeed's ``deepspeed.runtime.activation_checkpointing`` package: its ``checkpointing``
module is zspeed's activation checkpointing (zspeed/checkpointing.py, also
``deepspeed.checkpointing``: the same module object, so ``configure`` through either name is
one setting), as scripts import it (``from deepspeed.runtime.activation_checkpointing.
checkpointing import checkpoint``)."""
