"""Helpers with DeepSpeed's names (``deepspeed.runtime.utils``) that scripts call."""
from __future__ import annotations

import random

__all__ = ["set_random_seed"]


def set_random_seed(seed: int) -> None:
    """Seeds Python's, numpy's and torch's generators (every device) with ``seed``."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
