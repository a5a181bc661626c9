"""The checkpoint engine of torch.save / torch.load (DeepSpeed's TorchCheckpointEngine)."""
from __future__ import annotations

import torch

from .checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

__all__ = ["TorchCheckpointEngine", "ENGINE_NAME"]

ENGINE_NAME = "TorchCheckpointEngine"


def _zipfile(config_params) -> bool:
    """DeepSpeed's rule: without a config the legacy format; with one, its checkpoint section's
    ``checkpoint_serialization`` (default true: torch's zipfile format). ``config_params`` is a
    parsed config (zspeed's, whose ``checkpoint`` section is a dict, or DeepSpeed's with
    ``checkpoint_config``) or a config dict."""
    if config_params is None:
        return False
    if isinstance(config_params, dict):
        section = config_params.get("checkpoint") or {}
    else:
        section = getattr(config_params, "checkpoint_config", None)
        if section is None:
            section = getattr(config_params, "checkpoint", None) or {}
    return bool(section.get("checkpoint_serialization", True)) if isinstance(section, dict) else True


class TorchCheckpointEngine(CheckpointEngine):
    """Objects written with torch.save (``zipfile_serialization`` selects torch's format) and
    read with torch.load (``weights_only=False``: the files are the script's own, as in
    DeepSpeed; load only files you trust)."""

    def __init__(self, config_params=None):
        super().__init__(config_params)
        self.name = ENGINE_NAME
        self.zipfile_serialization = _zipfile(config_params)

    def create(self, info: CheckpointCommitInfo):
        return None

    def save(self, state_dict, path: str):
        torch.save(state_dict, path, _use_new_zipfile_serialization=self.zipfile_serialization)

    def load(self, path: str, map_location=None):
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: CheckpointCommitInfo):
        return True
