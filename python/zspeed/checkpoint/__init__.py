"""DeepSpeed's ``deepspeed.checkpoint`` helpers that training scripts call (see utils)."""
from .utils import clone_tensors_for_torch_save, get_model_ckpt_name_for_rank  # noqa: F401

__all__ = ["clone_tensors_for_torch_save", "get_model_ckpt_name_for_rank"]
