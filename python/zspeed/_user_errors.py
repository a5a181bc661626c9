"""How zspeed's own errors reach the person who made the mistake: once, first, without a traceback.

Every error zspeed raises on purpose is a ZSpeedError whose message names the problem and the
fix (a misspelled config key, a checkpoint folder that is not there, ...). Its traceback points
into zspeed's internals and buries that message, so when one ends a program:

* one process (``python train.py``): ``import zspeed`` adds a ``sys.excepthook`` that prints
  ``zspeed: ConfigError: <message>`` and a line saying how to get the traceback; every other
  exception goes on to the hook that was there before (Python's, or one the program set);
* under ``zspeed launch``: each rank writes its error to a file in a folder the launcher's agent
  made (``ZSPEED_ERROR_DIR``) and exits with status 1 without printing it; when the job ends the
  agent prints each distinct message once, naming the ranks that raised it, instead of every
  rank's traceback and torchrun's failure report (that report is still printed for ranks that
  failed in another way: a crash, a signal, an exception that is not zspeed's).

``ZSPEED_TRACEBACK=1`` restores the full tracebacks everywhere (and torchrun's report)."""
from __future__ import annotations

import json
import os
import sys

from ._native import ZSpeedError

ENV_TRACEBACK = "ZSPEED_TRACEBACK"
ENV_ERROR_DIR = "ZSPEED_ERROR_DIR"
HINT = f"(zspeed's own errors print without a traceback; set {ENV_TRACEBACK}=1 to see it)"

__all__ = ["ENV_TRACEBACK", "ENV_ERROR_DIR", "wants_traceback", "short_report", "install", "record",
           "read_records", "job_report"]


def wants_traceback() -> bool:
    """Whether ZSPEED_TRACEBACK asks for full tracebacks (1, true, yes, on)."""
    return os.environ.get(ENV_TRACEBACK, "").strip().lower() in ("1", "true", "yes", "on")


def _text(exc: BaseException) -> str:
    """``Type: message`` (the message alone where there is none)."""
    msg = str(exc).strip()
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def short_report(exc: BaseException) -> str:
    """What one process prints for a zspeed error that ended it."""
    return f"zspeed: {_text(exc)}\n{HINT}\n"


_previous = None


def _hook(exc_type, exc, tb):
    if isinstance(exc, ZSpeedError) and not wants_traceback():
        try:
            sys.stderr.write(short_report(exc))
            sys.stderr.flush()
            return
        except Exception:  # stderr closed or broken: let the hook before ours try
            pass
    (_previous or sys.__excepthook__)(exc_type, exc, tb)


def install() -> None:
    """Add the hook in front of whichever one is set now (once per process)."""
    global _previous
    if sys.excepthook is _hook:
        return
    _previous = sys.excepthook
    sys.excepthook = _hook


def record(exc: BaseException) -> bool:
    """Under zspeed launch: write this rank's zspeed error for the agent to print (True), or False
    where there is no folder to write it to (then the rank prints it itself)."""
    folder = os.environ.get(ENV_ERROR_DIR)
    if not folder or wants_traceback() or not isinstance(exc, ZSpeedError):
        return False
    text = os.environ.get("RANK", "0")
    rank = int(text) if text.isdigit() else 0
    path = os.path.join(folder, f"rank{rank}.json")
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"rank": rank, "type": type(exc).__name__,
                       "message": str(exc).strip()}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        return False
    return True


def read_records(folder) -> list:
    """The records the ranks wrote to ``folder`` (those that can be read), by rank."""
    out = []
    try:
        names = sorted(os.listdir(folder)) if folder else []
    except OSError:
        return out
    for name in names:
        if not (name.startswith("rank") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                r = json.load(f)
            out.append({"rank": int(r["rank"]), "type": str(r["type"]), "message": str(r["message"])})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda r: r["rank"])


def _ranks(ranks: list) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"


def job_report(records: list, failed_ranks) -> tuple:
    """(text, ranks left unexplained): each distinct zspeed error once with the ranks that raised
    it; ``failed_ranks`` are the ranks the agent saw fail, those without a record are returned."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["type"], r["message"]), []).append(r["rank"])
    lines = []
    for (kind, msg), ranks in groups.items():
        lines.append(f"zspeed: {kind} on {_ranks(ranks)}: {msg}" if msg else f"zspeed: {kind} on {_ranks(ranks)}")
    if lines:
        lines.append(HINT)
    seen = {r["rank"] for r in records}
    rest = sorted(set(failed_ranks) - seen)
    return ("\n".join(lines) + "\n" if lines else ""), rest
