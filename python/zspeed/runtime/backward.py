"""The backward passes of one optimizer step (the gradient accumulation), and where their
gradients are.

- Which backward ends the accumulation (the boundary): the one of micro-batch
  gradient_accumulation_steps, unless set_gradient_accumulation_boundary() fixed it, and never
  one inside no_sync() or coalesce_grad_reduction(), whose backwards keep their gradients on the
  rank (DeepSpeed's refusals of those contexts by stage are here too).
- The two ways a backward starts: engine.backward(loss), which runs autograd itself, and the
  script's own loss.backward() (or engine.scale(loss).backward()), which hooks on forward's
  outputs notice (OutputHooks below): the first of them begins it, and its end is queued
  for when autograd finishes. Either way the optimizer path is told before and after, and ZeRO-3's
  fetcher releases what the backward gathered.
- The gradients: pending since the last step (zero_grad drops them), collected where the step
  reads them (the step does it first, or the tensor-fragment API before it), and with
  ignore_unused_parameters false the trained parameters that got one.
"""
from __future__ import annotations

import contextlib
import logging

import torch

from .errors import FragmentError, NoSyncError, UnusedParametersError

log = logging.getLogger("zspeed.engine")

__all__ = ["Accumulation", "OutputHooks"]

# The ZeRO stages where DeepSpeed refuses engine.no_sync() / coalesce_grad_reduction(), with its
# exception class and the alternative.
_NO_SYNC_PARTITIONED = (NoSyncError, "no_sync context manager is incompatible with gradient partitioning logic of "
                        "ZeRO stage {stage} (as in DeepSpeed): use gradient_accumulation_steps or "
                        "set_gradient_accumulation_boundary(False) for the micro-batches instead.")
_LOCAL_REFUSALS = {
    "no_sync": {2: _NO_SYNC_PARTITIONED, 3: _NO_SYNC_PARTITIONED},
    "coalesce_grad_reduction": {0: (NotImplementedError, "coalesce_grad_reduction requires ZeRO stage 1/2/3, got "
                                    "stage {stage} (as in DeepSpeed); at stage 0 set_gradient_accumulation_"
                                    "boundary(False) before the micro-batches but the last does the same.")},
}


class Accumulation:
    """The backward passes since the last optimizer step and their gradients (module docstring).

    ``guard(what)`` is the engine's context that turns a failed collective into an error naming
    ``what``; ``got_grad`` the set of trained parameters' ids that got a gradient (filled by
    hooks) where unused parameters are refused, else None."""

    def __init__(self, path, fetcher, sync, trace, timing, guard, *, gas: int, stage: int, got_grad: set | None):
        self.path, self.fetcher, self.sync, self.trace, self.timing = path, fetcher, sync, trace, timing
        self.guard, self.gas, self.stage, self.got_grad = guard, gas, stage, got_grad
        self.override: bool | None = None  # set_gradient_accumulation_boundary's value (None: counted)
        self.local: str | None = None  # "no_sync" / "coalesce_grad_reduction" inside those contexts
        self.in_engine = False  # inside engine.backward's autograd run
        self.direct: bool | None = None  # a backward the script started is running: its boundary
        self.scaled_by_script = False  # engine.scale(loss) was called for the next direct backward (fp16)
        self.boundary_grads = False  # a boundary's backward has run since the last step
        self.gathered = False  # ... and its gradients are collected where the step reads them
        self.pending = False  # a backward ran since the last step

    # -- the boundary ------------------------------------------------------------------------------
    def is_boundary(self, micro_steps: int) -> bool:
        """Whether the micro-batch after ``micro_steps`` ends an accumulation (its step() steps)."""
        return self.override if self.override is not None else (micro_steps + 1) % self.gas == 0

    def backward_boundary(self, micro_steps: int) -> bool:
        """Whether a backward now ends the accumulation (its gradients reduced and stepped)."""
        return self.local is None and self.is_boundary(micro_steps)

    @contextlib.contextmanager
    def local_backwards(self, name: str):
        """no_sync() / coalesce_grad_reduction(): refused where DeepSpeed refuses them, not nested."""
        refusal = _LOCAL_REFUSALS[name].get(self.stage)
        if refusal is not None:
            kind, text = refusal
            raise kind(text.format(stage=self.stage))
        if self.local is not None:
            what = (f"{name} context manager reentry is unsupported" if self.local == name else
                    f"{name} inside {self.local}: the contexts cannot be nested")
            raise NoSyncError(f"{what} (as in DeepSpeed); leave the first one before entering another.")
        self.local = name
        try:
            yield
        finally:
            self.local = None

    def refuse_step_inside(self) -> None:
        """step() inside no_sync() / coalesce_grad_reduction() raises, as in DeepSpeed."""
        if self.local is not None:
            kind = "no_sync" if self.local == "no_sync" else "coalesce_grad_reduction (a no_sync)"
            raise NoSyncError(f"It is illegal to call Engine.step() inside {kind} context manager (as in "
                              f"DeepSpeed): call it after the block.")

    # -- a backward --------------------------------------------------------------------------------
    def run(self, scaled: torch.Tensor, retain_graph: bool, boundary: bool) -> None:
        """engine.backward's autograd run of the (scaled) loss."""
        with self.guard("backward"):  # a step still in the background finishes first
            self.path.before_backward(boundary)
        self.in_engine = True
        self.pending = True
        failed = True
        try:
            with self.guard("backward"), self.trace.span("backward"), self.timing.phase("bwd_inner"):
                scaled.backward(retain_graph=retain_graph)
            failed = False
            self.boundary_grads = boundary
        finally:
            self.in_engine = False
            try:
                with self.guard("backward"), self.timing.phase("bwd_reduce"):
                    self.path.after_backward()
                if self.fetcher is not None:
                    self.fetcher.release_all()
            except BaseException:
                if not failed:
                    raise
                # The backward's own error is what the script must see (a peer that died during
                # it fails the clean-up's collectives too).
                log.debug("zspeed: clean-up after a failed backward raised too", exc_info=True)

    def needs_begin(self, fp16: bool) -> bool:
        """At an output hook: whether this gradient is the first of a backward the script started
        (False inside engine.backward, or after the first). Under fp16 a loss not scaled through
        engine.scale() is refused before any gradient is made, as DeepSpeed refuses it."""
        if self.in_engine or self.direct is not None:
            return False
        if fp16 and not self.scaled_by_script:
            raise RuntimeError(
                "fp16 training needs a scaled loss, but loss.backward() was called on an unscaled loss. Call "
                "engine.backward(loss), or engine.scale(loss).backward() (DeepSpeed's two ways).")
        return True

    def begin_direct(self, boundary: bool) -> None:
        """The first output hook of a backward the script started: what engine.backward does
        before autograd runs, and its end queued after it."""
        self.direct = boundary
        self.pending = True
        self.path.before_backward(boundary)
        torch.autograd.Variable._execution_engine.queue_callback(self.end_direct)

    def end_direct(self) -> None:
        boundary, self.direct = bool(self.direct), None
        self.scaled_by_script = False
        self.boundary_grads = boundary
        self.path.after_backward()
        if self.fetcher is not None:
            self.fetcher.release_all()

    def param_grad(self, grad: torch.Tensor):
        """A parameter's gradient hook: in a backward the script started, each gradient is divided
        by gradient_accumulation_steps (engine.backward divides the loss instead)."""
        return grad / self.gas if self.direct is not None and self.gas > 1 else None

    # -- the gradients -------------------------------------------------------------------------------
    def refuse_if_collected(self, what: str) -> None:
        if self.gathered:
            raise FragmentError(
                f"{what}: this step's gradients were already read or set through the tensor-fragment API "
                f"(safe_get_full_grad / safe_set_full_grad ...), which collects them where the step reads them; "
                f"call engine.step() before the next backward.")

    def collect(self) -> None:
        """The boundary's gradients where the step reads them (once per step)."""
        if self.gathered:
            return
        self.sync.grads()  # stage 0 on several ranks: every gradient summed over the ranks
        with self.trace.span("gather gradients"):
            self.path.gather()
        self.gathered = True

    def collect_for_fragments(self, what: str) -> None:
        """:meth:`collect` for the tensor-fragment API, refused outside backward..step."""
        if not self.boundary_grads:
            raise FragmentError(
                f"{what}: gradients are readable after the backward of an accumulation boundary (micro-batch "
                f"{self.gas} of {self.gas}) and before engine.step(); there is none now (no backward since the "
                f"last step, or the accumulation is not at its boundary). Inside engine.no_sync() they are readable "
                f"too: each rank's own, not reduced.")
        if not self.gathered:
            with self.guard(what):
                self.collect()

    def check_all_used(self, module: torch.nn.Module) -> None:
        """ignore_unused_parameters false: every trained parameter got a gradient since the last
        step, else UnusedParametersError before anything is stepped."""
        if self.got_grad is None:
            return
        missing = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in self.got_grad]
        if missing:
            raise UnusedParametersError(
                f"zero_optimization.ignore_unused_parameters is false and {len(missing)} trained parameter(s) got "
                f"no gradient in this step: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}. Set "
                f"ignore_unused_parameters true (the default: they step with zero gradients), make every trained "
                f"parameter take part in the loss, or freeze them (requires_grad=False).")
        self.got_grad.clear()

    def over(self) -> None:
        """The step that read the gradients is over (or they were dropped)."""
        self.boundary_grads = self.gathered = self.pending = False

    def drop(self) -> None:
        """engine.zero_grad(): every gradient of the backwards since the last step dropped,
        wherever the path keeps it."""
        if not self.pending:  # nothing since the last step but what autograd may have left
            self.path.zero_grad()
            return
        with self.guard("zero_grad"):
            self.path.flush()  # a step in the background reads its gradients until done
        self.path.drop_grads()
        self.over()
        if self.got_grad is not None:
            self.got_grad.clear()


class OutputHooks:
    """Backward hooks on the tensors forward() returns (at any depth of tuples, lists and
    dicts, so also Hugging Face's ModelOutput), which notice a backward pass the script
    starts itself: ``loss.backward()`` or ``engine.scale(loss).backward()``.

    The first of them to fire in such a backward runs the optimizer path's
    before_backward, marks the backward as direct (the parameters' hooks then divide each
    gradient by gradient_accumulation_steps, see Accumulation.param_grad) and
    queues the end of it (after_backward) for when autograd finishes. Under fp16 a loss
    that was not scaled through engine.scale() is refused before any gradient is made,
    as DeepSpeed refuses it: unscaled fp16 gradients underflow. During engine.backward
    the hooks do nothing (it divides and scales the loss itself).

    DeepSpeed divides at these output hooks instead, which divides twice when one output
    depends on another (a model returning both the loss and the logits it came from);
    dividing at the parameters counts every gradient once. DeepSpeed also refuses direct
    backward passes at ZeRO stage 0; zspeed takes them at every stage."""

    def __init__(self, on_grad):
        self._hook = on_grad

    def register(self, out, seen: set | None = None) -> None:
        seen = set() if seen is None else seen
        if torch.is_tensor(out):
            if out.grad_fn is not None and id(out) not in seen:
                seen.add(id(out))
                out.register_hook(self._hook)
        elif isinstance(out, (list, tuple)):
            for o in out:
                self.register(o, seen)
        elif isinstance(out, dict):
            for o in out.values():
                self.register(o, seen)
