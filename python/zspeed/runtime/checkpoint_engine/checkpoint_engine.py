"""The checkpoint engine interface (DeepSpeed's names and methods)."""
from __future__ import annotations

import abc
import os
from dataclasses import dataclass

__all__ = ["CheckpointCommitInfo", "CheckpointEngine"]


@dataclass
class CheckpointCommitInfo:
    """Which save a create / commit call is about."""
    tag: str
    save_dir: str
    save_latest: bool


class CheckpointEngine(abc.ABC):
    """Saves and loads objects of a checkpoint. ``create(info)`` is called before a tag's files
    are written, ``save`` / ``load`` move one object, ``commit(info)`` says the tag is
    complete. The other methods have defaults that suit a synchronous writer."""

    def __init__(self, config_params=None):
        self.name = None

    @abc.abstractmethod
    def create(self, info: CheckpointCommitInfo):
        """Before the files of ``info.tag`` are written."""

    @abc.abstractmethod
    def save(self, state_dict, path: str):
        """Writes ``state_dict`` to ``path``."""

    @abc.abstractmethod
    def load(self, path: str, map_location=None):
        """Reads the object written to ``path``."""

    @abc.abstractmethod
    def commit(self, info: CheckpointCommitInfo):
        """Every file of ``info.tag`` was written."""

    def makedirs(self, path, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        """Whether the data-parallel rank ``dp_rank`` writes (rank 0 only)."""
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        return False

    def set_commit_info(self, info: CheckpointCommitInfo) -> None:
        pass

    def get_commit_info(self):
        return None

    def cleanup(self) -> None:
        pass

    def preserves_storage_sharing(self) -> bool:
        return True
