"""DeepSpeed's ``deepspeed.utils.torch``: :func:`required_torch_version`."""
from . import required_torch_version

__all__ = ["required_torch_version"]
