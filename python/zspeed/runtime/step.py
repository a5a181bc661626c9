"""One optimizer step as a transaction (the engine's step() at an accumulation boundary).

The decision is taken once: the boundary's gradients are collected, their sum of squares and
non-finiteness reduced over the optimizer path's parts and the ranks; an fp16 overflow (or a
non-finite bf16 gradient with check_grad_overflow) skips the step and lowers the loss scale,
otherwise every gradient is multiplied by one factor, 1 / loss_scale / grad_divisor times the
clip coefficient gradient_clipping / (norm + 1e-6) where the norm exceeds it.

Then the phases run in order, each once: "apply" (the path steps; one that stopped partway
resumes where it stopped, each parameter stepped once), "schedule" (the loss scale and the LR
scheduler), "release" (the gradients dropped; with gradients in the parameter shards a skip
reads the weights back from the masters). A phase that raises leaves the transaction pending at
that phase: running it again resumes there, so no phase repeats. :meth:`StepTransaction.run`
returns only once every phase has run; the engine then commits (counts the step).
"""
from __future__ import annotations

import logging
import math

from .._native import ZSpeedError
from .checkpoint_files import LoadIncompleteError
from .errors import one_line

log = logging.getLogger("zspeed.engine")

__all__ = ["StepTransaction", "StepIncompleteError", "after_commit"]

# The pending factor of an overflow skip whose release raised.
_SKIPPED = object()


class StepIncompleteError(ZSpeedError, RuntimeError):
    """An optimizer step stopped partway (an error, or a second Ctrl-C) and was not yet
    completed: call engine.step() again, or load a checkpoint."""


class StepTransaction:
    """The state of the optimizer step: the pending transaction (if one raised partway), the
    last step's gradient norm and whether it overflowed."""

    def __init__(self, path, loss_scaler, sync, trace, *, clip: float, skip_nonfinite: bool, grad_divisor: float):
        self.path, self.loss_scaler, self.sync, self.trace = path, loss_scaler, sync, trace
        self.clip, self.skip_nonfinite, self.grad_divisor = clip, skip_nonfinite, grad_divisor
        self.pending = None  # the factor of a step that raised partway (_SKIPPED: a skip), or None
        self.phase = "apply"
        self.error = ""  # what the pending step raised, in one line
        self.grad_norm: float | None = None  # of the last step (None after a skip)
        self.overflow = False  # the last step was skipped

    @property
    def torn(self) -> bool:
        """A step raised partway and is pending (step() completes it)."""
        return self.pending is not None

    def settle_for(self, what: str, settle, step_no: int) -> None:
        """``settle()`` (the engine's: completes the step under way) for a reader of the weights
        (GatheredParameters): a torn step that fails again is a StepIncompleteError naming
        ``what``, not a mix of stepped and unstepped weights."""
        torn = self.torn or self.path.step_failed()
        try:
            settle()
        except (StepIncompleteError, LoadIncompleteError):
            raise
        except Exception as e:
            if not torn:
                raise
            raise StepIncompleteError(
                f"{what}: optimizer step {step_no} stopped partway and completing it failed again ({one_line(e)}); "
                f"the weights would be a mix of stepped and unstepped parameters. Fix the cause and call "
                f"engine.step(), or load a checkpoint.") from e

    def settle_at_close(self, settle, load_failed: str | None, step_no: int) -> None:
        """engine.close(): the module is handed back with one step's weights, the torn step
        completed by ``settle()`` if it can be; where it cannot (or a checkpoint load failed
        partway, ``load_failed``) a warning says what the weights are, and close goes on."""
        if self.torn or self.path.step_failed():
            try:
                settle()
            except Exception as e:  # noqa: BLE001 - reported; close goes on
                log.warning("zspeed: engine.close(): optimizer step %d stopped partway and could not be completed "
                            "(%s: %s); the module is handed back with some parameters stepped and others not. Load "
                            "a checkpoint before using its weights.", step_no, type(e).__name__, e)
        elif load_failed is not None:
            log.warning("zspeed: engine.close(): the last load_checkpoint failed partway (%s); the module is handed "
                        "back holding part of that checkpoint. Load a checkpoint before using its weights.",
                        load_failed)

    def describe(self) -> str:
        """Where the pending step stopped, for the refusals of what would overwrite its inputs."""
        return {"apply": "stopped partway",
                "schedule": "was applied, but the LR scheduler's step raised",
                "release": ("was skipped (gradient overflow), but restoring the weights raised"
                            if self.pending is _SKIPPED else "was applied, but dropping its gradients raised"),
                }[self.phase]

    def refuse_if_pending(self, what: str, step: int) -> None:
        """StepIncompleteError naming ``what`` while a step is pending (step ``step`` is its number)."""
        if self.pending is not None:
            raise StepIncompleteError(
                f"{what}: optimizer step {step} {self.describe()} ({self.error}); the gradients it reads must not "
                f"be overwritten. Call engine.step() again to complete it (what it did is not repeated: each "
                f"parameter is stepped once), or engine.load_checkpoint(...) to return to a saved state.")

    def failed(self, error: str) -> None:
        """The step raised with ``error`` (one line): kept for the refusals while it is pending."""
        if self.pending is not None:
            self.error = error

    def discard(self) -> None:
        """Drops a pending step (a checkpoint load replaces everything it touched)."""
        self.path.abandon_step()
        self.path.release()
        self.pending, self.phase = None, "apply"

    def decide(self, collect, check_used=None) -> float | None:
        """Collects the boundary's gradients (``collect``) and their statistics; None for a skipped
        step (overflow, with the loss scaler told), else the factor every gradient is multiplied by."""
        # With several ranks the gradients are sums over the ranks: the mean (gradient_allreduce_op
        # "mean") is folded into the factor, and every rank adds up the statistics of its part.
        inv_scale = 1.0 / self.loss_scaler.loss_scale / self.grad_divisor
        if check_used is not None:
            check_used()
        collect()
        with self.trace.span("gradient statistics"):
            sumsq, nonfinite = self.path.grad_stats(inv_scale)
        sumsq, nonfinite = self.sync.stats(sumsq, nonfinite)  # each rank's part added up
        self.overflow = nonfinite and self.skip_nonfinite
        if self.overflow:
            self.loss_scaler.update_scale(True)
            self.grad_norm = None
            return None
        norm = math.sqrt(sumsq) if math.isfinite(sumsq) else float("nan")
        self.grad_norm = norm
        coef = self.clip / (norm + 1e-6) if self.clip > 0 and norm > self.clip else 1.0
        return inv_scale * coef

    def run(self, decide, lr_scheduler, lr_kwargs) -> bool:
        """Runs the pending transaction to its end, or a new one whose factor ``decide()`` gives
        (None: skip). Returns whether the step was applied (False: skipped)."""
        if self.pending is None:
            factor = decide()
            self.pending = _SKIPPED if factor is None else factor
            self.phase = "release" if factor is None else "apply"
        if self.phase == "apply":
            with self.trace.span("apply"):
                self.path.apply(self.pending)
            self.loss_scaler.update_scale(False)
            self.phase = "schedule"
        if self.phase == "schedule":
            if lr_scheduler is not None:
                lr_scheduler.step(**(lr_kwargs or {}))
            self.phase = "release"
        self.path.release()
        applied = self.pending is not _SKIPPED
        self.pending, self.phase = None, "apply"
        return applied


def after_commit(step: int, what: str, fn) -> None:
    """Runs ``fn`` after a step is committed; an exception is logged (with its traceback at debug
    level), not raised: see the end of ZSpeedEngine.step."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported, and the step stands
        log.warning("zspeed: optimizer step %d was applied and counted, but %s failed afterwards (%s: %s); "
                    "training goes on.", step, what, type(e).__name__, e)
        log.debug("zspeed: %s failed", what, exc_info=True)
