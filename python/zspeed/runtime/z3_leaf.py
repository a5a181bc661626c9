"""DeepSpeed's ZeRO-3 leaf modules (``deepspeed.utils.set_z3_leaf_modules`` and its siblings).

A leaf module is gathered whole: when it runs, ZeRO-3 gathers the parameters of its whole
subtree at once and puts no hooks on its children. Mixture-of-experts blocks need this (which
experts run changes from one batch to the next, so the order of per-child gathers that the
fetcher records and prefetches from does not repeat), and so do models with very fine-grained
modules (fewer hooks). Mark the modules before ``zspeed.initialize`` (or ``zero.Init``'s
engine): the engine's ZeRO-3 fetcher reads the marks when it is built.

The mark is DeepSpeed's: the attribute ``_z3_leaf`` on the module instance. Classes are given
as types or names (the class's ``__name__`` or its fully qualified ``module.QualName``), as in
DeepSpeed; a call that matches nothing raises ValueError unless ``raise_if_not_found`` is False.
"""
from __future__ import annotations

import logging

log = logging.getLogger("zspeed")

__all__ = ["z3_leaf_module", "z3_leaf_parameter", "get_z3_leaf_modules", "set_z3_leaf_modules",
           "unset_z3_leaf_modules", "set_z3_leaf_modules_by_name", "set_z3_leaf_modules_by_suffix",
           "apply_zero_leaf_module_config", "set_z3_leaf_modules_by_granularity"]


def z3_leaf_module(model) -> bool:
    """Whether ``model`` (a module) is marked as a ZeRO-3 leaf."""
    return bool(getattr(model, "_z3_leaf", False))


def z3_leaf_parameter(param) -> bool:
    """Whether ``param`` belongs to a leaf module's subtree in a ZeRO-3 engine (the fetcher marks
    it with ``ds_z3_leaf_module``)."""
    return hasattr(param, "ds_z3_leaf_module")


def get_z3_leaf_modules(model) -> list:
    """The modules of ``model`` marked as leaves."""
    return [m for m in model.modules() if z3_leaf_module(m)]


def _qualified(m) -> str:
    cls = type(m)
    return f"{cls.__module__}.{cls.__qualname__}"


def _mark(model, classes, flag: bool, raise_if_not_found: bool) -> list:
    classes = list(classes) if isinstance(classes, (list, tuple, set)) else [classes]
    bad = [c for c in classes if not isinstance(c, (type, str))]
    if bad or not classes:
        raise ValueError(f"leaf_module_classes must be a list of module classes or class names, got {classes!r}")
    found = []
    for m in model.modules():
        if any((isinstance(c, type) and isinstance(m, c)) or
               (isinstance(c, str) and c in (type(m).__name__, _qualified(m))) for c in classes):
            m._z3_leaf = flag
            found.append(m)
    if not found and raise_if_not_found:
        names = ", ".join(c if isinstance(c, str) else c.__name__ for c in classes)
        raise ValueError(f"no module of {names} in the model (its classes: "
                         f"{sorted({type(m).__name__ for m in model.modules()})[:12]}); check the class names")
    return found


def set_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found: bool = True) -> list:
    """Marks every module of ``model`` that is an instance of one of ``leaf_module_classes``
    (types or class names) as a ZeRO-3 leaf; returns the marked modules."""
    return _mark(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found: bool = True) -> list:
    """Removes the leaf mark from the modules of those classes; returns them."""
    return _mark(model, leaf_module_classes, False, raise_if_not_found)


def set_z3_leaf_modules_by_name(model, module_names, flag: bool = True, raise_if_not_found: bool = True):
    """Marks the modules named in ``module_names`` (as ``model.named_modules()`` names them);
    returns (the marked modules, the names not found)."""
    by_name = dict(model.named_modules())
    found, missing = [], []
    for name in module_names:
        m = by_name.get(name)
        if m is None:
            missing.append(name)
            continue
        m._z3_leaf = flag
        found.append(m)
    if missing and raise_if_not_found:
        raise ValueError(f"no module named {missing[0]!r} in the model (model.named_modules() names them)")
    return found, missing


def set_z3_leaf_modules_by_suffix(model, module_name_suffixes, flag: bool = True, raise_if_not_found: bool = True):
    """Marks every module whose ``model.named_modules()`` name ends with one of
    ``module_name_suffixes`` (each module once); returns (the marked modules, the suffixes that
    matched none)."""
    by_name = dict(model.named_modules())
    found, missing, seen = [], [], set()
    for suffix in module_name_suffixes:
        hits = [m for name, m in by_name.items() if name.endswith(suffix)]
        if not hits:
            missing.append(suffix)
        for m in hits:
            m._z3_leaf = flag
            if id(m) not in seen:
                seen.add(id(m))
                found.append(m)
    if missing and raise_if_not_found:
        raise ValueError(f"no module name ends with {missing[0]!r} in the model (model.named_modules() names "
                         f"them)")
    return found, missing


def apply_zero_leaf_module_config(model, leaf_cfg) -> list:
    """Marks the leaves that a ``zero_optimization.leaf_module`` section names (a dict, or its
    DeepSpeedZeroLeafModuleConfig; None: nothing) and returns them, as DeepSpeed's initialize
    does: its ``classes`` (by default DeepSpeed's list of transformers' sparse MoE blocks),
    ``names`` and ``name_suffixes``. Nothing matching is not an error; entries the config
    changed from DeepSpeed's defaults that match nothing are logged as a warning."""
    if leaf_cfg is None:
        return []
    from .config import parse_leaf_module
    cfg = parse_leaf_module(dict(getattr(leaf_cfg, "_values", leaf_cfg)), set())
    defaults = parse_leaf_module({}, set())
    found: dict = {}
    if cfg["classes"]:
        for m in set_z3_leaf_modules(model, cfg["classes"], raise_if_not_found=False):
            found.setdefault(id(m), m)
    for key, mark, what in (("names", set_z3_leaf_modules_by_name, "unknown module names"),
                            ("name_suffixes", set_z3_leaf_modules_by_suffix, "unmatched module suffixes")):
        if cfg[key]:
            marked, missing = mark(model, cfg[key], raise_if_not_found=False)
            for m in marked:
                found.setdefault(id(m), m)
            if missing and cfg[key] != defaults[key]:
                log.warning("zspeed: zero_optimization.leaf_module has %s: %s", what, missing)
    if not found and cfg != defaults:
        log.warning("zspeed: zero_optimization.leaf_module matched no module of the model; its modules get "
                    "hooks as usual")
    return list(found.values())


# Module classes that only hold other modules: never leaves (their forward may never run).
_CONTAINERS = frozenset({"Container", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"})
_MAX_LEAF_ELEMS = 10 ** 9  # a larger subtree is never a leaf: all of it would be gathered at once


def _numel(p) -> int:
    return int(getattr(p, "ds_numel", p.numel()))


def set_z3_leaf_modules_by_granularity(model, threshold: int) -> list:
    """zero_optimization.stage3_module_granularity_threshold (DeepSpeed's rule): a module's
    granularity is its subtree's parameter count divided by the number of its modules that hold
    parameters (itself, and torch leaf modules below; containers such as ModuleList do not count and
    are never leaves). From the root down, the first module whose granularity is at most
    ``threshold`` becomes a leaf (its subtree is then not looked at). Returns the marked modules; a
    threshold below every module's granularity marks none and logs the smallest one."""
    if threshold <= 0:
        return []
    gran: dict = {}

    def walk(m) -> tuple:  # (modules with parameters that count as layers, parameters) of m's subtree
        own = sum(_numel(p) for p in m.parameters(recurse=False))
        kids = list(m.children())
        if not kids:
            return (1, own) if any(True for _ in m.parameters(recurse=False)) else (0, 0)
        layers, params = 0, own
        for c in kids:
            cl, cp = walk(c)
            layers, params = layers + cl, params + cp
        if type(m).__name__ in _CONTAINERS or params == 0:
            return layers, params
        layers += 1
        if params <= _MAX_LEAF_ELEMS:
            gran[id(m)] = (params // layers, type(m).__name__)
        return layers, params

    walk(model)
    marked: list = []

    def mark(m) -> None:
        if not any(True for _ in m.parameters()):
            return
        g = gran.get(id(m))
        if g is not None and g[0] <= threshold:
            m._z3_leaf = True
            marked.append(m)
            return
        for c in m.children():
            mark(c)

    mark(model)
    if not marked and gran:
        value, name = min(gran.values())
        log.warning("zspeed: stage3_module_granularity_threshold %d marks no module: the smallest granularity is "
                    "%d (%s); set it to at least that to gather such modules whole.", threshold, value, name)
    elif marked:
        log.info("zspeed: stage3_module_granularity_threshold %d: %d module(s) gathered whole as leaves",
                 threshold, len(marked))
    return marked
