"""The docs' "Measured" page: the recorded runs of the README's commands and of CI's steps.

Every nox session that runs steps (``tests``, ``lint``, ``run``, ``check_full``, ``docs``)
records its machine, commit and each step's wall time in ``mha-results/timings/SESSION.json``,
and ``.ci/run`` its own total beside them. A run worth keeping is filed with

    python -m docs_tools.measured add WHAT --note "fresh clone, caches empty, nothing else running"

which bundles those records into ``docs/measured/DATE-COMMIT-WHAT.json``; the site's page is
generated from that folder, newest first. Times live there, not in the code's comments or the
README's prose.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "docs" / "measured"
TIMINGS = Path("mha-results") / "timings"
FIELDS = {"what", "command", "note", "records"}
RECORD_FIELDS = {"session", "commit", "machine", "started", "cache_dir", "steps", "seconds",
                 "passed"}


class MeasuredError(ValueError):
    """A filed run that cannot be read: one line naming the file and what is wrong."""


def minutes(seconds: float) -> str:
    """1477 -> '24 min 37 s'; 42.4 -> '42 s'."""
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def load(path: Path) -> Dict[str, Any]:
    """One filed run, checked: the fields it may have, records with steps and times."""
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MeasuredError(f"{path.name}: not readable JSON ({exc})") from None
    if not isinstance(run, dict) or not {"what", "records"} <= set(run):
        raise MeasuredError(f"{path.name}: needs 'what' and 'records'")
    unknown = set(run) - FIELDS
    if unknown:
        raise MeasuredError(f"{path.name}: unknown field(s) {', '.join(sorted(unknown))}")
    for rec in run["records"]:
        extra = set(rec) - RECORD_FIELDS
        if extra or not {"session", "steps", "seconds"} <= set(rec):
            raise MeasuredError(f"{path.name}: record {rec.get('session', '?')!r} needs "
                                f"session, steps, seconds (unknown: {sorted(extra)})")
    return run


def _machine(records: List[Dict[str, Any]]) -> str:
    for rec in records:
        m = rec.get("machine")
        if m:
            flags = ", ".join(m.get("flags") or []) or "no AVX2"
            return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores ({flags})"
    return "not recorded"


def page(folder: Path = FOLDER) -> str:
    """The page's Markdown: each filed run, newest first, its sessions' steps in a table."""
    runs = [(p, load(p)) for p in sorted(folder.glob("*.json"), reverse=True)]
    out = ["# Measured", "",
           "Wall times of the README's two commands, CI's steps and the whole matrix, as "
           "their sessions recorded them (`mha-results/timings/`, filed with "
           "`python -m docs_tools.measured add`). Each run names its commit, its machine and "
           "how it ran; timings on these shared 2-core machines vary by a minute or more "
           "from run to run.", ""]
    if not runs:
        out.append("No run filed yet.")
    for path, run in runs:
        recs = run["records"]
        first = min((r["started"] for r in recs if r.get("started")), default="undated")
        commits = sorted({r.get("commit", "?") for r in recs})
        out += [f"## {run['what']}: {', '.join(commits)}, {first[:10]}", ""]
        if run.get("command"):
            out += [f"`{run['command']}`", ""]
        out += [f"Machine: {_machine(recs)}."]
        if run.get("note"):
            out += ["", run["note"]]
        out += ["", "| session | step | wall time |", "|---|---|---|"]
        for rec in recs:
            ended = "" if rec.get("passed", True) else " (failed)"
            for step in rec["steps"]:
                out.append(f"| `{rec['session']}` | {step['step']} | "
                           f"{minutes(step['seconds'])} |")
            out.append(f"| `{rec['session']}` | **total**{ended} | "
                       f"**{minutes(rec['seconds'])}** |")
        out += ["", f"<small>Filed as `docs/measured/{path.name}`.</small>", ""]
    return "\n".join(out) + "\n"


def add(what: str, note: str, command: str, timings: Path = TIMINGS,
        folder: Path = FOLDER) -> Path:
    """Bundle the session records in ``timings`` into ``folder``; returns the new file."""
    recs = []
    for p in sorted(timings.glob("*.json")):
        rec = json.loads(p.read_text())
        recs.append({k: v for k, v in rec.items() if k in RECORD_FIELDS})
    if not recs:
        raise MeasuredError(f"no session record in {timings} (run a nox session first)")
    recs.sort(key=lambda r: r.get("started", ""))
    commit = next((r["commit"] for r in recs if r.get("commit")), "unknown")
    date = (recs[0].get("started") or "undated")[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")
    path = folder / f"{date}-{commit}-{slug}.json"
    run = {"what": what, "command": command, "note": note, "records": recs}
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=1) + "\n")
    return path


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs_tools.measured")
    sub = parser.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="file the records in mha-results/timings/")
    a.add_argument("what", help="what ran, e.g. '.ci/run' or 'main job'")
    a.add_argument("--note", required=True, help="how it ran (clone, caches, load)")
    a.add_argument("--command", default="", help="the command as run")
    a.add_argument("--timings", type=Path, default=TIMINGS)
    args = parser.parse_args(argv)
    try:
        print(add(args.what, args.note, args.command, args.timings))
    except (MeasuredError, OSError, ValueError) as exc:
        print(f"measured: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
