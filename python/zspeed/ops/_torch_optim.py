"""torch.optim.Optimizer front ends of the C kernels (imports torch; loaded
lazily by zspeed.ops.adam / adagrad / lion)."""
from __future__ import annotations

import copy

import torch

from .._optimizers import ALGORITHMS
from . import _kernels
from ._tensors import INT64, integer, threads

__all__ = ["CPUAdam", "CPUAdagrad", "CPULion"]

_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": None}


def _state_value(v, p: torch.Tensor):
    """A saved state value as the optimizer keeps it for ``p``: a tensor of its own (contiguous,
    on p's device), or a deep copy of anything else."""
    if not torch.is_tensor(v) and callable(getattr(v, "load", None)):  # read when used
        return v.load().detach().to(device=p.device).contiguous()
    if torch.is_tensor(v):
        return v.detach().to(device=p.device).clone().contiguous()
    return copy.deepcopy(v)


def _into(old, new):
    """A loaded state value: copied into the state tensor it replaces when that has its dtype and
    size (so states that flatten_states() laid end to end stay so), else ``new`` itself."""
    if torch.is_tensor(old) and torch.is_tensor(new) and old.dtype == new.dtype and old.numel() == new.numel() \
            and old.device == new.device:
        with torch.no_grad():
            old.copy_(new.reshape(old.shape))
        return old
    return new


def _adjacent(a: torch.Tensor, b: torch.Tensor) -> bool:
    """b starts where a ends, in the same storage, both contiguous and of one dtype."""
    return (a.dtype == b.dtype and a.is_contiguous() and b.is_contiguous()
            and a.data_ptr() + a.numel() * a.element_size() == b.data_ptr()
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _follows(a: tuple, b: tuple) -> bool:
    """Whether parameter item b (param, grad, state, out) continues item a's run: each of its
    tensors right after a's, the same state keys and the same non-tensor state (the step)."""
    (pa, ga, sa, oa), (pb, gb, sb, ob) = a, b
    if (oa is None) != (ob is None) or sa.keys() != sb.keys():
        return False
    pairs = [(pa, pb), (ga, gb)] + ([] if oa is None else [(oa, ob)])
    for k, v in sa.items():
        if torch.is_tensor(v):
            if not torch.is_tensor(sb[k]):
                return False
            pairs.append((v, sb[k]))
        elif v != sb[k]:
            return False
    return all(_adjacent(x, y) for x, y in pairs)


def _joined(ts) -> torch.Tensor:
    """One flat tensor over ``ts``, tensors that lie end to end in one storage."""
    t = ts[0]
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(),
                                                               (sum(x.numel() for x in ts),))


class _CPUOptimizer(torch.optim.Optimizer):
    """Shared step loop: grads from ``grads=`` or ``p.grad``, the optional
    low-precision copy-out, state creation, and a state_dict round trip that
    keeps the states' own dtypes (torch's load_state_dict would cast them to
    the param's dtype)."""

    # Set by zspeed's host path (runtime.optimizers.HostOptimizer): the states are laid out end to
    # end (flatten_states) at the first step or state load, whichever comes first, so that until
    # then there are none (as before any step), and afterwards runs of parameters step together.
    lay_out_states = False
    _laid_out = False

    def __init__(self, params, defaults, num_threads):
        if num_threads is not None:
            threads(num_threads)
        self.num_threads = num_threads
        super().__init__(params, defaults)

    @property
    def checkpoint_class(self) -> str:
        """The class name checkpoints record: zspeed's CPU class (the optimizer table's cpu_class)
        that this one is or derives from, so DeepSpeed's names of them (DeepSpeedCPUAdam, ...)
        save and load the same state layout."""
        names = {a.cpu_class for a in ALGORITHMS.values()}
        return next(c.__name__ for c in type(self).__mro__ if c.__name__ in names)

    # Subclasses: create the state of p; run the kernel on one tensor.
    def _init_state(self, group, p, state):
        raise NotImplementedError

    def _update(self, group, p, g, state, out, grad_scale):
        raise NotImplementedError

    @staticmethod
    def _check_param(p):
        if p.device.type != "cpu":
            raise ValueError(f"param on {p.device}: zspeed's CPU optimizers "
                             f"need CPU tensors (the fp32 master weights)")
        if p.dtype not in _PARAM_DTYPES:
            raise TypeError(f"param dtype {p.dtype} is not float32, bfloat16 "
                            f"or float16")
        if not p.is_contiguous():
            raise ValueError("param is not contiguous; optimizer params must "
                             "be contiguous tensors")

    @staticmethod
    def _pick(lists, gi, pi, what):
        if lists is None:
            return None
        try:
            return lists[gi][pi]
        except (IndexError, TypeError):
            raise ValueError(f"{what} must be a list (per param group) of lists "
                             f"(per param); missing entry [{gi}][{pi}]") from None

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None, *, grads=None,
             grad_scale=1.0):
        """One optimizer step over every param that has a gradient.

        closure: re-evaluates the model and returns the loss (run with
          gradients enabled), as in torch.
        fp16_param_groups: optional list (per param group) of lists of
          contiguous bf16/fp16 CPU tensors with each param's numel; they
          receive the updated weights in the same pass (DeepSpeed's meaning).
        grads: optional list (per group) of lists (per param) of contiguous
          CPU tensors (fp32/bf16/fp16, same numel as the param) used instead
          of p.grad (torch forbids a bf16 .grad on an fp32 param); None
          entries are skipped.
        grad_scale: every gradient is multiplied by this first
          (1/loss_scale times the clipping coefficient).
        Params without a gradient are skipped, as torch does."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.lay_out_states and not self._laid_out:
            self.flatten_states()
        for gi, group in enumerate(self.param_groups):
            run: list = []  # consecutive parameters whose tensors lie end to end: one kernel call
            for pi, p in enumerate(group["params"]):
                g = self._pick(grads, gi, pi, "grads") if grads is not None else p.grad
                if g is None:
                    self._run(group, run, grad_scale)
                    run = []
                    continue
                self._check_param(p)
                if g.is_sparse:
                    raise TypeError("sparse gradients are not supported")
                if g.numel() != p.numel():
                    raise ValueError(f"gradient [{gi}][{pi}] has {g.numel()} "
                                     f"elements, its param {p.numel()}")
                out = self._pick(fp16_param_groups, gi, pi, "fp16_param_groups")
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(group, p, state)
                item = (p, g.contiguous(), state, out)
                if run and not _follows(run[-1], item):
                    self._run(group, run, grad_scale)
                    run = []
                run.append(item)
            self._run(group, run, grad_scale)
        return loss

    def _run(self, group, run: list, grad_scale) -> None:
        """The kernel over ``run``'s parameters, (param, grad, state, out) each, whose tensors
        lie end to end (:func:`_follows`): one call over the joined ranges, the same update
        element by element as one call per parameter (the kernels are elementwise)."""
        if len(run) == 1:
            self._update(group, *run[0][:3], run[0][3], grad_scale)
        elif run:
            ps, gs, states, outs = zip(*run)
            merged = {k: _joined([st[k] for st in states]) if torch.is_tensor(v) else v
                      for k, v in states[0].items()}
            self._update(group, _joined(ps), _joined(gs), merged, None if outs[0] is None else _joined(outs),
                         grad_scale)
            for st in states:  # the step counter (the same for every parameter of a run)
                st.update((k, v) for k, v in merged.items() if not torch.is_tensor(v))

    @torch.no_grad()
    def flatten_states(self) -> None:
        """Every parameter's state made now, each per-element state tensor a view of one buffer
        per group and key, in parameter order (an existing state is copied in), so that step()
        runs parameters whose weights, gradients and outputs also lie end to end (zspeed's host
        buffers do) as one kernel call. A group whose states have per-block scales (int8) keeps
        a tensor per parameter. Host memory holds one parameter's state beside the buffers at
        most while this runs."""
        for group in self.param_groups:
            ps = group["params"]
            if not ps:
                continue
            first: dict = dict(self.state[ps[0]]) or {}
            if not first:
                self._init_state(group, ps[0], first)
            keys = [k for k, v in first.items() if torch.is_tensor(v)]
            if any(k.endswith("_scale") for k in keys) or any(first[k].numel() != ps[0].numel() for k in keys):
                continue
            total = sum(p.numel() for p in ps)
            flats = {k: torch.empty(total, dtype=first[k].dtype) for k in keys}
            at = 0
            for i, p in enumerate(ps):
                st = self.state[p]
                src = first if i == 0 else (st if len(st) else None)
                if src is None:
                    src = {}
                    self._init_state(group, p, src)
                n = p.numel()
                new = {k: v for k, v in src.items() if not torch.is_tensor(v)}
                for k in keys:
                    view = flats[k][at:at + n].view(p.shape)
                    view.copy_(src[k].reshape(p.shape))
                    new[k] = view
                self.state[p] = new
                at += n
        self._laid_out = True

    def load_state_dict(self, state_dict):
        """torch's load_state_dict of the param groups, then the saved states
        are put in place with their saved dtypes (bf16 and 8-bit states stay
        as they were), one parameter at a time. A state value may also be a
        tensor read when used (zspeed's checkpoint loads: an object with a
        ``load()`` method and no tensor data); what it reads is kept as is."""
        saved = state_dict["state"]
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        # torch would copy (and cast) every state tensor first: the states are taken below, into
        # the tensors they replace where those match (flatten_states' buffers stay end to end).
        if self.lay_out_states and not self._laid_out:
            self.flatten_states()  # (the loaded values are copied into these states below)
        had = {p: dict(st) for p, st in self.state.items()}
        super().load_state_dict({**state_dict, "state": {}})
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(ids, params):
            if pid in saved:
                have = had.get(p, {})
                self.state[p] = {k: _into(have.get(k), _state_value(v, p)) for k, v in saved[pid].items()}


class CPUAdam(_CPUOptimizer):
    """AdamW / Adam whose step runs in libzspeed (SIMD, multithreaded).

    Signature-compatible with DeepSpeedCPUAdam:
    ``CPUAdam(model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
    eps=1e-8, weight_decay=0, amsgrad=False, adamw_mode=True,
    fp32_optimizer_states=True, state_dtype="fp32", num_threads=None)``.

    adamw_mode=True is torch.optim.AdamW, False is torch.optim.Adam (L2
    decay). amsgrad=True is refused. state_dtype: "fp32", "bf16" (rounded to
    nearest even) or "int8" (blockwise 8-bit exp_avg/exp_avg_sq with fp32
    per-256-element scales; about 2 bytes per param instead of 8).
    fp32_optimizer_states=False selects bf16 states when state_dtype is left
    at "fp32" (DeepSpeed keeps states in the param's low precision then).
    num_threads: None = the default pool (all cores; ZSPEED_NUM_THREADS
    overrides), else at most that many threads.
    Params: contiguous CPU fp32 tensors (master weights); bf16/fp16 params are
    updated in place too. State keys: step (int), exp_avg, exp_avg_sq (+
    exp_avg_scale, exp_avg_sq_scale for int8)."""

    def __init__(self, model_params, lr=1e-3, bias_correction=True,
                 betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False,
                 adamw_mode=True, fp32_optimizer_states=True,
                 state_dtype="fp32", num_threads=None):
        if amsgrad:
            raise ValueError("CPUAdam does not implement amsgrad; use "
                             "amsgrad=False")
        if state_dtype not in _STATE_DTYPES:
            raise ValueError(f"state_dtype = {state_dtype!r}; expected 'fp32', "
                             f"'bf16' or 'int8'")
        if not fp32_optimizer_states and state_dtype == "fp32":
            state_dtype = "bf16"
        if not 0.0 <= lr:
            raise ValueError(f"invalid lr {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, bias_correction=bias_correction,
                        amsgrad=False, adamw_mode=adamw_mode,
                        state_dtype=state_dtype)
        self.adamw_mode = adamw_mode
        self.fp32_optimizer_states = fp32_optimizer_states
        super().__init__(model_params, defaults, num_threads)

    def _init_state(self, group, p, state):
        sd = group.get("state_dtype", "fp32")
        state["step"] = 0
        if sd == "int8":
            nb = _kernels.qblocks(p.numel())
            state["exp_avg"] = torch.zeros(p.shape, dtype=torch.int8)
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.uint8)
            state["exp_avg_scale"] = torch.zeros(nb, dtype=torch.float32)
            state["exp_avg_sq_scale"] = torch.zeros(nb, dtype=torch.float32)
        else:
            dt = _STATE_DTYPES[sd]
            state["exp_avg"] = torch.zeros(p.shape, dtype=dt)
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=dt)

    def _update(self, group, p, g, state, out, grad_scale):
        step = integer(state["step"], "state['step']", 0, INT64[1] - 1) + 1
        b1, b2 = group["betas"]
        _kernels.adam(p, g, state["exp_avg"], state["exp_avg_sq"], step=step,
                      lr=group["lr"], beta1=b1, beta2=b2, eps=group["eps"],
                      weight_decay=group["weight_decay"],
                      adamw_mode=group.get("adamw_mode", self.adamw_mode),
                      bias_correction=group["bias_correction"],
                      grad_scale=grad_scale, out=out,
                      exp_avg_scale=state.get("exp_avg_scale"),
                      exp_avg_sq_scale=state.get("exp_avg_sq_scale"),
                      num_threads=self.num_threads)
        state["step"] = step


class CPUAdagrad(_CPUOptimizer):
    """torch.optim.Adagrad (lr_decay must be 0) running in libzspeed.

    ``CPUAdagrad(model_params, lr=1e-2, lr_decay=0, weight_decay=0,
    initial_accumulator_value=0, eps=1e-10, num_threads=None)``; state keys
    step (int) and sum (fp32), as torch's. num_threads: None = the default
    pool (all cores)."""

    def __init__(self, model_params, lr=1e-2, lr_decay=0, weight_decay=0,
                 initial_accumulator_value=0, eps=1e-10, num_threads=None):
        if lr_decay != 0:
            raise ValueError(f"lr_decay = {lr_decay} is not supported; use 0 "
                             f"and an LR scheduler")
        if not 0.0 <= lr:
            raise ValueError(f"invalid lr {lr}")
        defaults = dict(lr=lr, lr_decay=0, weight_decay=weight_decay, eps=eps,
                        initial_accumulator_value=initial_accumulator_value)
        super().__init__(model_params, defaults, num_threads)

    def _init_state(self, group, p, state):
        state["step"] = 0
        state["sum"] = torch.full(p.shape, float(group["initial_accumulator_value"]),
                                  dtype=torch.float32)

    def _update(self, group, p, g, state, out, grad_scale):
        _kernels.adagrad(p, g, state["sum"], lr=group["lr"],
                         lr_decay=group["lr_decay"],
                         weight_decay=group["weight_decay"], eps=group["eps"],
                         grad_scale=grad_scale, out=out,
                         num_threads=self.num_threads)
        state["step"] = integer(state["step"], "state['step']", 0, INT64[1] - 1) + 1


class CPULion(_CPUOptimizer):
    """Lion (Chen et al. 2023) running in libzspeed.

    ``CPULion(model_params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0,
    num_threads=None)``; state key exp_avg (fp32). num_threads: None = the
    default pool (all cores)."""

    def __init__(self, model_params, lr=1e-4, betas=(0.9, 0.99),
                 weight_decay=0, num_threads=None):
        if not 0.0 <= lr:
            raise ValueError(f"invalid lr {lr}")
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        super().__init__(model_params, defaults, num_threads)

    def _init_state(self, group, p, state):
        state["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32)

    def _update(self, group, p, g, state, out, grad_scale):
        b1, b2 = group["betas"]
        _kernels.lion(p, g, state["exp_avg"], lr=group["lr"], beta1=b1,
                      beta2=b2, weight_decay=group["weight_decay"],
                      grad_scale=grad_scale, out=out,
                      num_threads=self.num_threads)
