"""Copy DeepSpeed's tests/ tree and adapt its module-level imports to zspeed.

usage: adapt.py DEEPSPEED_TESTS_DIR OUT_DIR

Every file is copied unchanged except for its top-level ``import deepspeed...`` /
``from deepspeed... import ...`` statements that fail under zspeed (ZSPEED_AS_DEEPSPEED=1):
each becomes a guarded import that binds the missing names to a placeholder raising
``NotImplementedError('zspeed lacks deepspeed.X.Y')`` on first use, so the file collects and
only the tests that reach for the missing name fail (and are counted as failures).
"""
import ast
import os
import shutil
import subprocess
import sys

PLACEHOLDER = '''
class _ZsMissing:  # added by zspeed's scripts/ds-suite/adapt.py
    def __init__(self, name):
        object.__setattr__(self, "_n", name)
    def _fail(self, *a, **k):
        raise NotImplementedError("zspeed lacks " + object.__getattribute__(self, "_n"))
    __call__ = _fail
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()
    def __bool__(self):
        self._fail()
    def __mro_entries__(self, bases):  # a class deriving from a missing one still defines
        return (object,)
'''


_RESULTS = {}
_CHECK = """
import json, sys
out = {}
for stmt in json.load(sys.stdin):
    try:
        exec(stmt, {})
        out[stmt] = True
    except BaseException:
        out[stmt] = False
print(json.dumps(out))
"""


def _statements(src):
    """The deepspeed import statements ``adapt`` asks about in ``src`` (one name each)."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    out = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "deepspeed":
            out += [f"from {node.module} import {a.name}" for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Import):
            out += [f"import {a.name}" for a in node.names if a.name.split(".")[0] == "deepspeed"]
    return out


def check_all(statements):
    """Whether each import statement works under zspeed, all tried in one child process (one
    interpreter start with torch instead of one per statement)."""
    import json
    todo = sorted(set(statements) - set(_RESULTS))
    if not todo:
        return
    env = dict(os.environ, ZSPEED_AS_DEEPSPEED="1")
    r = subprocess.run([sys.executable, "-c", _CHECK], env=env, input=json.dumps(todo), capture_output=True,
                       text=True)
    last = r.stdout.strip().splitlines()[-1:] if r.returncode == 0 else []
    if not last:
        raise SystemExit(f"adapt.py: the import check failed ({r.returncode}): {r.stderr[-2000:]}")
    _RESULTS.update(json.loads(last[0]))


def works(stmt):
    if stmt not in _RESULTS:
        check_all([stmt])
    return _RESULTS[stmt]


def adapt(src):
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return src, 0
    lines = src.splitlines(keepends=True)
    edits = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "deepspeed":
            kept, missing = [], []
            for a in node.names:
                one = f"from {node.module} import {a.name}"
                (kept if a.name == "*" or works(one) else missing).append(a)
            if not missing:
                continue
            out = []
            for a in kept:
                out.append(f"from {node.module} import {a.name}" + (f" as {a.asname}" if a.asname else "") + "\n")
            for a in missing:
                out.append(f"{a.asname or a.name} = _ZsMissing({(node.module + '.' + a.name)!r})\n")
            edits.append((node.lineno, node.end_lineno, out))
        elif isinstance(node, ast.Import):
            missing = [a for a in node.names if a.name.split(".")[0] == "deepspeed" and not works(f"import {a.name}")]
            if not missing:
                continue
            out = []
            for a in node.names:
                if a in missing:
                    if a.asname:
                        out.append(f"{a.asname} = _ZsMissing({a.name!r})\n")
                    # 'import deepspeed.x.y' binds 'deepspeed', which the other imports provide
                else:
                    out.append(f"import {a.name}" + (f" as {a.asname}" if a.asname else "") + "\n")
            edits.append((node.lineno, node.end_lineno, out))
    if not edits:
        return src, 0
    for start, end, out in reversed(edits):
        indent = ""
        lines[start - 1:end] = [indent + o for o in out]
    # the placeholder class goes after the last __future__ import / module docstring
    first = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            first = node.end_lineno
        elif isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) and first == 0 \
                and node is tree.body[0]:
            first = node.end_lineno
    # recompute: edits shifted lines only after their start, and first precedes every import
    lines[first:first] = [PLACEHOLDER]
    return "".join(lines), len(edits)


def main():
    src_dir, out_dir = sys.argv[1], sys.argv[2]
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    shutil.copytree(src_dir, out_dir)
    sources = []
    for root, _, files in os.walk(out_dir):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(root, f), encoding="utf-8") as fh:
                    sources.append(fh.read())
    check_all([stmt for src in sources for stmt in _statements(src)])
    total = 0
    for root, _, files in os.walk(out_dir):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(root, f)
                with open(p, encoding="utf-8") as fh:
                    src = fh.read()
                new, n = adapt(src)
                if n:
                    total += n
                    with open(p, "w", encoding="utf-8") as fh:
                        fh.write(new)
                    print(f"adapted {n:2d} import(s): {os.path.relpath(p, out_dir)}")
    print(f"{total} import statements adapted")


if __name__ == "__main__":
    main()
