"""DeepSpeed 0.19.8's ``deepspeed.utils.zero_to_torch``: the command line that writes a
checkpoint's whole model with its floating-point tensors in float32, float16 or bfloat16
(``--dtype``, required), for zspeed checkpoints; ``python -m zspeed.utils.zero_to_torch``, and
the ``zero_to_torch.py`` written beside ZeRO checkpoints, run it. The functions are in
``zspeed.utils.zero_to_fp32`` (``convert_zero_checkpoint_to_state_dict``), as in DeepSpeed."""
from __future__ import annotations

from . import zero_to_fp32

__all__ = ["main", "zero_to_fp32"]


def main(args=None) -> int:
    """``CHECKPOINT_DIR OUTPUT_DIR --dtype {bf16,bfloat16,float16,float32,fp16,fp32}`` with
    zero_to_fp32.py's other options; returns the exit status (0, or 1 with the reason on stderr)."""
    return zero_to_fp32.run_converter("zero_to_torch.py", args, with_dtype=True)


if __name__ == "__main__":
    raise SystemExit(main())
