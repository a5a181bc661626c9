"""``engine.optimizer`` where DeepSpeed's engine has an optimizer wrapper.

DeepSpeed wraps the basic optimizer (the torch optimizer that holds the state)
whenever it manages precision or partitioning: fp16, bf16, or ZeRO stage 1 and up.
Scripts and DeepSpeed's own tests then reach the basic optimizer as
``engine.optimizer.optimizer`` and the loss scaling as ``engine.optimizer.loss_scaler``,
``.dynamic_loss_scale``, ``.loss_scale_config``, ``.cur_scale``. :class:`EngineOptimizer`
gives those names; for fp32 at stage 0 the engine's optimizer is the basic optimizer
itself, as in DeepSpeed.

The wrapper is a ``torch.optim.Optimizer`` whose ``param_groups``, ``state`` and
``defaults`` are the basic optimizer's own objects, so changing a group's lr through
either is the same change and torch's lr schedulers accept it; ``state_dict`` and
``load_state_dict`` are the basic optimizer's. The optimizer step belongs to the engine
(unscaling, overflow check, clipping, offload): ``step()`` on the wrapper raises and
says to call ``engine.step()``, and ``zero_grad()`` is ``engine.zero_grad()``.
"""
from __future__ import annotations

import weakref

import torch

__all__ = ["EngineOptimizer", "LossScaleConfigView", "needs_wrapper"]


def needs_wrapper(config) -> bool:
    """Whether DeepSpeed would wrap the basic optimizer for this config."""
    return bool(config.fp16_enabled or config.bf16_enabled or config.zero_stage >= 1)


class LossScaleConfigView:
    """DeepSpeed's ``optimizer.loss_scale_config`` fields, read live from the engine's scaler:
    use_grad_scaling, dynamic_loss_scale, cur_scale, cur_iter, last_overflow_iter,
    scale_factor, scale_window, min_loss_scale (the last four None without dynamic scaling)."""

    def __init__(self, engine):
        self._engine = engine

    @property
    def _scaler(self):
        return self._engine.loss_scaler

    @property
    def use_grad_scaling(self) -> bool:
        return bool(self._engine.fp16_enabled())

    @property
    def dynamic_loss_scale(self) -> bool:
        return bool(self._scaler.dynamic)

    @property
    def cur_scale(self) -> float:
        return self._scaler.cur_scale

    @property
    def cur_iter(self) -> int:
        return getattr(self._scaler, "cur_iter", 0)

    @property
    def last_overflow_iter(self):
        return getattr(self._scaler, "last_overflow_iter", None)

    @property
    def scale_factor(self):
        return getattr(self._scaler, "scale_factor", None)

    @property
    def scale_window(self):
        return getattr(self._scaler, "scale_window", None)

    @property
    def min_loss_scale(self):
        return getattr(self._scaler, "min_scale", None)


class EngineOptimizer(torch.optim.Optimizer):
    """The engine's optimizer with DeepSpeed's wrapper attributes (see the module docstring)."""

    def __init__(self, engine, basic: torch.optim.Optimizer, *, fetcher=None, model_params=(), fragments=None):
        """``fetcher``: ZeRO-3's parameter gatherer (None below stage 3); ``model_params``: per
        group, the model's trained parameters; ``fragments``: the engine's tensor-fragment views
        (runtime/fragments.py), which read the gradients as DeepSpeed's API does."""
        # torch's constructor sets up the hook registries and the step profiling; it needs a
        # parameter, after which the groups and the state become the basic optimizer's own.
        super().__init__([torch.zeros(1)], {})
        self.optimizer = basic
        self._engine_ref = weakref.ref(engine)
        self._fetcher, self._model_params, self._fragments = fetcher, model_params, fragments

    # The groups, the state and the defaults are always the basic optimizer's current objects
    # (its load_state_dict replaces them); before the basic optimizer is attached, torch's
    # constructor keeps its placeholders here.
    def _basic_or_own(name):  # noqa: N805 - a helper that builds the properties below
        own = "_own_" + name

        def get(self):
            basic = self.__dict__.get("optimizer")
            return getattr(basic, name) if basic is not None else self.__dict__[own]

        def set_(self, value):
            basic = self.__dict__.get("optimizer")
            if basic is None:
                self.__dict__[own] = value
            else:
                setattr(basic, name, value)

        return property(get, set_)

    param_groups = _basic_or_own("param_groups")
    state = _basic_or_own("state")
    defaults = _basic_or_own("defaults")
    del _basic_or_own

    @property
    def _engine(self):
        engine = self._engine_ref()
        if engine is None:
            raise RuntimeError("the engine of this optimizer no longer exists")
        return engine

    # -- DeepSpeed's wrapper attributes --------------------------------------------------------
    @property
    def loss_scaler(self):
        return self._engine.loss_scaler

    @property
    def dynamic_loss_scale(self) -> bool:
        return bool(self._engine.fp16_enabled() and self._engine.loss_scaler.dynamic)

    @property
    def loss_scale_config(self) -> LossScaleConfigView:
        return LossScaleConfigView(self._engine)

    @property
    def cur_scale(self) -> float:
        return self._engine.loss_scaler.cur_scale

    @property
    def loss_scale(self) -> float:
        return self._engine.loss_scaler.loss_scale

    @loss_scale.setter
    def loss_scale(self, value: float) -> None:
        value = float(value)
        if not value > 0 or value == float("inf"):
            raise ValueError(f"the loss scale must be a finite number > 0, got {value}")
        self._engine.loss_scaler.cur_scale = value

    @property
    def overflow(self) -> bool:
        return not self._engine.was_step_applied()

    @property
    def clip_grad(self) -> float:
        return self._engine.gradient_clipping()

    @property
    def _global_grad_norm(self):
        return self._engine.get_global_grad_norm()

    def _get_norm_groups(self) -> list:
        """DeepSpeed's per-group gradient norms: after the backward of an accumulation boundary and
        before ``engine.step()``, one fp32 scalar tensor (on the engine's device) per parameter
        group, the L2 norm of its gradients as the tensor-fragment API reads them (averaged over
        ranks and micro-batches, the loss scale divided out, so a safe_set_*_grad shows in it).
        With several ranks it is a collective (every rank calls it)."""
        return self._fragments.norm_groups("optimizer._get_norm_groups()")

    @property
    def parameter_offload(self):
        """ZeRO-3: the object that gathers and releases the partitioned parameters around the
        modules (DeepSpeed's DeepSpeedZeRoOffload), with DeepSpeed's names scripts use to take its
        hooks off and put them back (TRL's generation context): ``module``, ``forward_hooks``,
        ``backward_hooks``, ``_register_deepspeed_module(module)`` (``_register_hooks_recursively``
        before DeepSpeed 0.16.4) and ``_remove_module_hooks()``. Below stage 3 there is none
        (AttributeError, so ``hasattr`` answers False, as for DeepSpeed's stage 1-2 optimizers)."""
        fetcher = self._fetcher
        if fetcher is None:
            raise AttributeError("parameter_offload: the engine is not at ZeRO stage 3 (its parameters are whole)")
        return fetcher

    @property
    def fp16_groups(self) -> list:
        """Per parameter group, the model's trained parameters in the training dtype (DeepSpeed's
        fp16 and ZeRO-3 optimizers' name; at ZeRO-3 they are the partitioned parameters)."""
        return [list(ps) for ps in self._model_params]

    @property
    def bit16_groups(self) -> list:
        """The same groups under DeepSpeed's ZeRO stage 1-2 name."""
        return self.fp16_groups

    def _fp32_rows(self) -> list:
        """Per parameter group, copies of the fp32 master weights this rank holds, one tensor
        per parameter or piece (flat, or shaped like the parameter), in the group's order."""
        return [[m.detach().float().clone() for m in row] for row in self._engine.optimizer_path.masters()]

    def _fp32_flat(self) -> list:
        """Per parameter group, one flat fp32 copy of the master weights this rank holds."""
        return [torch.cat([m.reshape(-1) for m in row]) if row else torch.empty(0) for row in self._fp32_rows()]

    @property
    def checkpoint_class(self) -> str:
        return self._engine.optimizer_path.checkpoint_class

    # -- what belongs to the engine ----------------------------------------------------------
    def step(self, closure=None):
        raise RuntimeError("the optimizer step runs inside engine.step() (unscaling, overflow check, "
                           "clipping and offload happen there); call engine.step() after engine.backward().")

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._engine.zero_grad(set_to_none)

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self._engine.set_gradient_accumulation_boundary(is_boundary)

    # -- the basic optimizer's -----------------------------------------------------------------
    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group) -> None:
        if "optimizer" not in self.__dict__:  # torch's constructor adding its placeholder group
            super().add_param_group(param_group)
            return
        raise RuntimeError("the engine's parameter groups are fixed when zspeed.initialize builds them; "
                           "pass every group in model_parameters.")

    def __getattr__(self, name):
        # Anything else (validate_state_dict, num_threads, ...) is the basic optimizer's.
        basic = self.__dict__.get("optimizer")
        if basic is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(basic, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r})"
