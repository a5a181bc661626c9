"""The runtime's structure, checked on its source (issue: one runtime for every stage and rank
count): no import circles in the package, checkpoint.py reads only checkpoint parts (no
``engine._`` name), every runtime class that defines __init__ and derives from another of
the package's classes calls its base's, and the tests on run modes (stage, world_size,
overlap, delayed, nvme, comm_cpu, cuda, sharded, offload, lowp) in python/zspeed/runtime
stay within a budget that only goes down; only runtime/config.py and plan.py index the parsed
config's sections (everything else reads typed properties or the run plan); reads of another
object's private names in the package stay within a budget that only goes down."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "python" / "zspeed"
RUNTIME = PKG / "runtime"
MODE_WORDS = re.compile("stage|world_size|overlap|delayed|nvme|comm_cpu|cuda|sharded|offload|lowp")
MODE_TEST_BUDGET = 44  # lower it as the runtime loses mode switches; never raise it
PRIVATE_READ_BUDGET = 25  # x._name where x is not self/cls, a class or torch/os/sys; never raise it


def _modules() -> dict:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = f
    return mods


def _imports(name: str, f: Path, mods: dict) -> set:
    out = set()
    is_pkg = f.name == "__init__.py"
    for n in ast.walk(ast.parse(f.read_text())):
        targets = []
        if isinstance(n, ast.Import):
            targets = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = name.split(".") if is_pkg else name.split(".")[:-1]
            if n.level:
                base = base[:len(base) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            subs = [f"{mod}.{a.name}" for a in n.names if f"{mod}.{a.name}" in mods]
            targets = subs + ([mod] if len(subs) < len(n.names) else [])
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("zspeed"):
                out.add(t)
    return out


def _cycles(graph: dict) -> list:
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    mods = _modules()
    graph = {name: _imports(name, f, mods) for name, f in mods.items()}
    assert _cycles(graph) == []


def test_checkpoint_reads_only_checkpoint_parts():
    for name in ("checkpoint.py", "checkpoint_load.py", "checkpoint_read.py", "checkpoint_files.py",
                 "checkpoint_fp32.py"):
        src = (RUNTIME / name).read_text()
        assert "engine._" not in src and "engine." not in re.sub(r"#.*|\"\"\".*?\"\"\"", "", src, flags=re.S), name


def _names_in(node) -> list:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
    return out


def mode_tests() -> list:
    """(file, line) of every if / elif / ternary / while test naming a run mode in the runtime."""
    out = []
    for f in sorted(RUNTIME.rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, (ast.If, ast.IfExp, ast.While)) and any(MODE_WORDS.search(x) for x in _names_in(n.test)):
                out.append((f.relative_to(RUNTIME).as_posix(), n.lineno))
    return out


def test_mode_switches_stay_within_their_budget():
    found = mode_tests()
    assert len(found) <= MODE_TEST_BUDGET, (len(found), found)


def test_subclasses_call_their_base_init():
    classes, bad = {}, []
    for f in PKG.rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ClassDef):
                classes[n.name] = n
    def own_init(c):
        return next((b for b in c.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)

    def has_init(name, seen=()):  # the class or one of the package's bases defines __init__
        c = classes[name]
        return own_init(c) is not None or any(
            has_init(b.id, seen + (name,)) for b in c.bases
            if isinstance(b, ast.Name) and b.id in classes and b.id not in seen)
    for name, c in classes.items():
        bases = [b.id for b in c.bases if isinstance(b, ast.Name) and b.id in classes and has_init(b.id)]
        init = own_init(c)
        if not bases or init is None:
            continue
        calls = [n for n in ast.walk(init) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr == "__init__"]
        if not calls:
            bad.append(f"{name}({', '.join(bases)})")
    assert bad == []


# The parsed config's sections: only config.py and plan.py index them; every other module reads a
# typed property of the config or a field of the run plan (issue: config read once).
_SECTIONS = {"top", "zero", "offload", "offload_param", "fp16", "bf16", "aio", "data_types", "optimizer_params",
             "scheduler_params", "checkpoint", "activation_checkpointing", "compile", "monitor",
             "throughput_timer", "torch_autocast", "amp", "zenflow", "leaf_module", "raw"}


def test_only_config_and_plan_read_raw_config_sections():
    found = []
    for f in sorted(PKG.rglob("*.py")):
        if f.parent == RUNTIME and f.name in ("config.py", "plan.py"):
            continue
        for n in ast.walk(ast.parse(f.read_text())):
            target = None
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute):
                target = n.value
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" \
                    and isinstance(n.func.value, ast.Attribute):
                target = n.func.value
            if target is not None and target.attr in _SECTIONS and \
                    ast.unparse(target.value).split(".")[-1] in ("config", "cfg", "_config"):
                found.append(f"{f.relative_to(PKG)}:{n.lineno}: {ast.unparse(n)[:80]}")
    assert not found, ("raw reads of a config section outside runtime/config.py and plan.py (add a typed "
                       "property to ZSpeedConfig or a field to RunPlan):\n  " + "\n  ".join(found))


def test_reads_of_other_objects_private_names_stay_within_their_budget():
    """An owner's private names are its own: another object asks through a method. What remains
    is torch's internals (tensor._version, autograd's engine), DeepSpeed's own private names that
    scripts rely on (engine._config, module._z3_leaf) and super() calls; counted over the whole
    package."""
    found = []
    for f in sorted(PKG.rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            if not (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")):
                continue
            v = n.value
            if isinstance(v, ast.Name) and (v.id in ("self", "cls", "torch", "os", "sys") or not v.id[0].islower()):
                continue
            found.append(f"{f.relative_to(PKG)}:{n.lineno}: {ast.unparse(n)[:60]}")
    assert len(found) <= PRIVATE_READ_BUDGET, (len(found), found)
