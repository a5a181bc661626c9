"""DeepSpeed's optimizer class names (imports torch; loaded lazily by zspeed.ops.adam
and zspeed.ops.lion):

- :class:`DeepSpeedCPUAdam`: zspeed's :class:`~zspeed.ops.adam.CPUAdam` (same
  signature) with DeepSpeed's ``adam_w_mode`` attribute and its sub-group calls
  ``step_subgroup`` / ``rollback_subgroup``;
- :class:`DeepSpeedCPUAdagrad`: :class:`~zspeed.ops.adagrad.CPUAdagrad` with DeepSpeed's
  signature and ``fp32_optimizer_states``;
- :class:`DeepSpeedCPULion`: :class:`~zspeed.ops.lion.CPULion` with DeepSpeed's
  defaults (lr 1e-3, betas (0.9, 0.999)) and ``fp32_optimizer_states``;
- :class:`FusedAdam` and :class:`FusedLion`: DeepSpeed's device optimizers, here in
  plain torch (any device, no compiled kernel), with DeepSpeed's signatures.

Checkpoints record each class under the name of the algorithm it runs
(``checkpoint_class``), so a checkpoint saved with one of these loads into an engine
built from the config, and back.
"""
from __future__ import annotations

import torch

from ._torch_optim import CPUAdagrad, CPUAdam, CPULion

__all__ = ["DeepSpeedCPUAdagrad", "DeepSpeedCPUAdam", "DeepSpeedCPULion", "FusedAdam", "FusedLion", "TorchLion"]


class TorchLion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023) in plain torch, for the non-offloaded path.

    update = sign(beta1 * m + (1 - beta1) * g); p -= lr * (update + wd * p);
    m = beta2 * m + (1 - beta2) * g."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros_like(p)
                m = st["exp_avg"]
                upd = (m * b1).add_(p.grad, alpha=1 - b1).sign_()
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(upd, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)
        return loss


class DeepSpeedCPUAdam(CPUAdam):
    """DeepSpeed's ``DeepSpeedCPUAdam(model_params, lr=1e-3, bias_correction=True,
    betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, adamw_mode=True,
    fp32_optimizer_states=True)``, run by zspeed's C kernel (see CPUAdam for zspeed's
    extra keywords ``state_dtype`` and ``num_threads``)."""

    @property
    def adam_w_mode(self) -> bool:
        """DeepSpeed's name of ``adamw_mode``: decoupled weight decay (AdamW) when True."""
        return self.adamw_mode

    @adam_w_mode.setter
    def adam_w_mode(self, value: bool) -> None:
        self.adamw_mode = bool(value)
        for group in getattr(self, "param_groups", []):
            group["adamw_mode"] = bool(value)

    def _subgroup_param(self, what: str):
        """The one parameter with a gradient that a sub-group call works on."""
        with_grad = [(g, p) for g in self.param_groups for p in g["params"] if p.grad is not None]
        if len(with_grad) != 1:
            raise ValueError(f"{what} updates one flat sub-group parameter (DeepSpeed's ZeRO sub-groups); "
                             f"{len(with_grad)} parameters have a gradient. Use step() for ordinary "
                             f"parameter lists.")
        return with_grad[0]

    @torch.no_grad()
    def step_subgroup(self, subgroup_id: int, closure=None):
        """One Adam step of the sub-group ``subgroup_id``: the single parameter that has a
        gradient, with its state kept under ``self.state[subgroup_id]`` (DeepSpeed keys
        sub-group states this way, so several sub-groups can share one optimizer whose
        parameter is swapped in turn)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group, p = self._subgroup_param("step_subgroup")
        self._check_param(p)
        state = self.state[subgroup_id]
        if len(state) == 0:
            self._init_state(group, p, state)
        self._update(group, p, p.grad.contiguous(), state, None, 1.0)
        return loss

    @torch.no_grad()
    def rollback_subgroup(self, sub_group_id: int, closure=None):
        """Undoes the last ``step_subgroup(sub_group_id)`` given the same gradient: the
        parameter and the moments return to their values before that step, computed in
        float64 and rounded to each tensor's dtype (so exact up to that rounding: about 1e-7
        relative for fp32, the last bit of a bf16/fp16 parameter), and the step count goes back
        by one. Undoes AdamW steps (adamw_mode, DeepSpeed's rollback is AdamW's too) with fp32
        states; the parameter may be fp32, bf16 or fp16. DeepSpeed's own rollback handles fp32
        parameters only (others only lose a step count, with a printed error)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        state = self.state.get(sub_group_id) if sub_group_id in self.state else None
        if not state:  # (DeepSpeed's messages, which scripts and its tests match)
            raise RuntimeError(f"Cannot rollback optimizer state for sub_group_id {sub_group_id} as it has not "
                               f"been initialized (no step_subgroup({sub_group_id}) yet).")
        step = int(state.get("step", 0))
        if step <= 0:
            raise RuntimeError(f"Cannot rollback sub_group_id {sub_group_id}: step count is {step}")
        group, p = self._subgroup_param("rollback_subgroup")
        if state["exp_avg"].dtype != torch.float32 or state["exp_avg_sq"].dtype != torch.float32:
            raise TypeError(
                f"rollback_subgroup: the optimizer states are {state['exp_avg'].dtype}; a rollback needs fp32 states "
                f"(fp32_optimizer_states=True, state_dtype fp32): undoing a step subtracts the gradient's share "
                f"from the stored moments, and their rounding in a narrower type would leave errors as large as the "
                f"moments themselves")
        if not group.get("adamw_mode", self.adamw_mode):
            raise ValueError("rollback_subgroup undoes AdamW steps (adamw_mode=True) only")
        b1, b2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        bc1 = 1.0 - b1 ** step if group["bias_correction"] else 1.0
        bc2 = 1.0 - b2 ** step if group["bias_correction"] else 1.0
        m = state["exp_avg"].double()
        v = state["exp_avg_sq"].double()
        g = p.grad.double().view(m.shape)
        update = (m / bc1) / ((v / bc2).sqrt() + eps)
        before = (p.double().view(m.shape) + lr * update) / (1.0 - lr * wd)
        p.copy_(before.view(p.shape))  # (copy_ rounds to each tensor's dtype)
        state["exp_avg"].copy_((m - (1.0 - b1) * g) / b1)
        state["exp_avg_sq"].copy_(((v - (1.0 - b2) * g * g) / b2).clamp_(min=0.0))
        state["step"] = step - 1
        return loss


class DeepSpeedCPULion(CPULion):
    """DeepSpeed's ``DeepSpeedCPULion(model_params, lr=1e-3, betas=(0.9, 0.999),
    weight_decay=0, fp32_optimizer_states=True)`` run by zspeed's C kernel.
    ``fp32_optimizer_states=False`` keeps the momentum of bf16 parameters in bf16, as
    DeepSpeed keeps it in the parameter's dtype; the kernel has no fp16 momentum, so fp16
    and fp32 parameters keep an fp32 momentum."""

    def __init__(self, model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0,
                 fp32_optimizer_states=True, num_threads=None):
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        super().__init__(model_params, lr=lr, betas=betas, weight_decay=weight_decay, num_threads=num_threads)

    def _init_state(self, group, p, state):
        dtype = torch.bfloat16 if (not self.fp32_optimizer_states and p.dtype == torch.bfloat16) else torch.float32
        state["exp_avg"] = torch.zeros(p.shape, dtype=dtype)


class DeepSpeedCPUAdagrad(CPUAdagrad):
    """DeepSpeed's ``DeepSpeedCPUAdagrad(model_params, lr=1e-2, eps=1e-10, weight_decay=0,
    amsgrad=False, fp32_optimizer_states=True)`` run by zspeed's C kernel (zspeed's extra
    keywords: ``initial_accumulator_value`` and ``num_threads``). ``fp32_optimizer_states=False``
    keeps the sum of bf16 parameters in bf16, as DeepSpeed keeps it in the parameter's dtype;
    the kernel has no fp16 sum, so fp16 and fp32 parameters keep an fp32 sum. amsgrad (which
    Adagrad does not have; DeepSpeed's kernel ignores it) is refused."""

    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False,
                 fp32_optimizer_states=True, initial_accumulator_value=0, num_threads=None):
        if amsgrad:
            raise ValueError("DeepSpeedCPUAdagrad: amsgrad is an Adam variant; Adagrad has none (use amsgrad=False)")
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        super().__init__(model_params, lr=lr, weight_decay=weight_decay, eps=eps,
                         initial_accumulator_value=initial_accumulator_value, num_threads=num_threads)

    def _init_state(self, group, p, state):
        super()._init_state(group, p, state)
        if not self.fp32_optimizer_states and p.dtype == torch.bfloat16:
            state["sum"] = state["sum"].to(torch.bfloat16)


class _RunsAs(type):
    """Metaclass of FusedAdam: the engine's device Adam/AdamW is torch's (fused on the GPU, the
    same update as FusedAdam's with bias correction), marked ``_runs_as = FusedAdam``, so that
    ``isinstance(engine.optimizer.optimizer, FusedAdam)`` holds as in DeepSpeed."""

    def __instancecheck__(cls, obj):
        return type.__instancecheck__(cls, obj) or getattr(obj, "_runs_as", None) is cls


def runs_as_fused_adam(opt: torch.optim.Optimizer, adam_w_mode: bool) -> torch.optim.Optimizer:
    """Marks torch's Adam/AdamW ``opt`` as the engine's FusedAdam (see _RunsAs), with DeepSpeed's
    ``adam_w_mode`` attribute."""
    opt._runs_as = FusedAdam
    opt.adam_w_mode = bool(adam_w_mode)
    return opt


class FusedAdam(torch.optim.Optimizer, metaclass=_RunsAs):
    """DeepSpeed's ``FusedAdam(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
    eps=1e-8, adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True)``
    for parameters on any device, in plain torch.

    Per parameter with p of any float dtype, the arithmetic is fp32 (the moments have
    the parameter's dtype, as DeepSpeed's): with adam_w_mode,
    ``p *= 1 - lr*wd``, else ``g += wd*p``; ``m = b1*m + (1-b1)*g``,
    ``v = b2*v + (1-b2)*g*g``; ``p -= lr * (m/bc1) / (sqrt(v/bc2) + eps)`` with
    ``bc = 1 - beta**step`` (1 without bias_correction). amsgrad is refused, as in
    DeepSpeed. step() takes only a closure (DeepSpeed's deprecated arguments raise)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if not 0.0 <= lr:
            raise ValueError(f"invalid lr {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none

    @property
    def checkpoint_class(self) -> str:
        """Checkpoints record the torch class with the same state (Adam or AdamW)."""
        return "AdamW" if self.adam_w_mode else "Adam"

    def zero_grad(self, set_to_none: bool = True):
        super().zero_grad(set_to_none=bool(self.set_grad_none and set_to_none))

    @torch.no_grad()
    def step(self, closure=None, grads=None, output_params=None, scale=None, grad_norms=None, grad_scaler=None):
        if any(x is not None for x in (grads, output_params, scale, grad_norms, grad_scaler)):
            raise RuntimeError("FusedAdam.step() takes only a closure: initialize it like torch.optim.Adam and "
                               "call step() with no arguments.")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FusedAdam does not support sparse gradients, please consider SparseAdam")
                if p.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                    raise RuntimeError("FusedAdam only supports fp16, bf16 and fp32 parameters.")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = int(state["step"].item())
                w = p.float()
                g = p.grad.float()
                if self.adam_w_mode:
                    w.mul_(1.0 - lr * wd)
                elif wd:
                    g = g.add(w, alpha=wd)
                m = state["exp_avg"].float().mul_(b1).add_(g, alpha=1.0 - b1)
                v = state["exp_avg_sq"].float().mul_(b2).addcmul_(g, g, value=1.0 - b2)
                bc1 = 1.0 - b1 ** t if group["bias_correction"] else 1.0
                bc2 = 1.0 - b2 ** t if group["bias_correction"] else 1.0
                denom = (v / bc2).sqrt_().add_(eps)
                w.addcdiv_(m, denom, value=-lr / bc1)
                for dst, src in ((state["exp_avg"], m), (state["exp_avg_sq"], v)):
                    if dst.data_ptr() != src.data_ptr():  # low-precision moments: round back
                        dst.copy_(src)
                if w.data_ptr() != p.data_ptr():
                    p.copy_(w)
        return loss


class FusedLion(TorchLion):
    """DeepSpeed's ``FusedLion(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0,
    set_grad_none=True)`` in plain torch (the engine's Lion on the device, with
    DeepSpeed's defaults)."""

    checkpoint_class = "TorchLion"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, set_grad_none=True):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: bool = True):
        super().zero_grad(set_to_none=bool(self.set_grad_none and set_to_none))
