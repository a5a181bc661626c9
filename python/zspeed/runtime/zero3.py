"""ZeRO stage 3: parameters partitioned across ranks, and offloaded to host memory.

Every trainable parameter is a unit of its own in the partition plan (partition.py):
it is padded to a multiple of ``world_size * 256`` elements and rank r holds shard r
of it. A rank's shards of a parameter group lie one after another in one flat tensor
in the model's dtype, the *local space* of dp.py: on the GPU (offload_param none) or in
page-locked host memory (offload_param cpu). The optimizer paths step that local space
exactly as they step a rank's shards at stages 1 and 2, so with offload_optimizer cpu
the CPU optimizer writes its new bf16/fp16 weights straight into the host shards.

Between uses a parameter holds no data (``p.data`` is an empty tensor; ``p.ds_shape``
and ``p.ds_numel`` keep its real size). :class:`ParamFetcher` materializes it on the
device for the modules that use it:

  forward   a pre-hook on each module with parameters gathers them (host-to-device
            copy, with several ranks an all-gather of the shards) on a side stream,
            and the module's kernels wait for an event; a post-hook releases them.
  backward  a hook on the module's outputs gathers them again before the module's
            backward runs; a parameter is released once its gradient is accumulated
            (autograd calls that once, after every use), and the gradient goes to the
            reducer (dp.GradReducer), which reduce-scatters it into the rank's shard of
            the gradient (host memory with offload_optimizer) during backward.
  prefetch  the order in which the first forward needed the parameters is recorded;
            later forwards gather the next ones ahead (up to
            stage3_prefetch_bucket_size elements and stage3_max_live_parameters
            elements materialized in all), and backward the previous ones.
  persistence
            parameters of at most stage3_param_persistence_threshold elements stay
            materialized once gathered (they are re-gathered after each optimizer
            step); their memory is small and their gathers would be latency-bound.

A parameter used outside the forward of a module that owns it (a tied LM head
written as ``x @ self.embed.weight.t()``) is found by a torch function mode that is
active during the model's forward: the first touch gathers it, and it is recorded as
an external parameter of the innermost module running, so later forwards gather it
with that module (DeepSpeed's register_external_parameter does the same by hand).

Collectives are issued in the order the model runs, which is the same on every
rank for the same model and inputs; a model whose control flow differs between
ranks would deadlock, as it would under DeepSpeed.
"""
from __future__ import annotations

import contextlib
import logging
import weakref

import torch
from torch.overrides import TorchFunctionMode

from .collectives import Collectives
from .hooks import ZERO3_COPY_MESSAGE, ZeRO3CopyError
from .store import ParamStore, full_numel, full_shape  # noqa: F401 - full_* are this module's names too
from .streams import streams_for
from .zero3_order import AccessOrder
from .param_status import ZeroParamStatus, mark_partitioned

log = logging.getLogger("zspeed.zero3")

__all__ = ["ParamFetcher", "pin", "unpin", "edited_locally", "full_numel", "full_shape"]


class _State:
    """What the fetcher knows about one partitioned parameter."""
    __slots__ = ("p", "sm", "gi", "pi", "ui", "numel", "shape", "padded", "full", "ready", "waited", "hold",
                 "persistent", "stale", "pins", "io", "__weakref__")

    def __init__(self, p, sm, gi, pi, ui, numel, shape, padded, persistent, sanity=None):
        self.p, self.sm, self.gi, self.pi, self.ui = p, sm, gi, pi, ui
        self.numel, self.shape, self.padded = numel, shape, padded
        self.full = None        # the gathered padded buffer on the device, or None (released)
        self.ready = None       # CUDA event: the gather is complete
        self.waited = True      # the compute stream waits for ``ready`` already
        self.hold = False       # gathered for backward: kept until its gradient is accumulated
        self.persistent = persistent
        self.stale = False      # gathered, but the shards changed since (an optimizer step)
        self.pins = 0           # GatheredParameters contexts holding it whole
        self.io = None          # NVMe store: (pool buffer, read request) while its shard is read
        # DeepSpeed's attributes of a ZeRO-3 parameter, which libraries read (peft, accelerate):
        # a unique id, whether it stays whole between uses, and whether it is whole now.
        mark_partitioned(p, persistent, sanity)


def _states_of(stores: list, device: torch.device, persistence: int, sanity_checks: bool) -> dict:
    """id(parameter) -> its _State, for every parameter of ``stores`` with elements (one with none
    gets an empty tensor of its shape on ``device``, for good: there is nothing to gather)."""
    states = {}
    for store in stores:
        for gi, ps in enumerate(store.layout.params):
            gp = store.plan.groups[gi]
            for pi, p in enumerate(ps):
                if gp.numels[pi] == 0:
                    p.data = torch.empty(full_shape(p), dtype=store.dtype, device=device)
                    continue
                ui = gp.unit_of[pi]
                u = gp.units[ui]
                states[id(p)] = _State(p, store, gi, pi, ui, u.length, full_shape(p), u.padded, u.length <= persistence,
                                       sanity_checks)
    return states


_FETCHERS: "weakref.WeakSet[ParamFetcher]" = weakref.WeakSet()


def fetcher_of(p) -> "ParamFetcher | None":
    """The live fetcher that manages parameter ``p`` (None: not partitioned by an engine)."""
    for f in list(_FETCHERS):
        if id(p) in f.states and f.states[id(p)].p is p:
            return f
    return None


def engines_holding(module: torch.nn.Module) -> list:
    """The live engines whose ZeRO-3 fetcher partitions parameters of ``module`` (oldest first)."""
    ids = {id(p) for p in module.parameters()}
    out = []
    for f in list(_FETCHERS):
        e = f.owner() if f.owner is not None else None
        if e is not None and e not in out and any(i in f.states for i in ids):
            out.append(e)
    return out


class _ExternalUse(TorchFunctionMode):
    """During the model's forward: a partitioned parameter touched while released (used
    outside the modules that own it) is gathered first, and remembered as an external
    parameter of the innermost module running."""

    def __init__(self, fetcher):
        super().__init__()
        self.fetcher = fetcher

    def __torch_function__(self, func, types, args=(), kwargs=None):
        f = self.fetcher
        if f.busy:
            return func(*args, **(kwargs or {}))
        hits = None
        for a in (*args, *(kwargs.values() if kwargs else ())):
            if type(a) is torch.nn.Parameter and id(a) in f.states:
                hits = _add(hits, f.states[id(a)])
            elif isinstance(a, (list, tuple)):
                for b in a:
                    if type(b) is torch.nn.Parameter and id(b) in f.states:
                        hits = _add(hits, f.states[id(b)])
        if hits:
            with f.working():
                f.external_use(hits)
        return func(*args, **(kwargs or {}))


def _add(lst, st):
    if st.full is None or st.stale or not st.waited:
        lst = lst or []
        lst.append(st)
    return lst


def _hooked_modules(module: torch.nn.Module) -> list:
    """The modules the fetcher hooks: every module, except below a ZeRO-3 leaf (``_z3_leaf``,
    utils/z3_leaf_module.py), whose subtree is gathered by the leaf's own hooks."""
    out, todo, seen = [], [module], set()
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        out.append(m)
        if not getattr(m, "_z3_leaf", False):
            todo.extend(reversed(list(m.children())))
    return out


class ParamFetcher:
    """Gathers and releases the partitioned parameters around the modules that use them
    (see the module docstring)."""

    def __init__(self, sm: ParamStore, module: torch.nn.Module, *, prefetch_elems: int, max_live: int,
                 persistence: int, comm: Collectives, frozen: ParamStore | None = None, reuse: int = 0,
                 sanity_checks: bool = False):
        self.sm = sm  # the trained parameters (None in an engine without an optimizer)
        self.frozen = frozen  # the parameters nothing trains (no gradient, no optimizer), or None
        stores = [s for s in (sm, frozen) if s is not None]
        self.device = stores[0].device
        self.comm = comm
        self.prefetch_elems = int(prefetch_elems)
        self.max_live = max(1, int(max_live))
        self.order = AccessOrder(reuse)  # the recorded order of gathers (zero3_order.py)
        self.streams = streams_for(self.device)
        self.states: dict[int, _State] = _states_of(stores, self.device, persistence, sanity_checks)
        self.live = 0  # elements materialized (persistent ones included)
        self._reading: dict = {}  # id(state) -> state whose NVMe read is in flight, oldest first
        self._module_params: dict[int, list] = {}
        self._external: dict[int, list] = {}
        self._stack: list = []
        self._pos_stack: list = []   # per running module: its position in the order, or None
        self._kept: set = set()
        self._mode = None
        self._depth = 0
        # DeepSpeed's names (its DeepSpeedZeRoOffload's), which scripts use to take the hooks off
        # and put them back (TRL's generation context): the handles of the module hooks, and of
        # the hooks that release a parameter once its gradient is accumulated.
        self.forward_hooks: list = []
        self.backward_hooks: list = []
        self.module = module
        self._hooked = _hooked_modules(module)
        ref = weakref.ref(self)
        for i, m in enumerate(self._hooked):
            leaf = bool(getattr(m, "_z3_leaf", False))  # set_z3_leaf_modules: its subtree gathered at once
            own = [self.states[id(p)] for p in dict.fromkeys(m.parameters(recurse=leaf)) if id(p) in self.states]
            if own:
                self._module_params[id(m)] = own
            if leaf:
                for st in own:
                    st.p.ds_z3_leaf_module = m
            m.ds_id = i  # DeepSpeed's module numbering (p.ds_active_sub_modules holds these)
            m.ds_external_parameters = _ExternalParameters(ref, id(m))
        self._register_deepspeed_module(module)
        for store in stores:
            store.fetcher = self
        self.on_modified = None  # weak method: the engine's reaction to edited parameters
        self.before_pin = None  # weak method: the engine completes a step under way before a pin reads
        self.owner = None  # weak reference to the engine (engines_holding)
        # offload_optimizer.overlap_forward: (store, ready(gi, ui, block)) -- a shard of that
        # store may still be being stepped in the background, and is gathered only once it is not.
        self._gate = None
        self._busy = 0  # > 0 while the fetcher itself works (its own tensor calls are not intercepted)
        _FETCHERS.add(self)

    def bind(self, engine, on_modified, before_pin) -> None:
        """The engine this fetcher serves (weakly: engines_holding), its reaction to parameters
        edited whole (``on_modified(states)``) and what completes a step under way before a pin
        reads the weights (``before_pin(what)``), both bound methods held weakly."""
        self.owner = weakref.ref(engine)
        self.on_modified, self.before_pin = weakref.WeakMethod(on_modified), weakref.WeakMethod(before_pin)

    # -- the hooks, under DeepSpeed's names ---------------------------------------------------------
    def _register_deepspeed_module(self, module=None, count=None) -> None:
        """Installs the fetcher's hooks on every module of the model (DeepSpeed's
        DeepSpeedZeRoOffload method, which scripts call to put the hooks back after taking them
        off), after removing any it holds, so a second call installs them once. ``module`` must
        be the model the fetcher partitions (``self.module``); ``count`` is DeepSpeed's and unused."""
        del count
        if module is not None and module is not self.module:
            raise ValueError("zspeed's ZeRO-3 hooks belong to the engine's whole model: pass "
                             "optimizer.parameter_offload.module (the hooks of a part cannot be installed alone).")
        self._remove_module_hooks()
        for m in self._hooked:
            self.forward_hooks.append(m.register_forward_pre_hook(self._pre_forward))
            self.forward_hooks.append(m.register_forward_hook(self._post_forward, always_call=True))
        # The root's enter runs after its own _pre_forward (the root's parameters are gathered
        # outside the recorded order); if that raises (a failed NVMe read) the enter never
        # runs, and the exit, which runs even then, must find nothing to undo (_root_exit).
        root = self.module
        self.forward_hooks.append(root.register_forward_pre_hook(self._root_enter))
        self.forward_hooks.append(root.register_forward_hook(self._root_exit, always_call=True))
        for st in self.states.values():
            if st.p.requires_grad:
                self.backward_hooks.append(st.p.register_post_accumulate_grad_hook(self._grad_done))

    # DeepSpeed's name before 0.16.4 (TRL calls it under older DeepSpeed versions).
    _register_hooks_recursively = _register_deepspeed_module

    def _remove_module_hooks(self) -> None:
        """Takes every hook off (DeepSpeed's method): until they are installed again, a forward
        gathers nothing (inside GatheredParameters the model runs on its whole parameters)."""
        for h in self.forward_hooks + self.backward_hooks:
            h.remove()
        self.forward_hooks, self.backward_hooks = [], []

    # A module holding this fetcher's hooks (a submodule of a ZeRO-3 model) cannot be copied
    # whole: its parameters are shards.
    def __deepcopy__(self, memo):
        raise ZeRO3CopyError(ZERO3_COPY_MESSAGE)

    def __reduce_ex__(self, protocol):
        raise ZeRO3CopyError(ZERO3_COPY_MESSAGE)

    @classmethod
    def from_zero(cls, sm: ParamStore, module: torch.nn.Module, zero: dict, *, comm: Collectives,
                  frozen: ParamStore | None = None) -> "ParamFetcher":
        """A fetcher with the stage3_* knobs of a zero_optimization section (DeepSpeed's defaults
        for the ones it lacks); stage3_module_granularity_threshold marks its leaves first."""
        from .z3_leaf import set_z3_leaf_modules_by_granularity
        set_z3_leaf_modules_by_granularity(module, int(zero.get("stage3_module_granularity_threshold", 0)))
        return cls(sm, module, prefetch_elems=int(zero.get("stage3_prefetch_bucket_size", 50_000_000)),
                   max_live=int(zero.get("stage3_max_live_parameters", 1_000_000_000)),
                   persistence=int(zero.get("stage3_param_persistence_threshold", 100_000)),
                   reuse=int(zero.get("stage3_max_reuse_distance", 1_000_000_000)),
                   comm=comm, frozen=frozen, sanity_checks=bool(zero.get("enable_sanity_checks", False)))

    # -- gathering ------------------------------------------------------------------------------
    def _gather(self, sts: list, prefetch: bool = False) -> None:
        """Starts gathering each of ``sts`` not materialized (or stale) into a device buffer. A
        shard on NVMe is read first (zero3_nvme.py): with ``prefetch`` the read is only started
        (if a pool buffer is free) and lands later; otherwise it is waited for here."""
        todo = [st for st in sts if st.full is None or st.stale]
        if self._gate is not None and todo:
            todo = self._stepped(todo, prefetch)
        if not todo:
            return
        now, reads = [], []
        for st in todo:
            if getattr(st.sm, "nvme", False) and st.sm.on_disk(st.gi, st.ui):
                if st.io is None and not self._start_read(st, block=not prefetch):
                    break  # prefetching: no free buffer now
                reads.append(st)
            else:
                now.append(st)
        if now:
            self._copy_in(now, [st.sm.weights(st.gi, st.ui) for st in now])
        if not prefetch:
            for st in reads:
                if st.io is not None:
                    self._land(st)

    def add_gate(self, sm, ready) -> "_GateHandle":
        """While an optimizer step runs in the background (overlap_forward), every gather of a
        shard of ``sm`` first asks ``ready(gi, ui, block)`` whether the shard holds the step's
        weights. Returns a handle whose remove() ends it."""
        self._gate = (sm, ready)
        return _GateHandle(self, self._gate)

    def _stepped(self, todo: list, prefetch: bool) -> list:
        """``todo`` up to its first shard still being stepped: a gather the module needs now
        waits for it; a prefetch stops there (later shards are stepped later still), except with
        several ranks, where every rank must issue the same gathers and so waits too."""
        sm, ready = self._gate
        block = not prefetch or not self.comm.solo
        for i, st in enumerate(todo):
            if st.sm is sm and not ready(st.gi, st.ui, block):
                return todo[:i]
        return todo

    def _start_read(self, st: _State, block: bool) -> bool:
        """Starts reading ``st``'s shard into a pool buffer; without ``block`` only if one is free."""
        sm = st.sm
        b = sm.acquire()
        while b is None:
            if not block:
                return False
            if not sm.wait_held():  # every buffer holds a read not landed yet: land the oldest
                self._land(next(s for s in self._reading.values() if s.sm is sm))
            b = sm.acquire()
        st.io = (b, sm.start(b, st.gi, st.ui))
        self._reading[id(st)] = st
        return True

    def _land(self, st: _State) -> None:
        """Waits for ``st``'s read and gathers it from the pool buffer, which returns to the pool
        once the copy is done."""
        b, rid = st.io
        st.io = None
        del self._reading[id(st)]
        shard = st.sm.finish(b, rid, st.gi, st.ui)
        try:
            self._copy_in([st], [shard])
        except BaseException:
            st.sm.hold(b, None)
            raise
        st.sm.hold(b, st.ready)

    def _land_ready(self) -> None:
        """Lands the reads that are complete (in the order they were started)."""
        for st in list(self._reading.values()):
            if not st.sm.done(st.io[1]):
                break
            self._land(st)

    def settle(self, sm=None) -> None:
        """Lands every read in flight (of store ``sm``, or of all)."""
        for st in list(self._reading.values()):
            if sm is None or st.sm is sm:
                self._land(st)

    def _copy_in(self, todo: list, shards: list) -> None:
        """Gathers ``todo`` from their shards ``shards`` (host or device tensors) into device buffers."""
        for st in todo:
            if st.full is None:
                st.full = torch.empty(st.padded, dtype=st.sm.dtype, device=self.device)
                self.live += st.numel
            st.stale = False
        self.streams.side_after_current()  # the buffers may reuse memory the compute stream just freed
        with self.streams.on_side(), torch.no_grad():
            for st, shard in zip(todo, shards):
                self.comm.all_gather(st.full, shard)  # one rank: a copy
                st.p.data = st.full[:st.numel].view(st.shape)
                st.p.ds_status = ZeroParamStatus.AVAILABLE
                st.ready = self.streams.mark()
                st.waited = st.ready is None

    def need(self, sts: list) -> None:
        """``sts`` materialized, and the compute stream ordered after their gathers."""
        self._gather(sts)
        for st in sts:
            if not st.waited:
                self.streams.wait(st.ready)
                st.waited = True

    def release(self, sts, backward_done: bool = False, persistent_too: bool = False) -> None:
        for st in sts:
            if st.full is None or (st.persistent and not persistent_too) or st.pins or \
                    (st.hold and not backward_done):
                continue
            if not st.waited:  # prefetched, never used: the memory goes back after the gather
                self.streams.wait(st.ready)
                st.waited = True
            st.p.data = torch.empty(0, dtype=st.sm.dtype, device=self.device)
            st.p.ds_status = ZeroParamStatus.NOT_AVAILABLE
            st.p.ds_active_sub_modules.clear()
            st.full = None
            st.ready = None
            st.hold = False
            self.live -= st.numel

    def release_all(self, persistent_too: bool = False) -> None:
        """Every gathered parameter back to its shard (but those a GatheredParameters context
        holds); the persistent ones too with ``persistent_too`` (the next use gathers them)."""
        for st in self.states.values():
            st.hold = False
            st.p.ds_active_sub_modules.clear()  # (no module runs now; a persistent one stays gathered)
            if persistent_too or not st.persistent:
                self.release([st], persistent_too=persistent_too)

    def hand_back(self) -> None:
        """Ends the fetcher: its hooks are removed and every parameter holds this rank's current
        weights again, as a plain parameter would (one rank: the whole tensor in host memory, the
        ZeRO-3 attributes removed) or as zero.Init leaves it (several ranks: ``p.ds_tensor``, this
        rank's shard in host memory, beside ``ds_shape``/``ds_numel``), so that another engine
        can take the model. Needs no other rank."""
        self.settle()
        self._remove_module_hooks()
        for m in self._hooked:
            for a in ("ds_id", "ds_external_parameters"):
                m.__dict__.pop(a, None)
        _FETCHERS.discard(self)
        for store in (self.sm, self.frozen):
            if store is not None:
                _hand_back_store(store)
        self.states.clear()

    def refresh_persistent(self, wait: bool) -> None:
        """Gathers every persistent parameter (stage3_param_persistence_threshold) that is not
        whole or holds weights from before the last step, as DeepSpeed does after each step and
        after a load: between steps they are whole and current for any reader, not only for
        the next forward. Where steps run in the background (a gate is set) only with ``wait``
        (the step is complete: finish_step, a load); after step() the next forward gathers each
        as its shard is stepped instead (the same choice on every rank: it is a collective)."""
        if self._gate is not None and not wait:
            return
        self.need([st for st in self.states.values() if st.persistent and (st.full is None or st.stale)])

    def mark_stale(self, sm=None) -> None:
        for st in self.states.values():
            if st.full is not None and (sm is None or st.sm is sm):
                st.stale = True

    # -- module hooks -----------------------------------------------------------------------------
    def _of(self, m) -> list:
        own = self._module_params.get(id(m), ())
        ext = self._external.get(id(m), ())
        return list(own) + [s for s in ext if s not in own] if ext else list(own)

    def _root_enter(self, module, args):
        self._depth += 1
        if self._depth == 1:
            self.order.begin_forward()
            self._mode = _ExternalUse(self)
            self._mode.__enter__()

    def _root_exit(self, module, args, out):
        if self._depth == 0:  # an earlier pre-hook raised before the enter ran: nothing to undo
            return None
        self._depth -= 1
        if self._depth == 0 and self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
            self._stack.clear()
            self._pos_stack.clear()
            self.order.end_forward()
            kept, self._kept = self._kept, set()
            self.release([st for st in self.states.values() if id(st) in kept])
        return None

    def _pre_forward(self, m, args):
        self._stack.append(m)
        sts = self._of(m)
        if not sts:
            self._pos_stack.append(None)
            return None
        with self.working():
            for st in sts:
                st.p.ds_active_sub_modules.add(m.ds_id)
            self.need(sts)
            pos = None
            if self._mode is not None:  # the model's forward (not a recomputation in backward)
                pos = self._note_forward(sts)
            self._pos_stack.append(pos)
            if self.frozen is not None and torch.is_grad_enabled():
                _release_after_inputs(weakref.ref(self), [st for st in sts if st.sm is self.frozen and not st.persistent],
                                      args)
        return None

    def _post_forward(self, m, args, out):
        pos = None
        if self._stack and self._stack[-1] is m:
            self._stack.pop()
            pos = self._pos_stack.pop() if self._pos_stack else None
        sts = self._of(m)
        if not sts:
            return None
        with self.working():
            for st in sts:
                st.p.ds_active_sub_modules.discard(m.ds_id)
            if torch.is_grad_enabled():
                _gather_before_backward(weakref.ref(self), out, m)
            keep = self.order.kept_after(pos)
            if keep:
                self._kept.update(k for k in keep)
                self.release([st for st in sts if id(st) not in keep])
            else:
                self.release(sts)
        return None

    def pre_backward(self, m) -> None:
        sts = self._of(m)
        for st in sts:
            st.hold = True
            st.p.ds_active_sub_modules.add(m.ds_id)
        self.need(sts)
        self._prefetch_backward(sts)

    def _grad_done(self, p) -> None:
        st = self.states.get(id(p))
        if st is not None and not st.persistent:
            st.hold = False
            self.release([st], backward_done=True)

    def external_use(self, sts: list) -> None:
        """A released parameter touched during forward outside its modules' hooks."""
        self.need(sts)
        if self._stack:
            m = self._stack[-1]
            ext = self._external.setdefault(id(m), [])
            for st in sts:
                if st not in ext and st not in self._module_params.get(id(m), ()):
                    ext.append(st)
                    log.debug("zspeed zero3: %s uses parameter %s of another module", type(m).__name__,
                              tuple(st.shape))
        # else: touched outside any module's forward (the root's own code): it stays
        # gathered until the end of backward, or the next release_all().

    @property
    def busy(self) -> bool:
        """Whether the fetcher itself is working (gathering, releasing): tensor calls then are its own."""
        return self._busy > 0

    @contextlib.contextmanager
    def working(self):
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1

    def externals_of(self, module_id: int):
        """The states of the parameters used in module ``module_id``'s forward that it does not own."""
        return self._external.get(module_id, ())

    def remove_gate(self, gate) -> None:
        if self._gate is gate:
            self._gate = None

    def add_external(self, module, p) -> None:
        st = self.states[id(p)]
        ext = self._external.setdefault(id(module), [])
        if st not in ext:
            ext.append(st)

    def remove_external(self, module, p) -> None:
        st = self.states.get(id(p))
        ext = self._external.get(id(module), [])
        if st in ext:
            ext.remove(st)

    # -- prefetch ---------------------------------------------------------------------------------
    def _note_forward(self, sts: list):
        """Follows the recorded order, prefetching what comes next; returns this call's position
        in it (None while learning)."""
        pos = self.order.note_forward(sts)
        if pos is not None:
            self._prefetch(self.order.trace, self.order.ahead(pos))
        return pos

    def _prefetch(self, tr, positions) -> None:
        if self._reading:
            self._land_ready()
        budget = self.prefetch_elems
        if budget <= 0:
            return
        todo, seen = [], set()
        for i in positions:
            for st in tr[i]:
                if id(st) in seen:
                    continue
                seen.add(id(st))
                if st.full is None or st.stale:
                    if self.live + st.numel > self.max_live or budget < st.numel and todo:
                        self._gather(todo, prefetch=True)
                        return
                    todo.append(st)
                    budget -= st.numel
            if budget <= 0:
                break
        self._gather(todo, prefetch=True)

    def _prefetch_backward(self, sts: list) -> None:
        positions = self.order.behind(sts)  # the module backwards run in about the reverse order
        if positions is not None:
            self._prefetch(self.order.trace, positions)

    def close(self) -> None:
        self.settle()
        self._remove_module_hooks()


def _hand_back_store(store: ParamStore) -> None:
    """Every parameter of ``store`` holds this rank's current weights again: the whole tensor in
    host memory without the ZeRO-3 attributes (one rank), or ``p.ds_tensor``, this rank's shard
    in host memory, as zero.Init leaves it (several ranks)."""
    ws = store.plan.world_size
    with torch.no_grad():
        for gi, ps in enumerate(store.layout.params):
            gp = store.plan.groups[gi]
            for pi, p in enumerate(ps):
                shape, n = full_shape(p), gp.numels[pi]
                w = (store.weights(gi, gp.unit_of[pi]).detach().to("cpu", copy=True) if n
                     else torch.empty(0, dtype=store.dtype))
                if ws == 1:
                    p.data = w[:n].view(shape)
                    for a in ("ds_shape", "ds_numel", "ds_status", "ds_persist", "ds_tensor", "ds_active_sub_modules"):
                        if hasattr(p, a):
                            delattr(p, a)
                else:
                    p.ds_tensor = w
                    p.data = torch.empty(0, dtype=store.dtype)
                    p.ds_status = ZeroParamStatus.NOT_AVAILABLE


# -- the hooks on a module's inputs and outputs ---------------------------------------------------
def _release_after_inputs(ref, frozen: list, args) -> None:
    """Frozen parameters get no gradient, so no accumulation tells when backward is done with
    them: ``frozen`` (a module's non-persistent frozen states) are released once the gradients of
    all of the module's inputs that need one are computed (its backward has then used its
    weights). Without such inputs they are released at the end of backward (release_all)."""
    ins = [t for t in _tensors(args) if t.requires_grad]
    if not frozen or not ins:
        return
    left = [len(ins)]

    def input_grad_done(grad):
        left[0] -= 1
        f = ref()
        if left[0] == 0 and f is not None:
            for st in frozen:
                st.hold = False
            f.release(frozen, backward_done=True)
        return None
    for t in ins:
        t.register_hook(input_grad_done)


def _gather_before_backward(ref, out, m) -> None:
    """Hooks on module ``m``'s outputs: the first gradient to reach one gathers ``m``'s
    parameters again for its backward (the fetcher ``ref()``'s pre_backward)."""
    fired = [False]

    def before_module_backward(grad):
        f = ref()
        if f is not None and not fired[0]:
            fired[0] = True
            f.pre_backward(m)
        return None
    for t in _tensors(out):
        if t.requires_grad and t.grad_fn is not None:
            t.register_hook(before_module_backward)


# -- GatheredParameters ----------------------------------------------------------------------------
def pin(f: "ParamFetcher", params: list) -> list:
    """GatheredParameters: fetcher ``f``'s ``params`` gathered whole and kept so until
    :func:`unpin` (every rank must call it with the same parameters, in the same order)."""
    sts = [f.states[id(p)] for p in params]
    settle = f.before_pin() if f.before_pin is not None else None
    if settle is not None:  # (a step in the background or one that raised partway: complete it first)
        settle("GatheredParameters")
    with f.working():
        f.need(sts)
        f.streams.synchronize_current()
    for st in sts:
        st.pins += 1
    return sts


def unpin(f: "ParamFetcher", sts: list, modified: bool) -> None:
    """Ends a pin; with ``modified`` the whole values (already the same on every rank) are
    written into the shards, and the engine updates the fp32 masters from them. If a write
    fails (NVMe), the pin still ends: the parameters are released and read their shards'
    previous values again."""
    try:
        if modified:
            for st in sts:
                st.sm.set_full(st.gi, st.pi, st.p.data)
            trained = [st for st in sts if st.sm is f.sm]
            cb = f.on_modified() if f.on_modified is not None else None
            if cb is not None and trained:
                cb(trained)
    finally:
        for st in sts:
            st.pins -= 1
            if not modified and st.full is not None:
                # Edits without a modifier rank are discarded: a parameter that stays
                # materialized (persistent, or pinned elsewhere) is gathered from its
                # shards again before its next use.
                st.stale = True
        f.release(sts)
        if not modified:  # and read again now, so that nothing sees the edit meanwhile
            f.need([st for st in sts if st.full is not None and st.stale])


def edited_locally(sts: list) -> bool:
    """Whether this rank's part of any of the pinned ``sts`` differs from its shard: an edit,
    also one made through ``p.data`` (which no version counter sees). Each rank compares the
    part it owns, so an edit made on every rank is seen wherever it lies; shards on NVMe
    are not read back for this."""
    with torch.no_grad():
        for st in sts:
            sm = st.sm
            if st.full is None or (getattr(sm, "nvme", False) and sm.on_disk(st.gi, st.ui)):
                continue
            shard = sm.weights(st.gi, st.ui)
            lo = sm.rank * shard.numel()  # one unit per parameter: the padding past numel is no value
            n = min(shard.numel(), st.numel - lo)
            if n > 0 and not torch.equal(st.full[lo:lo + n], shard[:n].to(st.full.device)):
                return True
    return False


class _ExternalParameters:
    """``module.ds_external_parameters()``, as DeepSpeed gives every module of a ZeRO-3 model: the
    parameters of other modules that this module's forward uses (found in the first forward, or
    declared with register_external_parameter), as (id, parameter) pairs."""
    __slots__ = ("_fetcher", "_module_id")

    def __init__(self, fetcher_ref, module_id: int):
        self._fetcher, self._module_id = fetcher_ref, module_id

    def __call__(self) -> list:
        f = self._fetcher()
        ext = f.externals_of(self._module_id) if f is not None else ()
        return [(id(st.p), st.p) for st in ext]


class _GateHandle:
    def __init__(self, fetcher, gate):
        self._fetcher, self._gate = weakref.ref(fetcher), gate

    def remove(self) -> None:
        f = self._fetcher()
        if f is not None:
            f.remove_gate(self._gate)


def _tensors(obj, out=None, depth=0):
    out = [] if out is None else out
    if torch.is_tensor(obj):
        out.append(obj)
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out, depth + 1)
    return out
