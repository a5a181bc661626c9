"""The README's pictures, drawn from the recorded results (never from a run of its own).

Reads the table of quoted numbers in bench/RESULTS.md (between ``<!-- quoted:begin -->`` and
``<!-- quoted:end -->``: one row per number, with machine, date, commit and command) and the
demo's recorded loss curve (bench/data/demo_loss.csv, cited by that table), and writes
docs/img/*.png. Run it whenever that table changes:

    python bench/plots.py            # needs matplotlib (a benchmark dependency, not zspeed's:
                                     # pip install -r bench/requirements.txt)

The table parser (quoted_rows, numbers) needs nothing but the standard library; the tests use
it to check that every number in the README's results section is one of the table's.
"""
from __future__ import annotations

import argparse
import csv
import re
import textwrap
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
OUT = ROOT / "docs" / "img"
COLUMNS = ("id", "what", "value", "gpu_memory", "machine", "date", "commit", "command")

# A number as the README writes it: 0.141, 57,772, 1.28 (in 1.28B), 4.6 (in 4.6x); not a piece of a
# word, a commit hash or a flag.
_NUMBER = re.compile(r"(?<![\w.,#-])(\d+(?:,\d{3})*(?:\.\d+)?)(?=(?:[xBMK%]|GiB|GB|MiB|s)?(?!\w))")


def numbers(text: str) -> list:
    """The numbers in ``text``, as floats (thousands separators dropped)."""
    return [float(m.group(1).replace(",", "")) for m in _NUMBER.finditer(text)]


def quoted_rows(results: Path = RESULTS) -> list:
    """The rows of the quoted-numbers table, as dicts keyed by COLUMNS."""
    text = results.read_text(encoding="utf-8")
    if "<!-- quoted:begin -->" not in text:
        return []
    body = text.split("<!-- quoted:begin -->", 1)[1].split("<!-- quoted:end -->", 1)[0]
    rows = []
    for line in body.splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "id":
            assert tuple(cells) == COLUMNS, f"bench/RESULTS.md's quoted table has columns {cells}, not {COLUMNS}"
            continue
        assert len(cells) == len(COLUMNS), f"row of {len(cells)} cells: {line}"
        rows.append(dict(zip(COLUMNS, cells)))
    return rows


def _first(text: str) -> float:
    found = numbers(text)
    if not found:
        raise ValueError(f"no number in {text!r}")
    return found[0]


def _by_id(rows: list) -> dict:
    return {r["id"]: r for r in rows}


def _footer(fig, rows: list) -> None:
    commits = sorted({r["commit"].strip("`") for r in rows})
    machines = sorted({r["machine"] for r in rows})
    fig.text(0.01, 0.01, "bench/RESULTS.md, commits " + ", ".join(commits) + "; " + "; ".join(machines),
             fontsize=7, color="#555", ha="left", va="bottom", wrap=True)


def plot_step(rows: dict, plt) -> Path:
    """Step time and GPU memory per mode: zspeed's modes against DeepSpeed's ZeRO-Offload and
    training without offload (1.28B GPT, ZeRO-2, one H200)."""
    order = ["step-torch", "step-ds", "step-zs-r1", "step-zs-r1-int8", "step-zs-r03", "step-zs-auto",
             "step-zs-r03-overlap", "step-zs-auto-overlap"]
    used = [rows[k] for k in order if k in rows]
    labels = [r["what"].split(";")[0] for r in used]
    steps = [_first(r["value"]) for r in used]
    mem = [_first(r["gpu_memory"]) for r in used]
    colors = ["#999999" if r["id"] == "step-torch" else "#d95f02" if r["id"] == "step-ds" else "#1b9e77"
              for r in used]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 0.5 * len(used) + 1.6), sharey=True)
    y = range(len(used))
    a.barh(y, steps, color=colors)
    a.set_yticks(list(y), labels, fontsize=8)
    a.invert_yaxis()
    a.set_xlabel("seconds per step (median of 10; lower is better)")
    for i, v in enumerate(steps):
        a.text(v, i, f" {v:.3f}", va="center", fontsize=8)
    a.set_xlim(0, max(steps) * 1.22)
    b.barh(y, mem, color=colors)
    b.set_xlabel("peak GPU memory, GiB")
    for i, v in enumerate(mem):
        b.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    b.set_xlim(0, max(mem) * 1.22)
    fig.suptitle("1.28B GPT, batch 8 x 1024, bf16, ZeRO-2, exact AdamW, one H200: step time and GPU memory\n"
                 "(ratio: the share of the parameters the CPU steps; the GPU steps the rest)", fontsize=10)
    _footer(fig, used)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    return _save(fig, "step_time_gpu_memory.png", plt)


def plot_largest(rows: dict, plt) -> Path:
    """The largest model one GPU capped at 24 GiB with 125 GiB of host memory trains (ZeRO-3,
    parameters and optimizer in host memory), and the host bytes each parameter costs."""
    big = [rows[k] for k in ("largest-ds", "largest-zs", "largest-zs-nvme") if k in rows]
    bpp = [rows[k] for k in ("bpp-ds", "bpp-zs-fp32", "bpp-zs-int8", "bpp-zs-nvme", "bpp-zs-nvme-20b") if k in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, sel, xlabel, fmt in ((a, big, "largest model trained, billions of parameters", "{:.2f}B"),
                                 (b, bpp, "host bytes per parameter (peak RSS)", "{:.1f}")):
        vals = [_first(r["value"]) for r in sel]
        y = range(len(sel))
        ax.barh(y, vals, color=["#d95f02" if "-ds" in r["id"] else "#1b9e77" for r in sel])
        ax.set_yticks(list(y), [textwrap.fill(r["what"].split(";")[0], 26) for r in sel], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_xlim(0, max(vals) * 1.25)
        for i, v in enumerate(vals):
            ax.text(v, i, " " + fmt.format(v), va="center", fontsize=8)
    fig.suptitle("ZeRO-3, parameters and optimizer offloaded (CPU, or CPU + NVMe): one H200 capped at 24 GiB, "
                 "125 GiB host",
                 fontsize=10)
    _footer(fig, big + bpp)
    fig.tight_layout(rect=(0, 0.06, 1, 0.93))
    return _save(fig, "largest_model.png", plt)


def plot_demo_loss(rows: dict, plt) -> Path:
    """The demo's training loss per step (recorded CSV) and its validation loss."""
    r = rows["demo-loss"]
    m = re.search(r"bench/data/[\w.]+\.csv", r["what"] + " " + r["value"])
    path = ROOT / (m.group(0) if m else "bench/data/demo_loss.csv")
    with open(path, newline="", encoding="utf-8") as f:
        data = list(csv.DictReader(f))
    steps = [int(d["step"]) for d in data]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot(steps, [float(d["loss"]) for d in data], color="#9ecae1", lw=0.8, label="training loss per step")
    ax.plot(steps, [float(d["loss_ema"]) for d in data], color="#08519c", lw=1.8, label="running average")
    val = _first(r["value"])
    ax.axhline(val, color="#d95f02", lw=1, ls="--", label=f"validation loss at the end: {val:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("nats per character")
    ax.set_ylim(0, None)
    ax.legend(fontsize=8)
    ax.set_title("make demo: a 0.81M-parameter character GPT on Pride and Prejudice, ZeRO-2 + CPU offload",
                 fontsize=9)
    _footer(fig, [r])
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return _save(fig, "demo_loss.png", plt)


def plot_trace(rows: dict, plt) -> Path:
    """Two steps of a recorded Chrome trace (zspeed_trace) as a timeline, one row per thread:
    with overlap_forward the CPU step's chunks run while the next forward goes on."""
    import json
    r = rows["trace-overlap"]
    m = re.search(r"bench/data/[\w.]+\.json", r["what"] + " " + r["command"])
    events = json.loads((ROOT / m.group(0)).read_text(encoding="utf-8"))
    events = events["traceEvents"] if isinstance(events, dict) else events
    spans = [e for e in events if e.get("ph") == "X"]
    steps = sorted((e for e in spans if e["name"] == "forward"), key=lambda e: e["ts"])
    if len(steps) < 3:
        raise ValueError("the trace holds fewer than 3 forwards")
    t0, t1 = steps[-3]["ts"], steps[-1]["ts"] + steps[-1]["dur"]  # the last two steps and a forward
    shown = [e for e in spans if e["ts"] + e["dur"] >= t0 and e["ts"] <= t1]
    tracks = sorted({(e["pid"], e["tid"]) for e in shown})
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    palette = {"wait": "#e31a1c", "forward": "#1f78b4", "backward": "#33a02c", "step": "#ff7f00"}
    labels = [names.get(t, f"thread {t[1]}").replace("zspeed-overlapped-step", "overlapped step") for t in tracks]
    # The zoom: from the optimizer step before the last forward to a few ms into that forward,
    # where the overlap is (the overview's scale makes it a sliver).
    last = steps[-1]
    before = [e for e in shown if e["name"] == "optimizer step" and e["ts"] <= last["ts"]]
    z0 = (max(before, key=lambda e: e["ts"])["ts"] if before else last["ts"]) - 500
    z1 = last["ts"] + 7000
    fig, (ax, zx) = plt.subplots(2, 1, figsize=(10, 1.3 * len(tracks) + 3.4),
                                 gridspec_kw={"height_ratios": [1, 1.2]})

    def draw(axis, lo, hi, origin):
        for y, track in enumerate(tracks):
            for e in (e for e in shown if (e["pid"], e["tid"]) == track):
                if e["ts"] + e["dur"] < lo or e["ts"] > hi:
                    continue
                key = next((k for k in palette if k in e["name"]), None)
                axis.barh(y, e["dur"] / 1e3, left=(e["ts"] - origin) / 1e3, height=0.6 if key != "wait" else 0.3,
                          color=palette.get(key, "#b2b2b2"), edgecolor="white", linewidth=0.3)
        axis.set_yticks(range(len(tracks)), labels, fontsize=10)
        axis.invert_yaxis()
        axis.tick_params(axis="x", labelsize=9)

    draw(ax, t0, t1, t0)
    ax.axvspan((z0 - t0) / 1e3, (z1 - t0) / 1e3, color="#999999", alpha=0.15, lw=0)
    ax.set_xlabel("milliseconds (the last two steps of the run; shaded: the zoom below)", fontsize=10)
    draw(zx, z0, z1, last["ts"])
    zx.set_xlim((z0 - last["ts"]) / 1e3, (z1 - last["ts"]) / 1e3)
    zx.axvline(0, color="black", lw=0.8, ls="--")
    zx.set_xlabel("milliseconds from the start of the next forward (dashed)", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in [*palette.values(), "#b2b2b2"]]
    zx.legend(handles, ["a wait", "forward", "backward", "optimizer step / CPU step", "gradients' statistics, copies"],
              fontsize=9, loc="lower right", ncol=3)
    ax.set_title(r["what"].split(";")[0] + " (CPU only): the CPU step of one iteration runs on its own\n"
                 "thread while the next forward starts; the forward waits only where a module's weights "
                 "are not back yet", fontsize=10)
    _footer(fig, [r])
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return _save(fig, "trace_overlap.png", plt)


def _save(fig, name: str, plt) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    # No timestamps in the file, so a PNG changes only when its numbers do.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("bench/plots.py needs matplotlib: pip install -r bench/requirements.txt\n")
        return 2
    rows = _by_id(quoted_rows())
    for fn in (plot_step, plot_largest, plot_demo_loss, plot_trace):
        print(fn(rows, plt).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
