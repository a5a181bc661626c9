"""The engine's state, as the parts a checkpoint saves and loads (checkpoint.py knows files
and pieces; each part here knows its own state):

- :class:`ModelPart`: the module's weights, ``module.state_dict()`` with every ZeRO-3
  parameter whole (gathered from its store; every rank takes part);
- :class:`OptimizerPart`: the fp32 master weights and the optimizer's state, by parameter
  name, or, when the optimizer steps a store's local space (several ranks, ZeRO-3), as this
  rank's pieces; it says which state dtype each parameter keeps and checks a state_dict
  before anything is changed;
- :class:`Counters`: the engine's step counters;
- the loss scaler and the LR scheduler, which are stateful objects of their own.

:class:`CheckpointParts` bundles them with the run's world size, rank, dtype and config.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .checkpoint_files import Deferred, real
from .store import full_shape

__all__ = ["ModelPart", "OptimizerPart", "Counters", "CheckpointParts", "Lockstep"]

COUNTERS = ("global_steps", "global_samples", "micro_steps", "skipped_steps")


class ModelPart:
    """The module's weights (see the module docstring). ``stores``: the parameter stores of the
    run (trained and frozen); those that keep only shards are gathered whole."""

    def __init__(self, module: torch.nn.Module, stores: list):
        self.module = module
        self._stores = [s for s in stores if s is not None and not s.whole_params]

    def partitioned(self) -> dict:
        """id(parameter) -> (its store, group, index) for the parameters kept only as shards."""
        out = {}
        for sm in self._stores:
            out.update({k: (sm, gi, pi) for k, (gi, pi) in sm.layout.index.items()})
        return out

    def shapes(self) -> dict:
        """module.state_dict()'s names -> tensors, partitioned ones as meta tensors of their whole shape."""
        part = self.partitioned()
        out = {}
        for k, v in self.module.state_dict(keep_vars=True).items():
            if torch.is_tensor(v):
                out[k] = torch.empty(full_shape(v), dtype=v.dtype, device="meta") if id(v) in part else v
        return out

    def state_for_save(self, gathers: "Lockstep | None" = None) -> dict:
        """module.state_dict() with every partitioned parameter gathered whole to host memory
        (every rank must call it; tied parameters stay one tensor under each of their names).
        With ``gathers`` nothing is gathered yet: each partitioned parameter is a Deferred
        tensor of ``gathers`` (see :class:`Lockstep`), gathered when a save writes it."""
        part = self.partitioned()
        done: dict = {}
        out = {}
        for k, v in self.module.state_dict(keep_vars=True).items():
            if not torch.is_tensor(v):
                continue
            if id(v) in part:
                if id(v) not in done:
                    sm, gi, pi = part[id(v)]
                    shape = full_shape(v)
                    done[id(v)] = (sm.full(gi, pi, "cpu").view(shape) if gathers is None else
                                   gathers.add(v.dtype, shape, lambda sm=sm, gi=gi, pi=pi, shape=shape:
                                               sm.full(gi, pi, "cpu").view(shape)))
                out[k] = done[id(v)]
            else:
                out[k] = v.detach()
        return out

    def load(self, sd: dict) -> None:
        """module.load_state_dict(sd, strict=False), with partitioned parameters written into shards."""
        part = self.partitioned()
        if not part:
            self.module.load_state_dict({k: real(v) for k, v in sd.items()}, strict=False)
            return
        mine = self.module.state_dict(keep_vars=True)
        rest = {}
        for k, v in sd.items():
            t = mine.get(k)
            if t is not None and id(t) in part:  # one whole parameter in memory at a time
                sm, gi, pi = part[id(t)]
                sm.set_full(gi, pi, real(v))
            else:
                rest[k] = real(v)
        self.module.load_state_dict(rest, strict=False)

    def whole(self, names: list, params: list, loaded: dict) -> dict:
        """name -> the whole weight of every trained parameter (``names``/``params`` per group):
        from ``loaded`` where it has it, else the model's (gathered where partitioned)."""
        part = self.partitioned()
        out = {}
        for row, ps in zip(names, params):
            for n, p in zip(row, ps):
                if n in loaded:
                    out[n] = real(loaded[n]).detach()
                elif id(p) in part:
                    sm, gi, pi = part[id(p)]
                    out[n] = sm.full(gi, pi, "cpu").view(full_shape(p))
                else:
                    out[n] = p.detach()
        return out


class Lockstep:
    """Deferred tensors whose loads are collectives (the gathers of a ZeRO-3 save): every rank
    makes them in the order they were added. The rank that writes them loads them as the writer
    reaches each one (a load also makes those skipped before it, e.g. empty tensors); the
    others call :meth:`drain`, and so does a writer that stopped partway (a full disk), so
    that no rank is left waiting in a gather. After a load that raised, nothing more is
    gathered (the ranks' exchanges are broken: the save fails)."""

    def __init__(self):
        self._loads: list = []
        self.done = 0
        self.broken = False

    def add(self, dtype: torch.dtype, shape, load) -> Deferred:
        i = len(self._loads)
        self._loads.append(load)
        return Deferred(dtype, shape, lambda: self._upto(i))

    def _upto(self, i: int):
        if i < self.done or self.broken:
            raise RuntimeError(f"zspeed internal error: gather {i} of a save asked for out of order "
                               f"({self.done} made{', a gather failed' if self.broken else ''})")
        out = None
        while self.done <= i:
            try:
                out = self._loads[self.done]()
            except BaseException:
                self.broken = True
                raise
            self.done += 1
        return out

    def drain(self) -> None:
        """Makes the gathers not made yet (their values are dropped)."""
        if not self.broken and self.done < len(self._loads):
            self._upto(len(self._loads) - 1)


def _shaped(m, shape):
    """``m`` (a tensor or a Deferred one) viewed as ``shape``."""
    if isinstance(m, Deferred):
        if m.shape == shape:
            return m
        return Deferred(m.dtype, shape, lambda: m.load().view(shape))
    return m.view(shape) if m.shape != shape else m


class OptimizerPart:
    """The masters and the optimizer's state (see the module docstring). ``names``/``params``:
    the trained parameters per group, as the optimizer's param_groups hold them; ``path``: the
    optimizer path; ``optimizer``: the engine's optimizer (what schedulers and state_dicts see)."""

    def __init__(self, names: list, params: list, path, optimizer):
        self.names, self.params, self.path, self.optimizer = names, params, path, optimizer

    @property
    def store(self):
        """The store whose local space the path steps (its pieces are the checkpoint's), or None
        when it steps whole parameters."""
        return self.path.sharded

    @property
    def checkpoint_class(self) -> str:
        return self.path.checkpoint_class

    def master_named(self, saved: bool = False) -> dict:
        """name -> fp32 master tensor (shaped like the parameter; with nvme offload a fresh copy
        read from disk); over a store's local space, this rank's pieces only: "<name>@<offset>"
        -> the flat fp32 master of the piece. ``saved``: as a save writes them (Deferred where
        they live in swap files, paths.OptimizerPath.saved_masters)."""
        sm = self.store
        rows = self.path.saved_masters() if saved else self.path.masters()
        if sm is not None:
            from .checkpoint_shards import piece_key
            return {piece_key(self.names[gi][pc.param], pc.offset): m
                    for gi, (entries, ms) in enumerate(zip(sm.pieces, rows))
                    for (pc, _at, _n), m in zip(entries, ms) if pc is not None}
        out = {}
        for names, ps, ms in zip(self.names, self.params, rows):
            for n, p, m in zip(names, ps, ms):
                shape = full_shape(p)
                out[n] = _shaped(m, shape)
        return out

    def master_shapes(self) -> dict:
        """name -> a meta tensor shaped like the master (for validation without reading them)."""
        return {n: torch.empty(full_shape(p), device="meta")
                for names, ps in zip(self.names, self.params) for n, p in zip(names, ps)}

    def load_masters(self, src: dict) -> None:
        """Replaces every fp32 master from ``src`` (name -> whole tensor) and refreshes the model
        (over a store's local space: this rank's pieces of them)."""
        sm = self.store
        if sm is not None:
            self.path.load_masters(sm.cut(lambda gi, pi: src[self.names[gi][pi]]))
            return
        self.path.load_masters([[src[n] for n in names] for names in self.names])

    def load_local_masters(self, rows: list) -> None:
        """Replaces this rank's masters per entry of its local space (the store's pieces)."""
        self.path.load_masters(rows)

    def state_dtypes(self) -> list:
        """Per parameter (in state_dict order), the state dtype its optimizer keeps (None: the
        optimizer's own choice); a checkpoint's states are converted to these on load."""
        per_param = getattr(self.optimizer, "state_dtypes", None)  # the split optimizer's two halves
        if per_param is not None:
            return per_param()
        return [g.get("state_dtype") for g, ps in zip(self.optimizer.param_groups, self.params) for _ in ps]

    def group_state_dtypes(self) -> list:
        """Per param group, the state dtype its optimizer keeps (None: the optimizer's own)."""
        per_group = getattr(self.optimizer, "group_state_dtypes", None)  # the split's: each half converts
        if per_group is not None:
            return per_group()
        return [g.get("state_dtype") for g in self.optimizer.param_groups]

    def validate(self, sd: dict) -> None:
        """ValueError for a state_dict this optimizer would refuse (checked before anything changes)."""
        check = getattr(self.optimizer, "validate_state_dict", None)
        if check is not None:
            check(sd)

    @property
    def validates_first(self) -> bool:
        """Whether :meth:`validate` is the optimizer's whole check (its load cannot refuse after it)."""
        return getattr(self.optimizer, "validate_state_dict", None) is not None


class Counters:
    """The engine's step counters (attributes of the engine scripts read)."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        if name in COUNTERS:
            return getattr(self._engine, name)
        raise AttributeError(name)

    def state_dict(self) -> dict:
        return {k: getattr(self._engine, k) for k in COUNTERS}

    def load_state_dict(self, sd: dict) -> None:
        for k in COUNTERS:
            if k in sd:
                setattr(self._engine, k, sd[k])


@dataclass
class CheckpointParts:
    """Everything a checkpoint saves, part by part (see the module docstring)."""
    model: ModelPart
    optim: OptimizerPart
    scaler: Any
    scheduler: Any
    counters: Counters
    world_size: int
    rank: int
    dtype: torch.dtype
    config: dict

    def whole_weights(self, loaded: dict) -> dict:
        """name -> the whole weight of every trained parameter (``loaded`` where it has it)."""
        return self.model.whole(self.optim.names, self.optim.params, loaded)
