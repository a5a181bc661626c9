"""The README and docs/ agree with bench/RESULTS.md and with the code.

Every performance figure the README and docs/*.md quote is listed in FIGURES with the place in
bench/RESULTS.md that holds it: a row of the table of quoted numbers (by its id) or a section
(by its heading). The test fails when a document no longer says the figure, when the row or
section no longer holds it (a re-measured row with the docs left behind, or the reverse), or
when the document does not name where the figure comes from. test_newcomer.py checks the
README's results block the other way round: each number there is somewhere in the table.

A new figure in a document gets a line here and a pointer in the document's text: "bench/
RESULTS.md, row <id>" or "bench/RESULTS.md, \"<heading>\"". Reads files only (no torch, no
library), so it runs everywhere the suite runs.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "RESULTS.md"
TABLE_LINK = "RESULTS.md#the-numbers-the-readme-quotes"

NOIDLE = "section The offloaded step with no idle GPU"
Z3 = "section ZeRO-3 with parameter and optimizer offload to CPU"
SPLIT3 = "section The split and overlap_forward at ZeRO-3"
WINE = "section Windows CPython under Wine"
CKPT = "section Checkpoint checksums and save/load times"

# (figure as the document writes it, document, where bench/RESULTS.md holds it). A row's figure
# is looked for in its what, value and gpu_memory cells; a section's in its text, subsections
# included.
FIGURES = [
    # README: the quick start's times (rows of the table) and the Windows section
    ("3 min 7 s", "README.md", "row fresh-demo"),
    ("1 min 13 s", "README.md", "row fresh-demo"),
    ("1.553", "README.md", "row fresh-demo"),
    ("22 min 2 s", "README.md", "row fresh-ci"),
    ("761 s", "README.md", WINE),
    ("about 72 minutes", "README.md", WINE),
    ("2.98e-08", "README.md", WINE),
    ("2.98e-08", "docs/WINDOWS.md", WINE),
    # README: results
    ("0.142 s", "README.md", "row step-torch"),
    ("36.47 GiB", "README.md", "row step-torch"),
    ("0.721 s", "README.md", "row step-ds"),
    ("17.57 GiB", "README.md", "row step-ds"),
    ("0.364 s", "README.md", "row step-zs-r1"),
    ("1.98x", "README.md", "row ratio-zs-r1-ds"),
    ("0.156 s", "README.md", "row step-zs-auto"),
    ("4.6x", "README.md", "row ratio-zs-auto-ds"),
    ("0.141 s", "README.md", "row step-zs-auto-overlap"),
    ("0.302 s", "README.md", "row cap-zs-auto"),
    ("21.02 GiB", "README.md", "row cap-zs-auto"),
    ("2.6x", "README.md", "row cap-ratio"),
    ("0.792 s", "README.md", "row cap-ds"),
    ("0.175 s", "README.md", "row cap-zs-auto-ckpt"),
    ("0.853 s", "README.md", "row z3-zs-auto"),
    ("22.14 GiB", "README.md", "row z3-zs-auto"),
    ("2.67x", "README.md", "row z3-ratio"),
    ("2.276 s", "README.md", "row z3-ds"),
    ("1.380 s", "README.md", "row z3-zs-r1"),
    ("1.672 s", "README.md", "row z3-big-auto"),
    ("9.80B", "README.md", "row largest-zs"),
    ("1.68 GiB", "README.md", "row largest-zs"),
    ("8.2", "README.md", "row bpp-zs-int8"),
    ("10.2", "README.md", "row bpp-zs-int8"),
    ("4.97B", "README.md", "row largest-ds"),
    ("25.8", "README.md", "row bpp-ds"),
    ("3.34 GiB", "README.md", "row largest-ds"),
    ("3.83B", "README.md", "row bpp-zs-nvme"),
    ("53.2 GiB", "README.md", "row bpp-zs-nvme"),
    ("5.8", "README.md", "row bpp-zs-nvme"),
    ("34.6 s", "README.md", "row bpp-zs-nvme"),
    ("20.18B", "README.md", "row largest-zs-nvme"),
    ("4.8", "README.md", "row bpp-zs-nvme-20b"),
    ("89.6 GiB", "README.md", "row largest-zs-nvme"),
    ("17.51 GiB", "README.md", "row largest-zs-nvme"),
    ("74.7 s", "README.md", "row largest-zs-nvme"),
    ("1.11x", "README.md", "row largest-zs-nvme"),
    ("122.8 GB", "README.md", "row largest-zs-nvme"),
    ("125.5 s", "README.md", "row largest-zs-nvme"),
    ("1.048x", "README.md", "row ckpt-save-peak"),
    ("1.831x", "README.md", "row ckpt-save-peak"),
    ("1.022x", "README.md", "row ckpt-load-peak"),
    ("3.481x", "README.md", "row ckpt-load-peak"),
    # docs/OFFLOAD.md
    ("0.24-0.26 s", "docs/OFFLOAD.md", NOIDLE),
    ("1.672 s", "docs/OFFLOAD.md", "row z3-big-auto"),
    ("27.40 GiB", "docs/OFFLOAD.md", NOIDLE),
    ("71.07", "docs/OFFLOAD.md", NOIDLE),
    ("37.3 s", "docs/OFFLOAD.md", "section Three tiers"),
    ("18.2 s", "docs/OFFLOAD.md", "section Three tiers"),
    ("1.162 s", "docs/OFFLOAD.md", SPLIT3),
    ("79.5 GiB", "docs/OFFLOAD.md", SPLIT3),
    ("0.853 s", "docs/OFFLOAD.md", SPLIT3),
    ("0.340 s", "docs/OFFLOAD.md", NOIDLE),
    ("0.336 s", "docs/OFFLOAD.md", NOIDLE),
    ("2.459", "docs/OFFLOAD.md", "section Delayed parameter update"),
    ("10.650", "docs/OFFLOAD.md", NOIDLE),
    ("0.254", "docs/OFFLOAD.md", NOIDLE),
    ("1.916", "docs/OFFLOAD.md", NOIDLE),
    ("0.170 s", "docs/OFFLOAD.md", NOIDLE),
    ("0.141 s", "docs/OFFLOAD.md", NOIDLE),
    ("9.80B", "docs/OFFLOAD.md", "row largest-zs"),
    ("4.97B", "docs/OFFLOAD.md", "row largest-ds"),
    ("20.18B", "docs/OFFLOAD.md", "row largest-zs-nvme"),
    ("12.00B", "docs/OFFLOAD.md", "row largest-zs-nvme-fp32"),
    ("74.7 s", "docs/OFFLOAD.md", "row largest-zs-nvme"),
    ("17.50 GiB", "docs/OFFLOAD.md", "section `zspeed plan` against the H200 measurements"),
    ("13.6%", "docs/OFFLOAD.md", "section `zspeed plan`'s step prediction"),
    ("10.7%", "docs/OFFLOAD.md", "section `zspeed plan`'s step prediction"),
    # docs/FEATURES.md
    ("0.141 s", "docs/FEATURES.md", "row step-zs-auto-overlap"),
    ("30.21 GiB", "docs/FEATURES.md", "row step-zs-auto-overlap"),
    ("0.364 s", "docs/FEATURES.md", "row step-zs-r1"),
    ("0.721 s", "docs/FEATURES.md", "row step-ds"),
    ("4.6x", "docs/FEATURES.md", "row ratio-zs-auto-ds"),
    ("1.98x", "docs/FEATURES.md", "row ratio-zs-r1-ds"),
    ("0.302 s", "docs/FEATURES.md", "row cap-zs-auto"),
    ("0.792 s", "docs/FEATURES.md", "row cap-ds"),
    ("0.175 s", "docs/FEATURES.md", "row cap-zs-auto-ckpt"),
    ("9.80B", "docs/FEATURES.md", "row largest-zs"),
    ("20.18B", "docs/FEATURES.md", "row largest-zs-nvme"),
    ("4.97B", "docs/FEATURES.md", "row largest-ds"),
    ("8.2", "docs/FEATURES.md", "row bpp-zs-int8"),
    ("1.89x", "docs/FEATURES.md", Z3),
    ("2.03x", "docs/FEATURES.md", Z3),
    ("1.985", "docs/FEATURES.md", "section ZeRO-Inference"),
    ("1.552", "docs/FEATURES.md", "section ZeRO-Inference"),
    ("0.60x", "docs/FEATURES.md", "section ZeRO-Inference"),
    ("0.088", "docs/FEATURES.md", "section ZeRO-Inference"),
    ("12.58 GiB", "docs/FEATURES.md", "section Activation checkpointing with cpu_checkpointing"),
    ("9.47", "docs/FEATURES.md", "section Activation checkpointing with cpu_checkpointing"),
    ("11.57", "docs/FEATURES.md", "section Activation checkpointing with cpu_checkpointing"),
    ("2.459", "docs/FEATURES.md", "section Delayed parameter update"),
    ("1.12x", "docs/FEATURES.md", "section `bench/bench_adam.py` and `zspeed bench adam`"),
    ("1.76x", "docs/FEATURES.md", "section `zspeed bench swap`"),
    ("6.766", "docs/FEATURES.md", "section `zspeed bench swap`"),
    ("3.846", "docs/FEATURES.md", "section `zspeed bench swap`"),
    ("0.404", "docs/FEATURES.md", "section `bench/bench_engine.py`"),
    ("0.786", "docs/FEATURES.md", "section `bench/bench_engine.py`"),
    ("1.048x", "docs/FEATURES.md", "row ckpt-save-peak"),
    ("1.022x", "docs/FEATURES.md", "row ckpt-load-peak"),
    # docs/ZERO3.md
    ("24.3", "docs/ZERO3.md", Z3),
    ("25.8", "docs/ZERO3.md", Z3),
    ("1.279", "docs/ZERO3.md", Z3),
    ("1.019", "docs/ZERO3.md", Z3),
    ("1.922", "docs/ZERO3.md", Z3),
    ("1.491", "docs/ZERO3.md", Z3),
    ("3.028", "docs/ZERO3.md", Z3),
    ("92.7", "docs/ZERO3.md", Z3),
    ("2.668", "docs/ZERO3.md", Z3),
    ("119.4", "docs/ZERO3.md", Z3),
    ("74.45", "docs/ZERO3.md", "section Gradients in the host parameter shards"),
    ("2.665", "docs/ZERO3.md", "section Gradients in the host parameter shards"),
    ("44.96", "docs/ZERO3.md", "section Gradients in the host parameter shards"),
    ("20.18B", "docs/ZERO3.md", "section 20B on one 24 GiB GPU"),
    ("89.85", "docs/ZERO3.md", "section 20B on one 24 GiB GPU"),
    ("94.45", "docs/ZERO3.md", "section 20B on one 24 GiB GPU"),
    ("67.5 s", "docs/ZERO3.md", "section 20B on one 24 GiB GPU"),
    ("10.7 s", "docs/ZERO3.md", "section Huge pages for the large host buffers"),
    ("7.2 s", "docs/ZERO3.md", "section Huge pages for the large host buffers"),
    # docs/MULTI_GPU.md
    ("35,001-36,064", "docs/MULTI_GPU.md", "section Data-parallel ZeRO-2 + CPU offload on 2 GPUs"),
    ("1.60-1.65x", "docs/MULTI_GPU.md", "section Data-parallel ZeRO-2 + CPU offload on 2 GPUs"),
    ("1.68x", "docs/MULTI_GPU.md", "section Data-parallel ZeRO-2 + CPU offload on 2 GPUs"),
    ("2.14x", "docs/MULTI_GPU.md", "section Data-parallel ZeRO-2 + CPU offload on 2 GPUs"),
    # docs/CHECKPOINTS.md
    ("0.52 s", "docs/CHECKPOINTS.md", CKPT),
    ("0.37 s", "docs/CHECKPOINTS.md", CKPT),
    ("0.411 s", "docs/CHECKPOINTS.md", CKPT),
    ("0.409 s", "docs/CHECKPOINTS.md", CKPT),
    ("0.529 s", "docs/CHECKPOINTS.md", CKPT),
    ("0.28-0.46 s", "docs/CHECKPOINTS.md", CKPT),
    ("0.29-0.31 s", "docs/CHECKPOINTS.md", CKPT),
    # docs/WINDOWS.md
    ("about 72 minutes", "docs/WINDOWS.md", WINE),
    ("2 min 15 s", "docs/WINDOWS.md", WINE),
    ("3 min 7 s", "docs/WINDOWS.md", WINE),
    ("761 s", "docs/WINDOWS.md", WINE),
    ("414 s", "docs/WINDOWS.md", WINE),
]


def _flat(text: str) -> str:
    """Text with every run of white space (line breaks of wrapped prose) as one space."""
    return re.sub(r"\s+", " ", text)


def _read(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def _has(text: str, figure: str) -> bool:
    """The figure as a whole (0.409 s is not inside 10.409 s, 2.6x not inside 12.6x or 2.67x)."""
    return re.search(r"(?<!\d)(?<!\d[.,])" + re.escape(figure) + r"(?!\d|[.,]\d)", text) is not None


def _sections(text: str) -> list:
    """[(heading text, body)] of every heading in ``text``, the body running to the next heading
    of the same or a higher level (subsections included)."""
    lines = text.splitlines()
    heads = [(i, len(m.group(1)), m.group(2)) for i, line in enumerate(lines)
             if (m := re.match(r"(#{1,6})\s+(.*)", line))]
    out = []
    for k, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1:] if lv <= level), len(lines))
        out.append((title, "\n".join(lines[i + 1:end])))
    return out


def _rows() -> dict:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import plots
    finally:
        sys.path.pop(0)
    return {r["id"]: r for r in plots.quoted_rows(RESULTS)}


def _source(where: str) -> str:
    """The text of bench/RESULTS.md that ``where`` names (one row, or one section)."""
    kind, _, name = where.partition(" ")
    if kind == "row":
        rows = _rows()
        assert name in rows, f"bench/RESULTS.md's table of quoted numbers has no row {name!r}"
        r = rows[name]
        return " ".join((r["what"], r["value"], r["gpu_memory"]))
    assert kind == "section", where
    found = [(t, body) for t, body in _sections(RESULTS.read_text(encoding="utf-8")) if name in t]
    assert len(found) == 1, (f"{len(found)} headings of bench/RESULTS.md contain {name!r}: "
                             f"{[t for t, _ in found]}")
    return found[0][1]


@pytest.mark.parametrize("figure,doc,where", FIGURES, ids=[f"{d}:{f}" for f, d, _ in FIGURES])
def test_each_quoted_figure_is_the_one_its_results_row_or_section_holds(figure, doc, where):
    text = _flat(_read(doc))
    assert _has(text, figure), f"{doc} no longer quotes {figure!r} ({where}): update FIGURES or the doc"
    source = _flat(_source(where))
    assert _has(source, figure), (f"{doc} quotes {figure!r} from bench/RESULTS.md's {where}, "
                                  f"which does not hold it (re-measured? then update {doc})")
    kind, _, name = where.partition(" ")
    if doc == "README.md" and kind == "row":
        cited = TABLE_LINK in text  # "Every number here is a row of the table of quoted numbers"
    else:
        cited = name in text
    assert cited, f"{doc} quotes {figure!r} without naming its source, bench/RESULTS.md's {where}"


def test_the_largest_model_is_one_figure_everywhere():
    """The largest model trained on the 24 GiB GPU: README, OFFLOAD, FEATURES and ZERO3 quote
    the row's figure, and none says that nothing larger than 9.80B was tried without the NVMe
    tier's exception."""
    largest = _rows()["largest-zs-nvme"]["value"].strip()
    for doc in ("README.md", "docs/OFFLOAD.md", "docs/FEATURES.md", "docs/ZERO3.md"):
        assert _has(_flat(_read(doc)), largest), f"{doc} does not quote the largest model, {largest}"
    offload = _flat(_read("docs/OFFLOAD.md"))
    for m in re.finditer(r"nothing larger was tried[^)]*", offload):
        assert "NVMe" in m.group(0), m.group(0)


def test_the_windows_suite_time_is_one_figure():
    """Every 'about N minutes' the README and docs/WINDOWS.md give is a figure of bench/RESULTS.md's
    Windows section (the README once said 80 where the recorded run says 72)."""
    source = _flat(_source(WINE))
    for doc in ("README.md", "docs/WINDOWS.md"):
        for m in re.finditer(r"about \d+ minutes", _flat(_read(doc))):
            assert _has(source, m.group(0)), f"{doc}: {m.group(0)!r} is not in bench/RESULTS.md ({WINE})"


def _commands() -> set:
    """The subcommands of the `zspeed` command: the keys of python/zspeed/cli.py's COMMANDS."""
    tree = ast.parse((ROOT / "python" / "zspeed" / "cli.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "COMMANDS" and isinstance(node.value, ast.Dict):
            return {ast.literal_eval(k) for k in node.value.keys}
    raise AssertionError("no COMMANDS dict in python/zspeed/cli.py")


def test_readme_lists_every_zspeed_subcommand():
    """The README's list of subcommands is the command's: cli.py's COMMANDS, and for `bench` the
    native benchmarks of src/cli/bench.c."""
    readme = _flat(_read("README.md"))
    m = re.search(r"has every subcommand: (.*?)\.(?: |$)", readme)
    assert m, "the README no longer lists the zspeed subcommands ('has every subcommand: ...')"
    items = re.findall(r"`([^`]+)`", m.group(1))
    assert {i.split()[0] for i in items} == _commands(), items
    bench = next(i for i in items if i.startswith("bench "))
    native = set(re.findall(r'\{"(\w+)",\s*"', (ROOT / "src" / "cli" / "bench.c").read_text(encoding="utf-8")))
    assert native and set(bench.split()[1].split("|")) == native, (bench, native)


def test_docs_point_only_inside_the_repository():
    """A user has only the repository: the README and docs/ name no path outside it, and their
    relative links resolve to files in it."""
    for doc in ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]:
        path = ROOT / doc
        text = path.read_text(encoding="utf-8")
        assert "../shared" not in text, f"{doc} names ../shared, which is not in the repository"
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            dest = (path.parent / target.split("#", 1)[0]).resolve()
            assert ROOT.resolve() in dest.parents or dest == ROOT.resolve(), f"{doc}: {target} leaves the repository"
            assert dest.exists(), f"{doc}: {target} does not exist"


def test_tested_versions_are_listed_and_linked():
    """The README's version claims point at docs/INSTALL.md's table of what was run, and that
    table names the torch versions the README names."""
    readme, install = _read("README.md"), _read("docs/INSTALL.md")
    assert "docs/INSTALL.md#tested-versions" in readme
    assert "\n## Tested versions\n" in install
    table = install.split("\n## Tested versions\n", 1)[1].split("\n## ", 1)[0]
    for version in set(re.findall(r"torch (\d+\.\d+)", _flat(readme.split("## Quick start", 1)[0]))):
        assert version in table, f"the README names torch {version}, docs/INSTALL.md's table does not"


def test_compat_follows_the_deepspeed_version_the_benchmarks_ran():
    rows = _rows()
    ran = {v for r in rows.values() for v in re.findall(r"DeepSpeed (\d+\.\d+\.\d+)", r["what"])}
    assert ran, "no DeepSpeed version in bench/RESULTS.md's table"
    compat = _flat(_read("docs/COMPAT.md"))
    m = re.search(r"follows the API and documented behaviour of DeepSpeed (\d+\.\d+\.\d+)", compat)
    assert m and m.group(1) in ran, (m and m.group(1), ran)


def test_pyproject_names_only_tested_operating_systems():
    text = _read("pyproject.toml")
    systems = re.findall(r'"Operating System :: ([^"]+)"', text)
    assert systems and set(systems) <= {"POSIX :: Linux", "Microsoft :: Windows"}, systems
