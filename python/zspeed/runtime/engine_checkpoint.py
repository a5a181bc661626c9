"""The engine's training checkpoints: save and load through checkpoint.py / checkpoint_load.py
over the engine's parts (parts.py), and what a load that failed partway leaves behind.

A load replaces every master, optimizer state and counter; an optimizer step that stopped
partway (step.py) is discarded by a load that brings the optimizer states, only once the
checkpoint is found and checked (a load that finds nothing or refuses the checkpoint leaves it
pending: step() still completes it), and refused by one that does not. A load that fails while
putting the checkpoint in place leaves the engine holding part of it: until a load succeeds,
training and saving are refused (LoadIncompleteError), and close() says so.
"""
from __future__ import annotations

import logging

from .checkpoint_files import LoadIncompleteError
from .errors import one_line
from .step import StepIncompleteError

log = logging.getLogger("zspeed.engine")

__all__ = ["Checkpoints"]


class Checkpoints:
    """Save and load for one engine. ``parts()`` gives the engine's CheckpointParts (a weak
    method: the engine owns this object); ``path``, ``fetcher``, ``step`` and ``acc`` are the
    engine's optimizer path, ZeRO-3 fetcher (or None), step transaction and accumulation."""

    def __init__(self, parts, path, fetcher, step, acc, guard, *, recovery_scripts: bool):
        self.parts, self.path, self.fetcher, self.step, self.acc = parts, path, fetcher, step, acc
        self.guard, self.recovery_scripts = guard, recovery_scripts
        self.failed: str | None = None  # why the engine refuses to train and save (a failed load), or None
        self.loading = False  # inside load()

    def refuse_if_failed(self, what: str) -> None:
        if self.failed is not None:
            raise LoadIncompleteError(
                f"{what}: the last load_checkpoint failed partway ({self.failed}): this engine holds part of "
                f"a checkpoint and part of its earlier state. Load a checkpoint again (engine.load_checkpoint) "
                f"before training or saving.")

    def save(self, save_dir, tag, client_state: dict, save_latest: bool) -> bool:
        """The checkpoint of the engine's parts (the step under way completed by the caller)."""
        from .checkpoint import save_checkpoint
        saved = save_checkpoint(self.parts()(), save_dir, tag=tag, client_state=client_state, save_latest=save_latest)
        if self.fetcher is not None:  # ZeRO-3: persistent parameters whole again (empty_partition_cache
            with self.guard("save_checkpoint"):  # may have released them), as DeepSpeed's
                self.fetcher.refresh_persistent(wait=True)  # checkpoint_event_epilogue
        if self.recovery_scripts:
            from .checkpoint_fp32 import write_recovery_scripts
            write_recovery_scripts(save_dir)  # as DeepSpeed beside its ZeRO checkpoints
        return saved

    def save_16bit(self, save_dir, filename: str, state: dict, *, rank0: bool, barrier) -> None:
        """engine.save_16bit_model's file: ``state`` written by rank 0 (``rank0``) into
        ``save_dir/filename`` under a temporary name created exclusively (a symlink planted at it
        cannot redirect the write), then renamed over the target: complete or not there at all;
        every rank then meets at ``barrier()``."""
        if rank0:
            from pathlib import Path
            from .checkpoint_fp32 import write_16bit_model
            write_16bit_model(Path(save_dir) / filename, state)
        barrier()

    def load(self, load_dir, tag, *, strict: bool, with_states: bool, lr_states: bool, counters: bool,
             step_number: int):
        """checkpoint_load.load_checkpoint into the engine's parts (module docstring);
        ``step_number`` is the number of the step a pending one would be."""
        from .checkpoint_load import load_checkpoint
        torn = self.step.torn or self.path.step_failed()
        if torn and not with_states:
            raise StepIncompleteError(
                f"load_checkpoint without the optimizer states cannot replace optimizer step "
                f"{step_number if self.step.torn else step_number - 1}, which stopped partway (some parameters' "
                f"states were stepped, others not): load the optimizer states too, or call engine.step() "
                f"(engine.finish_step() for a step in the background) to complete it first.")
        if not torn:
            self.path.flush()
        sm = self.path.sharded
        if sm is not None and not torn:  # before anything is read: the load must not half-happen
            sm.check_writable()

        def before_apply():
            if torn:
                log.warning("zspeed: load_checkpoint discards an optimizer step that stopped partway.")
                self.step.discard()
                self.acc.over()
                self.path.flush()
            self.failed = "a checkpoint load is under way"

        self.loading = True  # (the plan's reads of the module do not complete a torn step: see _settle_before_read)
        try:
            out = load_checkpoint(self.parts()(), load_dir, tag=tag, load_module_strict=strict,
                                  load_optimizer_states=with_states, load_lr_scheduler_states=lr_states,
                                  load_counters=counters, before_apply=before_apply)
        except LoadIncompleteError as e:
            self.failed = one_line(e.__cause__ if e.__cause__ is not None else e)
            raise
        finally:
            self.loading = False
        if out[0] is not None:
            self.failed = None
        if self.fetcher is not None:  # ZeRO-3: persistent parameters whole, as after DeepSpeed's load
            self.fetcher.refresh_persistent(wait=True)
        return out
