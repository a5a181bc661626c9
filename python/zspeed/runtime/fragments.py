"""One parameter's fp32 master, gradient and optimizer state, wherever the engine keeps them
(DeepSpeed's tensor-fragment API: ``zspeed.utils.safe_get_full_fp32_param`` and its siblings
are thin calls into :class:`Fragments`).

The optimizer path (paths.py) keeps each of the three per entry of its layout: whole
parameters, or, when it steps a store's local space (several ranks at stages 1-2, ZeRO-3 on
any number of ranks), this rank's pieces of them (store.py ``pieces``). A parameter's "full"
value is assembled from its entries: with pieces over several ranks each rank fills the
elements it holds into zeros and one all-reduce adds them up (a collective: every rank calls
it, for the same parameters in the same order). Its "local" value (ZeRO-3) is this rank's
pieces of it, one after another.

What is read and written, and when it is valid:

- the fp32 master: at any time after ``initialize`` (a step under way finishes first). A write
  also refreshes the model's weights from the masters (the next forward sees it).
- the gradient inside ``engine.no_sync()`` (ZeRO stages 0-1): this rank's gradient accumulated
  by the backwards so far, not reduced over the ranks (nothing is, inside the block), the
  fp16 loss scale divided out (fp32 for fp16, else the gradient's dtype); None for a parameter
  that got none. A write replaces it; the first boundary backward after the block adds to it
  and reduces the sum. (DeepSpeed returns the parameter's ``.grad`` itself, the loss scale in it.)
- the gradient: after the backward of an accumulation boundary and before ``step()``. It is
  the gradient as the step applies it before clipping: averaged over the ranks (with
  ``gradient_allreduce_op`` "mean") and the micro-batches, the fp16 loss scale divided out,
  in the dtype the step keeps it in (the model's, or fp32 where the path reduces into fp32;
  fp32 for fp16 too, where the unscaled values of small gradients would leave fp16's range).
  The first read or write collects the gradients where the step reads them (what
  ``step()`` would do first); a write is what the step then uses, its global norm and
  overflow check included.
- the optimizer state (``"exp_avg"``, ``"exp_avg_sq"``, Adagrad's ``"sum"``...): once the
  optimizer holds state for the parameter (after the first step; None before), as fp32
  whatever ``state_dtype`` keeps (8-bit and bf16 states are written rounded to it).

Writing a master or a state rebuilds the path's whole copy of it (``load_masters`` /
``load_state_dict``: linear in the model's size, one call per parameter): these are debugging
and surgery tools, not a training-loop API.
"""
from __future__ import annotations

import math
import weakref

import torch

from .errors import FragmentError, NotPartitionedError
from .optimizers import adam_state_dtype, convert_adam_state
from .store import full_numel, full_shape

__all__ = ["Fragments", "attach", "fragments_of"]

# id(parameter) -> (weak reference to the parameter, weak reference to its engine's Fragments).
# Kept here, not as an attribute of the parameter, so that modules still deep-copy and pickle.
_BY_PARAM: dict = {}


class EngineCalls:
    """The engine's own methods the fragments call (ZSpeedEngine passes weak method references:
    the registry must not keep an engine alive): check_open(), settle(), collect_grads(what),
    local_backward() (None, "no_sync" or "coalesce_grad_reduction") and sum_over_ranks(sumsq,
    nonfinite) (the gradient statistics of this rank's part added over the ranks that share the
    step)."""

    def __init__(self, **methods):
        self._methods = methods

    def __getattr__(self, name):
        try:
            ref = self.__dict__["_methods"][name]
        except KeyError:
            raise AttributeError(name) from None
        fn = ref()
        if fn is None:
            raise RuntimeError("the engine of these parameters no longer exists")
        return fn


def attach(engine, params, *, layout, stage3: bool, calls: EngineCalls) -> "Fragments":
    """A Fragments for ``engine`` (whose ``layout`` of the trained parameters, ZeRO-3 switch and
    own ``calls`` it is given), reachable from each of ``params`` (the trained ones); the engine
    keeps it (the registry holds weak references only)."""
    f = Fragments(engine, layout, stage3, calls)
    ref = weakref.ref(f)
    for p in params:
        key = id(p)
        _BY_PARAM[key] = (weakref.ref(p, lambda _r, key=key: _BY_PARAM.pop(key, None)), ref)
    return f


def fragments_of(p) -> "Fragments | None":
    """The Fragments of the live engine that trains ``p``, or None (frozen, or no engine)."""
    got = _BY_PARAM.get(id(p))
    if got is None or got[0]() is not p:
        return None
    f = got[1]()
    if f is None or f.engine is None or not p.requires_grad:
        return None
    return f


class _WholeEntries:
    """A path over whole parameters: one entry per parameter, the same on every rank."""

    spread = False  # (a full value needs no sum over the ranks)

    def __init__(self, engine, layout):
        self._numels = layout.numels
        starts, at = [], 0
        for ps in layout.params:
            starts.append(at)
            at += len(ps)
        self._start = starts  # running index of each group's first parameter (the state_dict's keys)

    def entries(self, gi: int, pi: int) -> list:
        return [(pi, 0, self._numels[gi][pi])]

    def check_writable(self) -> None:
        pass

    def states(self, path) -> list:
        st = path.optimizer.state_dict()["state"]
        return [[st.get(self._start[gi] + pi) for pi in range(len(ps))] for gi, ps in enumerate(path.layout.params)]

    def state_dict(self, path, rows: list) -> dict:
        sd = path.optimizer.state_dict()
        sd["state"] = {self._start[g] + i: st for g, row in enumerate(rows) for i, st in enumerate(row)
                       if st is not None}
        return sd


class _PieceEntries:
    """A path over a store's local space: a parameter's entries are this rank's pieces of it."""

    def __init__(self, engine, layout):
        self.sm = engine.optimizer_path.sharded
        self.spread = engine.world_size > 1  # (the ranks' pieces are summed into a full value)

    def entries(self, gi: int, pi: int) -> list:
        return [(ei, pc.offset, n) for ei, (pc, _at, n) in enumerate(self.sm.pieces[gi])
                if pc is not None and pc.param == pi]

    def check_writable(self) -> None:
        self.sm.check_writable()

    def states(self, path) -> list:
        return path.param_states()

    def state_dict(self, path, rows: list) -> dict:
        return path.state_dict_from(rows, path.optimizer.state_dict()["param_groups"])


_ENTRIES = {False: _WholeEntries, True: _PieceEntries}  # by whether the path steps a store's pieces


class Fragments:
    """The per-parameter views of one engine (see the module docstring)."""

    def __init__(self, engine, layout, stage3: bool, calls: EngineCalls):
        self._engine = weakref.ref(engine)
        self._calls = calls
        self._key = dict(layout.index)    # id(parameter) -> (group, index)
        self._of = _ENTRIES[engine.optimizer_path.sharded is not None](engine, layout)
        self._local_api = stage3           # the safe_*_local_* calls serve ZeRO-3 only

    @property
    def engine(self):
        return self._engine()

    # -- where a parameter's entries are ---------------------------------------------------------
    def _where(self, p) -> tuple:
        e = self.engine
        self._calls.check_open()
        key = self._key.get(id(p))
        if key is None:
            raise FragmentError("this parameter is not one the engine trains (was it added after "
                                "zspeed.initialize?)")
        return e, key

    def _entries(self, e, gi: int, pi: int) -> list:
        """(entry index in the path's row of group gi, first element in the parameter, length)."""
        return self._of.entries(gi, pi)

    def _across_ranks(self, e) -> bool:
        """Whether the entries of a parameter are spread over the ranks (a full value is summed)."""
        return self._of.spread

    def _assemble(self, e, p, gi, pi, rows, dtype, factor: float = 1.0) -> torch.Tensor:
        n = full_numel(p)
        dev = e.collectives.device if self._across_ranks(e) else e.device
        out = torch.zeros(n, dtype=torch.float32, device=dev)
        for ei, off, k in self._entries(e, gi, pi):
            src = rows[gi][ei]
            if src is not None:
                out[off:off + k].copy_(src.reshape(-1)[:k].to(torch.float32))
        if self._across_ranks(e):
            e.collectives.all_reduce(out)
        if factor != 1.0:
            out.mul_(factor)
        return out.to(e.device, dtype).view(full_shape(p))

    def _local(self, e, gi, pi, rows, dtype, factor: float = 1.0) -> torch.Tensor:
        parts = [rows[gi][ei].reshape(-1)[:k].to(e.device, torch.float32) for ei, _off, k in self._entries(e, gi, pi)]
        out = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32, device=e.device)
        if factor != 1.0:
            out = out * factor
        return out.to(dtype)

    def _local_numel(self, e, gi, pi) -> int:
        return sum(k for _ei, _off, k in self._entries(e, gi, pi))

    @staticmethod
    def _value(value, shape_or_numel, what: str, p_shape) -> torch.Tensor:
        """``value`` flattened, after checking it has the elements it must."""
        if not torch.is_tensor(value):
            raise FragmentError(f"{what}: the value must be a tensor, got {type(value).__name__}")
        want = shape_or_numel if isinstance(shape_or_numel, int) else int(torch.Size(shape_or_numel).numel())
        if value.numel() != want:
            raise FragmentError(f"{what}: the value has {value.numel()} elements (shape {tuple(value.shape)}), the "
                                f"{'local partition' if isinstance(shape_or_numel, int) else 'parameter'} "
                                f"{want} (shape {tuple(p_shape)})")
        return value.detach().reshape(-1)

    def _begin(self, p, op: str, local: bool, value=None) -> tuple:
        """(engine, group, index, the call's name, ``value`` checked and flat or None) for the
        call ``safe_<op>`` with "full" or "local" in its "{}"."""
        e, (gi, pi) = self._where(p)
        what = "safe_" + op.format("local" if local else "full")
        if local:
            self._require_stage3(e, what)
        if value is not None:
            value = self._value(value, self._local_numel(e, gi, pi) if local else full_shape(p), what,
                                full_shape(p))
        return e, gi, pi, what, value

    @staticmethod
    def _slices(v, entries: list, local: bool):
        """(entry, length, the part of flat ``v`` it takes) per entry: a local value holds the
        entries one after another, a full one at their offsets in the parameter."""
        at = 0
        for ei, off, k in entries:
            yield ei, k, (v[at:at + k] if local else v[off:off + k])
            at += k

    def _require_stage3(self, e, what: str) -> None:
        if not self._local_api:
            raise NotPartitionedError(f"{what} is defined for ZeRO-3 partitioned parameters only (this engine "
                                      f"runs ZeRO stage {e.zero_optimization_stage()}); use the safe_*_full_* "
                                      f"functions")

    # -- fp32 masters ------------------------------------------------------------------------------
    def get_fp32(self, p, local: bool = False) -> torch.Tensor:
        e, gi, pi, _what, _ = self._begin(p, "get_{}_fp32_param", local)
        self._calls.settle()
        rows = e.optimizer_path.masters()
        return self._local(e, gi, pi, rows, torch.float32) if local else \
            self._assemble(e, p, gi, pi, rows, torch.float32)

    def set_fp32(self, p, value, local: bool = False) -> None:
        e, gi, pi, _what, v = self._begin(p, "set_{}_fp32_param", local, value)
        self._calls.settle()
        path = e.optimizer_path
        self._of.check_writable()
        rows = [list(r) for r in path.masters()]
        for ei, _k, src in self._slices(v, self._entries(e, gi, pi), local):
            m = rows[gi][ei]
            rows[gi][ei] = src.to(m.device, torch.float32).reshape(m.shape).clone()
        path.load_masters(rows)

    # -- gradients ---------------------------------------------------------------------------------
    def _grad_rows(self, e, what: str) -> list:
        self._calls.collect_grads(what)
        return e.optimizer_path.grad_rows()

    def _grad_factor(self, e) -> float:
        """Stored gradient * this = the gradient the docstring describes."""
        return 1.0 / (e.loss_scaler.loss_scale * e.plan.grad_divisor)

    def norm_groups(self, what: str) -> list:
        """Per parameter group, one fp32 scalar tensor on the engine's device: the L2 norm of its
        gradients as :meth:`get_grad` reads them (over every rank; a collective with several)."""
        e = self.engine
        rows = self._grad_rows(e, what)
        factor = self._grad_factor(e)
        out = []
        for row in rows:
            sumsq = sum(float(g.detach().double().square().sum()) for g in row if g is not None)
            sumsq, _ = self._calls.sum_over_ranks(sumsq * factor * factor, False)
            out.append(torch.tensor(math.sqrt(sumsq), dtype=torch.float32, device=e.device))
        return out

    def _in_no_sync(self, e) -> bool:
        """Inside engine.no_sync() (ZeRO stages 0-1): each rank's gradients accumulate unreduced
        in the parameters' .grad, where the tensor-fragment API reads and writes them."""
        return self._calls.local_backward() == "no_sync"

    def get_grad(self, p, local: bool = False) -> torch.Tensor:
        e, gi, pi, what, _ = self._begin(p, "get_{}_grad", local)
        if self._in_no_sync(e):  # this rank's accumulation so far, the loss scale divided out
            g = p.grad
            if g is None:
                return None
            return g.to(torch.float32 if g.dtype == torch.float16 else g.dtype) / e.loss_scaler.loss_scale
        rows = self._grad_rows(e, what)
        dtype = next((rows[gi][ei].dtype for ei, _o, _k in self._entries(e, gi, pi) if rows[gi][ei] is not None),
                     e.dtype)
        if dtype == torch.float16:  # unscaled, small gradients would fall below fp16's range
            dtype = torch.float32
        f = self._grad_factor(e)
        return self._local(e, gi, pi, rows, dtype, f) if local else self._assemble(e, p, gi, pi, rows, dtype, f)

    def set_grad(self, p, value, local: bool = False) -> None:
        e, gi, pi, what, v = self._begin(p, "set_{}_grad", local, value)
        if self._in_no_sync(e):  # replaces this rank's accumulation so far
            with torch.no_grad():
                g = (v.to(p.device, torch.float32) * e.loss_scaler.loss_scale).view(p.shape)
                if p.grad is None:
                    p.grad = g.to(p.dtype)
                else:
                    p.grad.copy_(g)
            return
        rows = self._grad_rows(e, what)
        scale = 1.0 / self._grad_factor(e)
        with torch.no_grad():
            for ei, k, src in self._slices(v, self._entries(e, gi, pi), local):
                dst = rows[gi][ei]
                if dst is None:
                    dst = e.optimizer_path.grad_rows(create=(gi, ei))[gi][ei]
                src = src.to(dst.device, torch.float32)
                if scale != 1.0:
                    src = src * scale
                if dst.numel() == k:  # a whole parameter's gradient (any strides)
                    dst.copy_(src.view(dst.shape))
                else:                 # a piece: a flat view of the path's buffer
                    dst.view(-1)[:k].copy_(src)
        e.optimizer_path.grads_edited()

    # -- optimizer state ---------------------------------------------------------------------------
    def _states(self, e) -> list:
        """Per group, per entry of the path's layout: the optimizer's state dict, or None."""
        return self._of.states(e.optimizer_path)

    @staticmethod
    def _fp32_state(st: dict, n: int) -> dict:
        return convert_adam_state(st, "fp32", n, (n,)) if "exp_avg" in st and "exp_avg_sq" in st else st

    def _state_rows(self, e, gi: int, pi: int, key: str, what: str) -> tuple[list, bool]:
        """(the path's state rows with the entries of parameter (gi, pi) replaced by their ``key``
        as flat fp32 tensors, None where the optimizer holds no state yet; whether any has one)."""
        rows = [list(r) for r in self._states(e)]
        got = False
        for ei, _off, k in self._entries(e, gi, pi):
            st = rows[gi][ei]
            rows[gi][ei] = None
            if st:
                rows[gi][ei] = self._per_element(st, key, k, what).reshape(-1)
                got = True
        return rows, got

    def _per_element(self, st: dict, key: str, k: int, what: str) -> torch.Tensor:
        fp = self._fp32_state(st, k)
        t = fp.get(key)
        if not torch.is_tensor(t) or t.numel() != k:
            raise FragmentError(f"{what}: the optimizer keeps no per-element state {key!r} for this parameter "
                                f"(its state holds: {', '.join(sorted(fp))})")
        return t

    def get_state(self, p, key: str, local: bool = False) -> torch.Tensor | None:
        e, gi, pi, what, _ = self._begin(p, "get_{}_optimizer_state", local)
        self._calls.settle()
        rows, got = self._state_rows(e, gi, pi, key, what)
        if self._across_ranks(e) and not local:
            # Every rank takes part in the sum, also one whose pieces have no state yet (or none).
            have = torch.tensor([1.0 if got else 0.0], dtype=torch.float64, device=e.collectives.device)
            e.collectives.all_reduce(have)
            got = float(have) > 0
        if local and not self._entries(e, gi, pi):
            # This rank holds none of the parameter's elements (a small parameter on many ranks):
            # its part is empty, once the optimizer has state at all, as DeepSpeed's (not None).
            got = any(st for row in self._states(e) for st in row)
        if not got:
            return None
        return self._local(e, gi, pi, rows, torch.float32) if local else \
            self._assemble(e, p, gi, pi, rows, torch.float32)

    def set_state(self, p, value, key: str, local: bool = False) -> None:
        e, gi, pi, what, v = self._begin(p, "set_{}_optimizer_state", local, value)
        self._calls.settle()
        path = e.optimizer_path
        rows = self._states(e)
        entries = self._entries(e, gi, pi)
        if entries and any(not rows[gi][ei] for ei, _o, _k in entries):
            raise FragmentError(f"{what}: the optimizer holds no state for this parameter yet (it is created by the "
                                f"first optimizer step); set it after engine.step()")
        if not entries:  # this rank holds nothing of it (ZeRO-3 on several ranks)
            return
        new = [list(r) for r in rows]
        for ei, k, src in self._slices(v, entries, local):
            st = rows[gi][ei]
            have = adam_state_dtype(st) if "exp_avg" in st and "exp_avg_sq" in st else None
            self._per_element(st, key, k, what)
            fp = dict(self._fp32_state(st, k))
            old = fp[key]
            fp[key] = src.to(old.device, old.dtype).reshape(old.shape).clone()
            new[gi][ei] = convert_adam_state(fp, have, k, tuple(st["exp_avg"].shape)) if have not in (None, "fp32") \
                else fp
        path.optimizer.load_state_dict(self._of.state_dict(path, new))
