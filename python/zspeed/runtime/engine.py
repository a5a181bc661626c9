"""The training engine behind ``zspeed.initialize`` (DeepSpeed's DeepSpeedEngine API).

Usage is DeepSpeed's: ``loss = engine(batch); engine.backward(loss); engine.step()``
once per micro-batch; the optimizer runs on the gradient-accumulation boundary.

Precision: with fp16 or bf16 enabled the model is converted to that dtype and an
fp32 copy of every trainable parameter (the master weights) is what the optimizer
updates; with fp32 the optimizer updates the parameters themselves unless they are
offloaded.

What varies by mode is decided once, at start-up: the config and the launch become a run
plan (plan.py), from which assemble.py builds the parts -- where the model's tensors go,
the parameter store, the optimizer path over its local space (where the masters and the
optimizer state live: device, host memory, NVMe, or split), its step runner -- and
collectives.py the comm strategy. The step below drives every combination the same way;
checkpoints see the engine as its parts (parts.py).

One optimizer step (the boundary; a transaction, step.py):
  1. the path gathers the boundary's gradients;
  2. sum of squares and non-finiteness of grads / loss_scale in one pass;
  3. fp16: overflow -> skip the step, lower the scale (loss_scaler.py), count it;
  4. clip coefficient = gradient_clipping / (norm + 1e-6) when norm exceeds it;
  5. one optimizer step with the combined factor 1/loss_scale * clip applied to the
     gradients, after which the new weights are in the model;
  6. lr scheduler step (not on skipped steps), counters, gradients released.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import weakref
from typing import Any

import torch

from .. import comm
from .._native import ZSpeedError
from .config import ConfigError, ZSpeedConfig, parse_config
from .dtypes import cast_inputs, dtype_mismatch_hint, keep_in_fp32_pattern  # noqa: F401
from .fragments import EngineCalls, attach as attach_fragments
from .assemble import client_algorithm, client_kind, grad_sync, optimizer_path, placement
from .optimizers import share_client_groups
from .device import pick_device
from .collectives import for_plan
from .parts import CheckpointParts, Counters, ModelPart, OptimizerPart
from .plan import RunPlan
from . import engine_setup as setup
from .backward import Accumulation, OutputHooks
from .step import StepIncompleteError, StepTransaction, after_commit
from .trace import tracer_from
from .timing import EngineTiming
from .engine_checkpoint import Checkpoints
from .errors import one_line as _one_line
from .engine_queries import EngineQueries
from .summary import log_summary
from .layout import FlatLayout
from .paths import NoOptimizerPath
from .park import ParkedStates
from .engine_optimizer import needs_wrapper
from .optimizer_classes import wrapper_class
from .loss_scaler import build_loss_scaler
from .hooks import ZERO3_COPY_MESSAGE, EngineHook, ZeRO3CopyError, guard_copies
from .interrupts import interrupts_deferred
from .replicate import broadcast_module

log = logging.getLogger("zspeed.engine")

__all__ = ["ZSpeedEngine", "DeepSpeedEngine", "initialize", "StepIncompleteError", "EngineClosedError",
           "ZeRO3CopyError"]


class EngineClosedError(ZSpeedError, RuntimeError):
    """The engine was closed (engine.close() / destroy())."""


class ZSpeedEngine(EngineQueries, torch.nn.Module):
    """DeepSpeed-compatible engine around one ``torch.nn.Module`` on one device (its read-only
    queries: engine_queries.py)."""

    def __init__(self, model: torch.nn.Module, config: ZSpeedConfig, optimizer=None, model_parameters=None,
                 lr_scheduler=None, training_data=None, collate_fn=None, device: torch.device | None = None):
        super().__init__()
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"zspeed.initialize needs model=<torch.nn.Module>, got {type(model).__name__}.")
        self._config = config
        self.config = config.to_dict()
        setup.announce(config)  # the log level first, then the config's warnings
        self.device = device or pick_device()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # DeepSpeed's names: the rank on this host (LOCAL_RANK, 0 without a launcher), the
        # rank in the job, and the number of data-parallel ranks.
        self.local_rank = comm.get_local_rank()
        self.global_rank = comm.get_rank()
        self.world_size = self.dp_world_size = setup.world_size_of(config)
        self.dtype = (torch.float16 if config.fp16_enabled else
                      torch.bfloat16 if config.bf16_enabled else torch.float32)
        self.module = model  # placed on the device once the run plan is known (assemble.placement)
        setup.adopt_model(model, config)  # from earlier engines; ZeRO-3's leaf modules marked
        # DeepSpeed's monitors (zspeed.monitor): made first, so that a monitor whose package is
        # missing stops initialize() before anything is allocated
        self.monitor, monitor_error = setup.monitor_of(config)
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._closed = False
        self._parked = ParkedStates(self.device)  # engine.offload_states()
        self.loss_scaler = build_loss_scaler(config.fp16, config.zero_stage)
        self._gas = config.gradient_accumulation_steps

        # Without an optimizer (none passed, none in the config) the engine runs the forward only
        # (DeepSpeed's ZeRO-Inference: Hugging Face's Trainer.evaluate() before any training):
        # every parameter is kept as one nothing trains, and training calls raise NoOptimizerError.
        self._inference = optimizer is None and config.optimizer_name is None
        groups = []
        if not self._inference:
            groups, optimizer = setup.trained_groups(model, model_parameters, optimizer, config)
        self._names = setup.param_names(model, groups)

        self.plan = RunPlan.build(config, world_size=self.world_size, rank=self.global_rank, device=self.device,
                                  dtype=self.dtype, backend=comm.get_backend() if self.world_size > 1 else None,
                                  client=client_kind(optimizer), client_optimizer=client_algorithm(optimizer))
        self.collectives = for_plan(self.plan)
        self._layout = FlatLayout(groups)
        self._model_params = self._layout.params
        self._placement = placement(self.plan)
        self._stage3 = self.plan.store == "partitioned"  # DeepSpeed's "partitioned weights"
        self.module = setup.place_module(model, self._placement, self._layout, config, *self._mixed_precision_dtypes())
        setup.hook_parameters(self._model_params, self.module, _WeakHook(self._param_grad))
        setup.check_ranks_agree(self.collectives, self.config, self._names, self._layout, self.module, self.device,
                                monitor_error)
        broadcast_module(self.module, self.collectives)  # every rank starts from rank 0's weights
        self._sync = grad_sync(self.plan, self._layout, self.collectives)
        self.memory_needs, sizes = setup.check_memory(self.plan, self._placement, config, self.module, self._layout,
                                                      self.device)
        self.optimizer_path = (NoOptimizerPath(self._layout) if self._inference else
                               optimizer_path(self.plan, config, self._layout, optimizer, self.collectives))
        self._fetcher = self._placement.finish(config, self.optimizer_path, self.module, self.collectives)
        self.memory_needs = setup.memory_after_split(self.plan, self._placement, config, sizes, self.optimizer_path,
                                                     self.memory_needs)
        self._frozen_sm = self._placement.frozen_store
        if self._fetcher is not None:
            self._fetcher.bind(self, self.optimizer_path.follow_edits, self._settle_for)
        self._model_part = ModelPart(self.module, [self.optimizer_path.sharded, self._frozen_sm])
        # DeepSpeed's basic optimizer (the torch optimizer holding the state), and the engine's
        # optimizer: a wrapper with DeepSpeed's attributes where DeepSpeed has one.
        self.basic_optimizer = self.optimizer_path.optimizer
        if isinstance(optimizer, torch.optim.Optimizer) and optimizer is not self.basic_optimizer:
            share_client_groups(optimizer, self.basic_optimizer)
        self._fragments = attach_fragments(
            self, [p for ps in self._model_params for p in ps], layout=self._layout, stage3=self._stage3,
            calls=EngineCalls(check_open=weakref.WeakMethod(self._check_open), settle=weakref.WeakMethod(self._settle),
                              collect_grads=weakref.WeakMethod(self._grads_for_fragments),
                              local_backward=weakref.WeakMethod(self._local_backward_mode),
                              sum_over_ranks=weakref.WeakMethod(self._sync.stats)))
        self.optimizer = (wrapper_class(config, optimizer)(self, self.basic_optimizer, fetcher=self._fetcher,
                                                           model_params=self._model_params, fragments=self._fragments)
                          if needs_wrapper(config) and not self._inference else self.basic_optimizer)
        # DeepSpeed's names of the modules whose gradients it all-reduces sparse (Embedding with
        # sparse_gradients); zspeed reduces every gradient dense, so none.
        self.sparse_tensor_module_names: set = set()
        # DeepSpeed's backward calls allreduce_gradients() while this is on (its pipeline engine
        # turns it off and calls it itself); zspeed's backward reduces a boundary's gradients over
        # the ranks whatever it says (see allreduce_gradients).
        self.enable_backward_allreduce = True
        self._trace = tracer_from(config.trace, self.global_rank, self.world_size)
        # The optimizer step as a transaction (step.py): its pending phase, the norm, the overflow.
        self._step = StepTransaction(self.optimizer_path, self.loss_scaler, self._sync, self._trace,
                                     clip=config.gradient_clipping, skip_nonfinite=config.skips_nonfinite,
                                     grad_divisor=self.plan.grad_divisor)
        # DeepSpeed's throughput timer and wall-clock timers (timing.py)
        self._timing = EngineTiming(config, self.train_batch_size(), self.global_rank)
        self.tput_timer = self._timing.tput
        self.timers = self._timing.timers
        self.optimizer_path.set_trace(self._trace)
        self._path_hooks = self.optimizer_path.hook_modules(self.module)
        got = setup.record_used(self.plan, self.module, self._path_hooks)
        # The backwards of the step under way and where their gradients are (backward.py).
        self._acc = Accumulation(self.optimizer_path, self._fetcher, self._sync, self._trace, self._timing,
                                 _collectives, gas=self._gas, stage=config.zero_stage, got_grad=got)
        # Save and load over the engine's parts (engine_checkpoint.py); rank 0 writes zero_to_fp32.py
        # beside ZeRO (stage 1-3) checkpoints, as DeepSpeed.
        self._ckpt = Checkpoints(weakref.WeakMethod(self._checkpoint_parts), self.optimizer_path, self._fetcher,
                                 self._step, self._acc, _collectives,
                                 recovery_scripts=config.zero_stage >= 1 and self.global_rank == 0)
        # module.state_dict() (what exports and EMA copies read) sees the finished step.
        self._path_hooks.append(self.module.register_state_dict_pre_hook(
            _WeakHook(self._settle_before_read)))
        guard_copies(self.module, _WeakHook(self._before_copy))  # EMA copies see the finished step

        self.lr_scheduler = None if self._inference else setup.scheduler_of(config, lr_scheduler, self.basic_optimizer)
        if self._inference:
            setup.note_inference(config, lr_scheduler, self.global_rank)
        self.training_dataloader = None
        if training_data is not None:
            self.training_dataloader = self.deepspeed_io(training_data, collate_fn=collate_fn)
        if config.dump_state:
            log.info("zspeed engine: %s", self._describe())
        log_summary(self)

    def deepspeed_io(self, dataset, batch_size=None, collate_fn=None, shuffle=True):
        """A DataLoader over ``dataset`` with the micro-batch size (DeepSpeed's name)."""
        return setup.dataloader(dataset, batch_size or self.train_micro_batch_size_per_gpu(), collate_fn, shuffle,
                                self._config, self.world_size, self.global_rank)

    def allreduce_gradients(self, bucket_size: int | None = None) -> None:
        """DeepSpeed's name: reduce the accumulated gradients over the data-parallel ranks. zspeed's
        backward of a boundary micro-batch has reduced them already (during the backward, into
        the optimizer's buffers, at every stage), so there is nothing left to do; the call is
        accepted for the scripts that make it (after turning enable_backward_allreduce off), and
        the step's result is the same with or without it. ``bucket_size`` is DeepSpeed's and is
        not used."""
        self._check_open()

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the current micro-batch ends an accumulation (its step() runs the optimizer):
        counted from micro_steps, unless set_gradient_accumulation_boundary() fixed it."""
        return self._acc.is_boundary(self.micro_steps)

    @contextlib.contextmanager
    def no_sync(self):
        """DeepSpeed's context for backwards whose gradients are not reduced over the ranks: they
        accumulate on each rank, and the first boundary backward after the block reduces them
        with its own (as DeepSpeed, ZeRO stages 0 and 1 only: stages 2 and 3 partition the
        gradients as they arrive). step() inside raises; so does a second no_sync inside."""
        self._check_open()
        with self._acc.local_backwards("no_sync"):
            yield

    @contextlib.contextmanager
    def coalesce_grad_reduction(self):
        """DeepSpeed's context for several backwards that make one optimizer step with one
        gradient reduction (ZeRO stages 1-3): the backwards inside keep their gradients on the
        rank, summed, and the step() after the block reduces and applies them, as
        set_gradient_accumulation_boundary(False) before all but the last would. step() inside
        raises, as does nesting it with no_sync(). ZeRO stage 0 is refused (NotImplementedError,
        as DeepSpeed)."""
        self._check_open()
        with self._acc.local_backwards("coalesce_grad_reduction"):
            yield
        # the block is the step's accumulation: its backwards' gradients are the step's
        self._acc.boundary_grads = self.is_gradient_accumulation_boundary()

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """DeepSpeed's override of the boundary: until called again (with True or False; None
        returns to counting), is_gradient_accumulation_boundary() returns ``is_boundary``, so
        step() runs the optimizer exactly when it is True. Set it before each micro-batch's
        backward; Hugging Face accelerate calls it with its sync_gradients flag and calls
        step() only on boundaries. The gradients of each backward are still divided by
        gradient_accumulation_steps."""
        if is_boundary is not None and not isinstance(is_boundary, bool):
            raise TypeError(f"is_boundary must be True, False or None, got {is_boundary!r}")
        self._acc.override = is_boundary

    # -- training ---------------------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        """The module's forward. With fp16.auto_cast, floating-point inputs are cast to fp16
        first. Outputs that carry a graph get backward hooks, so that ``loss.backward()``
        called by the script itself (instead of engine.backward) trains like
        engine.backward(loss): see backward.OutputHooks."""
        self._check_open(needs="weights")
        if self._config.auto_cast:
            inputs, kwargs = cast_inputs(inputs, torch.float16), cast_inputs(kwargs, torch.float16)
        self.tput_timer.start()
        with self._collectives("forward"), self._timing.phase("fwd"):  # ZeRO-3 gathers and a step in the background communicate
            if not torch.is_grad_enabled():  # evaluation sees the newest weights (delayed update: cpu.py)
                self._settle()
            try:
                with self._trace.span("forward"):
                    out = self.module(*inputs, **kwargs)
            except RuntimeError as e:  # fp16 / bf16: inputs of another dtype are named in a ConfigError
                hint = dtype_mismatch_hint(e, inputs, kwargs, self.dtype) if self.dtype != torch.float32 else None
                if hint is None:
                    raise
                raise ConfigError(hint) from e
        if torch.is_grad_enabled():
            OutputHooks(_WeakHook(self._output_grad)).register(out)
        return out

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """DeepSpeed's engine.scale(loss): the loss multiplied by the fp16 loss scale (the loss
        itself with bf16 or fp32), for scripts that call ``engine.scale(loss).backward()``
        instead of engine.backward(loss). The division by gradient_accumulation_steps and the
        rest of engine.backward's work happen in hooks (see backward.OutputHooks). With bf16 or fp32
        a plain ``loss.backward()`` works the same way; with fp16 it is refused, as in
        DeepSpeed."""
        if not torch.is_tensor(loss) or loss.numel() != 1 or loss.grad_fn is None:
            raise ValueError("engine.scale(loss) needs the scalar loss tensor of the micro-batch, with a graph")
        if not self._config.fp16_enabled:
            return loss
        self._acc.scaled_by_script = True
        return loss.float() * self.loss_scaler.loss_scale

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        """Backward of one micro-batch; returns the loss as averaged over the accumulation."""
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise ValueError("engine.backward(loss) needs the scalar loss tensor of the micro-batch")
        self._check_open()
        if self._inference:
            raise self.optimizer_path.refuse("engine.backward()")
        self._refuse_if_unfinished("engine.backward()")
        self._acc.refuse_if_collected("engine.backward()")
        if scale_wrt_gas and self._gas > 1:
            loss = loss / self._gas
        scaled = loss.float() * self.loss_scaler.loss_scale if self._config.fp16_enabled else loss
        with self._timing.phase("bwd"):
            self._acc.run(scaled, retain_graph, self._acc.backward_boundary(self.micro_steps))
        return loss

    def _begin_direct_backward(self) -> None:
        """The first output hook of a backward the script started (loss.backward())."""
        self._check_open()
        self._refuse_if_unfinished("loss.backward()")
        self._acc.refuse_if_collected("loss.backward()")
        self._acc.begin_direct(self._acc.backward_boundary(self.micro_steps))

    def _backward_epilogue(self) -> None:
        """DeepSpeed's internal end of a backward, which scripts that run ``loss.backward()``
        themselves over several engines (one loss over their models) call on each engine: zspeed
        ends such a backward by itself when autograd finishes (``Accumulation.end_direct``, queued at
        its start: the gradients are where the step reads them), so nothing is left to do here."""
        self._check_open()

    def _refuse_if_load_failed(self, what: str) -> None:
        self._ckpt.refuse_if_failed(what)

    def _refuse_if_unfinished(self, what: str) -> None:
        self._refuse_if_load_failed(what)
        self._step.refuse_if_pending(what, self.global_steps + 1)

    def _local_backward_mode(self) -> str | None:
        """None, or the context the backward passes run in: "no_sync", "coalesce_grad_reduction"."""
        return self._acc.local

    def _grads_for_fragments(self, what: str) -> None:
        """The boundary's gradients collected where the step reads them (what the step does first),
        for the tensor-fragment API; refused outside backward..step."""
        self._check_open()
        self._refuse_if_unfinished(what)
        self._acc.collect_for_fragments(what)

    def _settle(self) -> None:
        """Completes the optimizer step under way before anything reads the weights or the state:
        one that raised partway (completed by step(), which raises again if it fails again) and
        one running in the background (offload_optimizer overlap_forward / delayed_update)."""
        if self._step.torn:
            self.step()
        self.optimizer_path.flush()

    def _settle_for(self, what: str) -> None:
        """:meth:`_settle` for a reader of the weights (GatheredParameters): StepTransaction.settle_for."""
        self._step.settle_for(what, self._settle, self.global_steps + 1)

    def _check_open(self, needs: str = "all") -> None:
        """Refuses a call on a closed engine, and one that needs states engine.offload_states()
        moved to host memory: ``needs`` "all", "weights" (a forward) or "none"."""
        if self._closed:
            raise EngineClosedError("this engine was closed (engine.close() / destroy() released its buffers and "
                                    "files); build a new one with zspeed.initialize to train again.")
        if needs != "none" and self._parked.away:
            self._parked.refuse(self, sys._getframe(1), weights_only=needs == "weights")

    def _collectives(self, what: str):
        return _collectives(what)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops the gradients (DeepSpeed's engine always sets them to None): every gradient of
        the backwards since the last step, wherever the engine keeps it (the model's .grad, the
        reduced shards of ZeRO-2/3, host copies, the parameter shards with grads_in_shards), so
        the next step applies only the backwards that follow. Refused while an optimizer step
        that raised partway is pending (its gradients are needed to complete it)."""
        del set_to_none
        self._check_open()
        self._refuse_if_unfinished("engine.zero_grad()")
        self._acc.drop()

    def step(self, lr_kwargs: dict | None = None) -> None:
        """Ends a micro-batch; on the accumulation boundary runs the optimizer. A step is
        all or nothing: Ctrl-C waits for it (interrupts.py), and when it raises partway (an
        NVMe I/O error, a failing kernel) calling step() again completes it, each parameter
        stepped once; until then backward and exports refuse to run."""
        self._check_open()
        if self._inference:
            raise self.optimizer_path.refuse("engine.step()")
        self._acc.refuse_step_inside()
        self._refuse_if_load_failed("engine.step()")
        boundary = self._step.torn or self.is_gradient_accumulation_boundary()
        with interrupts_deferred(), self._timing.phase("step"):
            if boundary:
                try:
                    with self._collectives("step"), self._trace.span("optimizer step", step=self.global_steps):
                        self._take_model_step(lr_kwargs)
                except BaseException as e:
                    self._step.failed(_one_line(e))
                    raise
            self.micro_steps += 1
        # The step is committed (applied and counted): what follows only reports it, and a failure
        # there (a full disk under a monitor's or the trace's folder) is logged, never raised, since
        # step() raising asks for a retry that would apply a second optimizer step.
        if boundary and self.monitor.enabled and self.global_rank == 0:
            scale = self.loss_scaler.loss_scale if self._config.fp16_enabled else None
            after_commit(self.global_steps, "writing the monitors' step events", lambda: self.monitor.write_events(
                self._timing.monitor_events(self.global_samples, self.get_lr()[0], scale)))
        self._timing.after_step(boundary)
        if boundary and self._trace.enabled and self.global_steps % 20 == 0:
            after_commit(self.global_steps, "writing the trace (zspeed_trace)", self._trace.flush)

    def _take_model_step(self, lr_kwargs) -> None:
        """One optimizer step as a transaction (step.py), then its commit: the counters, and
        after an applied step the path's and ZeRO-3's bookkeeping. Nothing after the commit raises."""
        applied = self._step.run(self._decide_step, self.lr_scheduler, lr_kwargs)
        self._acc.over()
        self._count_step()
        if applied:
            self.optimizer_path.step_done()
            if self._fetcher is not None:  # ZeRO-3: persistent parameters whole and current, as DeepSpeed's
                self._fetcher.refresh_persistent(wait=False)

    def _decide_step(self) -> float | None:
        """The transaction's decision: the boundary's gradients collected (unless the tensor-fragment
        API did), every trained parameter used where that is checked; None for an overflow skip."""
        factor = self._step.decide(self._acc.collect, lambda: self._acc.check_all_used(self.module))
        if factor is None:
            self.skipped_steps += 1
            log.info("zspeed: step %d skipped: gradient overflow; loss scale now %g", self.global_steps,
                     self.loss_scaler.loss_scale)
        return factor

    def _count_step(self) -> None:
        self.global_steps += 1
        self.global_samples += self.train_batch_size()
        spp = self._config.steps_per_print
        if spp and self.global_steps % spp == 0:
            log.info("step=%d lr=%s loss_scale=%g grad_norm=%s skipped=%d", self.global_steps, self.get_lr(),
                     self.loss_scaler.loss_scale, self._step.grad_norm, self.skipped_steps)

    # -- checkpoints (see checkpoint.py) ------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False) -> bool:
        if not save_dir:  # as DeepSpeed: "" would write into the working directory unnoticed
            raise ValueError(f"save_checkpoint: save_dir must be a non-empty string (the folder to write the "
                             f"checkpoint into), got {save_dir!r}")
        self._check_open()
        if self._inference:
            raise self.optimizer_path.refuse(
                "engine.save_checkpoint()", "To save the weights, call engine.save_16bit_model(folder) (at ZeRO-3 "
                "with zero_optimization.stage3_gather_16bit_weights_on_model_save true); for a training "
                "checkpoint, build the engine with an optimizer")
        self._refuse_if_load_failed("engine.save_checkpoint()")
        with self._collectives("save_checkpoint"):
            self._settle()  # a step that stopped partway or runs in the background completes first
        return self._ckpt.save(save_dir, tag, client_state or {}, save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True,
                        load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False):
        self._check_open()
        # Without an optimizer there are no states to load into: the weights (and the counters)
        # only, as DeepSpeed loads into an engine without one.
        return self._ckpt.load(load_dir, tag, strict=load_module_strict,
                               with_states=load_optimizer_states and not load_module_only and not self._inference,
                               lr_states=load_lr_scheduler_states and not load_module_only,
                               counters=not load_module_only, step_number=self.global_steps + 1)

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """DeepSpeed's: the whole model's state_dict in the training dtype, written by rank 0 into
        ``save_dir/save_filename`` (every rank must call it). A name ending in .safetensors is
        written as safetensors (tied weights once), any other name with torch.save, as DeepSpeed
        does. At ZeRO-3 it needs zero_optimization.stage3_gather_16bit_weights_on_model_save
        (DeepSpeed's rule: the gather costs memory); without it nothing is written and False is
        returned, with a warning."""
        self._check_open()
        if self._stage3 and not self.zero_gather_16bit_weights_on_model_save():
            log.warning("zspeed: save_16bit_model did not save: at ZeRO stage 3 it needs "
                        "zero_optimization.stage3_gather_16bit_weights_on_model_save true (or use "
                        "save_checkpoint and `zspeed to-fp32`).")
            return False
        self._ckpt.save_16bit(save_dir, save_filename, self._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters),
                              rank0=self.global_rank == 0, barrier=self.collectives.barrier)
        return True

    save_fp16_model = save_16bit_model  # DeepSpeed's older name

    def finish_step(self) -> None:
        """Waits for an optimizer step still running in the background (offload_optimizer
        overlap_forward or delayed_update) and puts its weights into the model, so that the
        parameters can be read directly; a no-op otherwise (docs/OFFLOAD.md). A step that
        stopped partway (it raised) is completed here too."""
        self._check_open()
        with self._collectives("finish_step"):
            self._settle()
            if self._fetcher is not None:  # ZeRO-3: persistent parameters current, as after a step
                self._fetcher.refresh_persistent(wait=True)

    def offload_states(self, include=None, device=None, pin_memory: bool = True, non_blocking: bool = False) -> None:
        """DeepSpeed's: the engine's states on the device move to host memory (runtime/park.py says
        which, how, and what is refused until reload_states() brings them back bit for bit)."""
        self._check_open(needs="none")
        if self._inference:
            raise self.optimizer_path.refuse("engine.offload_states()", "Moving states needs a training engine")
        self._refuse_if_unfinished("engine.offload_states()")
        with self._collectives("offload_states"):
            self._parked.offload(include, device, self.module, self._fetcher, self._settle, stores=[
                self.optimizer_path.sharded, self._frozen_sm], roots=[self.optimizer_path, self._sync],
                pin_memory=pin_memory, non_blocking=non_blocking)

    def reload_states(self, non_blocking: bool = False) -> None:
        """DeepSpeed's: the states offload_states() moved, back on the device as they left (a
        no-op when none are away)."""
        self._check_open(needs="none")
        self._parked.reload(non_blocking=non_blocking)

    def empty_partition_cache(self) -> None:
        """DeepSpeed's: gives back the device memory of gathered ZeRO-3 parameters (every one goes
        back to its shard, the persistent ones too, as in DeepSpeed; the next forward gathers them
        again), then the allocator's cached blocks. Below stage 3 nothing is gathered, and this only empties the
        allocator's cache. Called between forwards (DeepSpeed's checkpoint helpers call it)."""
        self._check_open()
        if self._fetcher is not None:
            self._fetcher.release_all(persistent_too=True)
        import gc
        gc.collect()
        torch.cuda.empty_cache()  # a no-op where CUDA was never initialized

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Releases what the engine holds outside Python's memory: with nvme offload the swap
        files under nvme_path are deleted (also done when the engine is garbage-collected).
        The engine cannot train afterwards (forward, backward, step and checkpoints raise
        EngineClosedError). Idempotent. A step still running in the background is waited for
        first; one that stopped partway is left as it is (its error was raised already)."""
        if self._closed:
            return
        self._parked.reload()  # states offload_states() moved: back first, the module is handed back whole
        self._step.settle_at_close(self._settle, self._ckpt.failed, self.global_steps + 1)
        self._closed = True
        self.optimizer_path.abandon_step() if self.optimizer_path.step_failed() else self.optimizer_path.flush()
        if self._fetcher is not None:  # ZeRO-3: the parameters hold the weights again (zero3.hand_back)
            self._fetcher.hand_back()
        self.optimizer_path.close()
        if self._frozen_sm is not None and hasattr(self._frozen_sm, "close"):
            self._frozen_sm.close()
        self._trace.flush()

    destroy = close  # DeepSpeed's name

    # -- the engine's state as checkpoint parts (parts.py; checkpoint.py reads only these) -----------
    # -- what the module's hooks call (through weak references: see the classes below) --------
    def _output_grad(self, grad: torch.Tensor):
        """The first gradient of a backward the script started itself (loss.backward())."""
        if self._inference:
            raise self.optimizer_path.refuse("loss.backward()")
        if self._acc.needs_begin(self._config.fp16_enabled):
            self._begin_direct_backward()
        return None

    def _param_grad(self, grad: torch.Tensor):
        return self._acc.param_grad(grad)

    def _settle_before_read(self, *_hook_args) -> None:
        """A state_dict pre-hook on the module: the optimizer step under way completes first."""
        # (not during a checkpoint load: it reads the module to plan, then replaces what a torn
        # step touched, or leaves that step pending when it refuses the checkpoint)
        if not self._closed and not self._ckpt.loading:
            self._settle()

    def _before_copy(self) -> None:
        """Before the module is deep-copied or pickled (guard_copies)."""
        if self._closed:
            return
        if self._stage3:
            raise ZeRO3CopyError(ZERO3_COPY_MESSAGE)
        self._settle()

    def _checkpoint_parts(self) -> CheckpointParts:
        return CheckpointParts(model=self._model_part,
                               optim=OptimizerPart(self._names, self._model_params, self.optimizer_path,
                                                   self.optimizer),
                               scaler=self.loss_scaler, scheduler=self.lr_scheduler, counters=Counters(self),
                               world_size=self.world_size, rank=self.global_rank, dtype=self.dtype,
                               config=self.config)

    def _master_named(self) -> dict:
        """name -> fp32 master tensor (parts.OptimizerPart.master_named)."""
        return self._checkpoint_parts().optim.master_named()

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> dict:
        """DeepSpeed's name: the whole model's state_dict in the training dtype, on rank 0 (other
        ranks get {}); every rank must call it. Also works below stage 3. The step under way
        (delayed_update, overlap_forward, or one that raised partway) completes first."""
        self._settle()
        sd = self._model_part.state_for_save()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            sd = {k: v for k, v in sd.items() if k not in frozen}
        return sd if self.global_rank == 0 else {}


def _collectives(what: str):
    """Turns a failed collective in engine.<what>() into an error that says what probably happened."""
    return comm.guarded(f"in engine.{what}()", f"Another rank has most likely stopped (crashed, killed, out of "
                        f"memory) or is stuck, or {comm.ONE_RANK_HINT}: look at the other ranks' output.")


class _WeakHook(EngineHook):
    """A hook the engine puts on its module, its parameters or its outputs: it calls an engine
    method through a weak reference (``weakref.WeakMethod``), so the model's hooks do not keep a
    finished engine alive; once the engine is gone it does nothing (returns None)."""

    def __init__(self, method):
        self._method = weakref.WeakMethod(method)

    def __call__(self, *args):
        fn = self._method()
        return None if fn is None else fn(*args)


def initialize(args: Any = None, model: torch.nn.Module | None = None, optimizer=None, model_parameters=None,
               training_data=None, lr_scheduler=None, distributed_port: int | None = None, mpu=None,
               dist_init_required: bool | None = None, collate_fn=None, config=None, config_params=None,
               mesh_param=None):
    """DeepSpeed's ``deepspeed.initialize``: returns (engine, optimizer, dataloader, lr_scheduler).

    ``config`` is a dict or a JSON path; ``args.deepspeed_config`` is honoured;
    ``config_params`` is DeepSpeed's older name for ``config``."""
    if model is None:
        from .errors import ConfigAssertionError  # DeepSpeed asserts here
        hint = (f" The first positional argument is args (here a {type(args).__name__}): pass the model as "
                f"model=..." if isinstance(args, torch.nn.Module) else "")
        raise ConfigAssertionError("zspeed.initialize needs model=<torch.nn.Module>, got None." + hint)
    if mpu is not None or mesh_param is not None:
        raise ConfigError("model parallelism (mpu / mesh_param) is not supported by zspeed yet.")
    if config is not None and config_params is not None:
        raise ConfigError("pass the config once: config= or config_params=, not both.")
    # As DeepSpeed: create (or adopt) the process group first; with no launcher it is a
    # one-process group, so scripts may call torch.distributed / zspeed.comm afterwards.
    comm.init_distributed(dist_init_required=dist_init_required,
                          distributed_port=distributed_port or comm.TORCH_DISTRIBUTED_DEFAULT_PORT,
                          verbose=False)
    cfg = parse_config(config if config is not None else config_params, args=args,
                       world_size=comm.get_world_size())
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)
    if "activation_checkpointing" in cfg.raw:
        # The section configures zspeed.checkpointing (DeepSpeed leaves that to the script's own
        # deepspeed.checkpointing.configure call, which still wins when it comes first or later).
        from .. import checkpointing
        if not checkpointing.is_configured():
            checkpointing.configure(None, deepspeed_config=cfg)
    engine = ZSpeedEngine(model, cfg, optimizer=optimizer, model_parameters=model_parameters,
                          lr_scheduler=lr_scheduler, training_data=training_data, collate_fn=collate_fn)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


DeepSpeedEngine = ZSpeedEngine  # DeepSpeed's class name
