"""Two conformance results files compared case by case (``mha-suite compare``; no pandas).

Work that should not change a verdict (the suite's own speed, a refactor of the harness) is
checked by running the whole matrix before and after it and comparing the two files: a
record is keyed by (impl, device, dtype, isa, test_id), as the writer merges them
(``records._result_key``), and the comparison names the records only one file holds and the
cases whose outcome changed, with each side's reason on one line.

A case listed by an ``intermittent`` known-failure entry (``condition = "intermittent"`` in
``suite/conformance/known_failures.toml``, ``{intermittent}`` in the short form) may end
either way from one run to the next: its change is reported under the record that lists
it and is not a change of verdict. Which entries exist is read from the suite's own file
(and ``--known-failures`` files) when the comparison runs; an entry lists a case by its test
id (its glob), whatever else its condition says.

Exit status (``run``): 0 when no outcome changed but intermittent ones, 1 when an outcome
changed or a record is only in one file, 2 (one line, before any comparing) for a file that
is missing, unreadable or not a conformance results file.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from suite.results import records
from suite.results.records import Document, PathLike, ResultsError
from suite.results.vocabulary import first_of

SHOWN = 10  # lines per kind (changed, intermittent, only before, only after) at most
REASON_WIDTH = 90  # a reason's characters at most, on its one line

Key = Tuple[Any, ...]


def record_key(r: dict) -> Key:
    """(impl, device, dtype, isa, test_id): one verdict. A record without a test id (none
    written by this suite's runs) is keyed by its family/case instead."""
    test = r.get("test_id") or f"{r.get('family')}/{r.get('case')}"
    return (r.get("impl"), r.get("device"), r.get("dtype"), r.get("isa"), test)


def case_name(r: dict) -> str:
    """A case as the terminal names it: the test's name (``test_case[numpy-cpu-float32-
    masking/none]``, what -k and the known-failure globs take), with its CPU level when it
    ran at a lower one."""
    test = str(r.get("test_id") or f"{r.get('family')}/{r.get('case')}")
    name = test.rsplit("::", 1)[-1]
    return name + (f" at {r['isa']}" if r.get("isa") else "")


def one_line(text: Any, width: int = REASON_WIDTH) -> str:
    """A reason on one line of at most ``width`` characters (its first line, cut)."""
    lines = str(text or "").strip().splitlines()
    line = " ".join(lines[0].split()) if lines else ""
    return line if len(line) <= width else line[:width - 3] + "..."


def read(path: PathLike, side: str) -> Document:
    """The conformance results file at ``path`` (``side``: BEFORE or AFTER), or a
    ResultsError of one line naming the side and the file."""
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"compare: {side}: {path} does not exist; expected a conformance "
                           "results file (mha-suite check --json)")
    if path.is_dir():
        raise ResultsError(f"compare: {side}: expected a conformance results file, got the "
                           f"folder {path}")
    doc = records.read_file(path, argument=f"compare: {side}")
    if doc.kind != "conformance":
        raise ResultsError(f"compare: {side}: {path} is a {doc.kind} results file; expected a "
                           "conformance results file (mha-suite check --json)")
    return doc


@dataclasses.dataclass(frozen=True)
class Intermittent:
    """A known-failure entry whose condition says ``intermittent``: its test-id glob and the
    name it is reported by (its record's name and file, or the glob for a short-form line)."""

    glob: str
    name: str  # the record's name, or the glob
    where: str = ""  # the record's file, or the short-form file's

    def label(self) -> str:
        return f"{self.name} ({self.where})" if self.where else self.name

    def lists(self, r: dict) -> bool:
        return fnmatch.fnmatchcase(case_name({**r, "isa": None}), self.glob)


def intermittent_entries(extra: Sequence[PathLike] = ()) -> List[Intermittent]:
    """The intermittent entries of the suite's known-failures file and ``extra`` files."""
    from suite.conformance.known_failures import (
        KNOWN_FAILURES_FILE,
        KnownFailuresError,
        read_known_failures,
    )

    try:
        entries = read_known_failures([KNOWN_FAILURES_FILE, *extra])
    except KnownFailuresError as exc:
        raise ResultsError(f"compare: --known-failures: {exc}") from None
    out = []
    for glob, entry in entries.items():
        if entry.where is None or not entry.where.intermittent:
            continue
        if entry.record is not None:
            out.append(Intermittent(glob, entry.record.name, Path(entry.record.source).name))
        else:
            out.append(Intermittent(glob, repr(glob)))
    return out


@dataclasses.dataclass
class Change:
    """One case in both files whose outcome differs."""

    before: dict
    after: dict
    intermittent: Optional[Intermittent] = None  # the entry that lists it, where one does

    def line(self) -> str:
        def side(r: dict) -> str:
            reason = one_line(r.get("reason"))
            return f"{r.get('outcome')}" + (f" ({reason})" if reason else "")

        text = f"{case_name(self.after)}: {side(self.before)} -> {side(self.after)}"
        return text + (f"; listed by {self.intermittent.label()}" if self.intermittent else "")


@dataclasses.dataclass
class Comparison:
    """What two files hold case by case."""

    before: Document
    after: Document
    same: int = 0
    changed: List[Change] = dataclasses.field(default_factory=list)
    intermittent: List[Change] = dataclasses.field(default_factory=list)
    only_before: List[dict] = dataclasses.field(default_factory=list)
    only_after: List[dict] = dataclasses.field(default_factory=list)
    both_passed: List[Tuple[dict, dict]] = dataclasses.field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """0: no outcome changed but intermittent ones; 1: an outcome changed, or a record is
        in one file only."""
        return 1 if self.changed or self.only_before or self.only_after else 0


def _rows(doc: Document) -> Dict[Key, dict]:
    return {record_key(r): r for r in records.conformance_rows(doc)}


def compare(before: Document, after: Document,
            intermittent: Iterable[Intermittent] = ()) -> Comparison:
    """``before`` and ``after`` case by case; a changed case some entry of ``intermittent``
    lists is reported as intermittent, named by the entry, not as a change."""
    entries = list(intermittent)
    old, new = _rows(before), _rows(after)
    out = Comparison(before, after)
    for key, b in old.items():
        a = new.get(key)
        if a is None:
            out.only_before.append(b)
            continue
        if b.get("outcome") == a.get("outcome"):
            out.same += 1
            if b.get("outcome") == "pass":
                out.both_passed.append((b, a))
            continue
        listed = next((e for e in entries if e.lists(a)), None)
        (out.intermittent if listed else out.changed).append(Change(b, a, listed))
    out.only_after = [a for key, a in new.items() if key not in old]
    return out


# --- the numbers of cases that passed on both sides -----------------------------------------
def _relative(b: Any, a: Any) -> Optional[float]:
    """|a - b| / |b| (0 when both are 0, inf when only ``b`` is), None unless both are
    finite numbers."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in (a, b)):
        return None
    if a == b:
        return 0.0
    return abs(a - b) / abs(b) if b else math.inf


def number_lines(c: Comparison, fields: Sequence[str] = ("err", "bound")) -> List[str]:
    """Per field, over the cases that passed in both files: how many changed and the largest
    relative change, with its case."""
    lines = []
    for field in fields:
        changes = [(rel, b, a) for b, a in c.both_passed
                   for rel in [_relative(b.get(field), a.get(field))] if rel is not None]
        moved = [x for x in changes if x[0] > 0]
        text = (f"{field}: {len(changes):,} cases passed in both with a value, "
                f"{len(moved):,} changed")
        if moved:
            rel, b, a = max(moved, key=lambda x: x[0])
            text += (f"; largest relative change {rel:.2e} in {case_name(a)} "
                     f"({b[field]:.3e} -> {a[field]:.3e})")
        lines.append(text)
    return lines


# --- the report --------------------------------------------------------------------------------
def _file_line(side: str, d: Document) -> str:
    facts = records.run_facts(d)
    commit = facts.get("commit") or "unknown"
    commit = commit[:7] + ("+changes" if facts.get("dirty") else "")
    return (f"{side}: {d.path} ({len(d.doc.get('results') or []):,} records; commit {commit}, "
            f"{facts.get('node')}, {str(facts.get('datetime') or '?')[:16]})")


def _section(title: str, lines: List[str], shown: int) -> List[str]:
    if not lines:
        return []
    out = [f"{title} ({len(lines):,}):"]
    out += [f"  {line}" for line in lines[:shown]]
    if len(lines) > shown:
        out.append(f"  +{len(lines) - shown:,} more")
    return out


def _names_by_entry(changes: List[Change], shown: int) -> str:
    """The intermittent entries a run's changes were listed by, with their counts."""
    counts: Dict[str, int] = {}
    for ch in changes:
        name = ch.intermittent.name if ch.intermittent else "?"
        counts[name] = counts.get(name, 0) + 1
    return first_of([name + (f" x{n}" if n > 1 else "") for name, n in counts.items()], shown)


def report_lines(c: Comparison, shown: int = SHOWN, numbers: bool = False) -> List[str]:
    """The comparison in the CLI's style: counts first, then at most ``shown`` lines of each
    kind with ``+N more``."""
    both = c.same + len(c.changed) + len(c.intermittent)
    lines = [f"{both:,} cases in both files: {c.same:,} same outcome, {len(c.changed):,} "
             f"changed, {len(c.intermittent):,} intermittent; {len(c.only_before):,} only "
             f"before, {len(c.only_after):,} only after",
             _file_line("before", c.before), _file_line("after", c.after)]
    lines += _section("changed outcomes", [ch.line() for ch in c.changed], shown)
    if c.intermittent:
        lines += _section("intermittent (listed by an intermittent known-failure record; not "
                          f"a change: {_names_by_entry(c.intermittent, 3)})",
                          [ch.line() for ch in c.intermittent], shown)
    lines += _section("only before", [f"{case_name(r)}: {r.get('outcome')}"
                                      for r in c.only_before], shown)
    lines += _section("only after", [f"{case_name(r)}: {r.get('outcome')}"
                                     for r in c.only_after], shown)
    if numbers:
        lines += ["numbers (cases that passed in both):"] + [f"  {x}" for x in number_lines(c)]
    if c.exit_status:
        lines.append("verdicts changed: " + ", ".join(
            f"{n:,} {one if n == 1 else many}" for n, one, many in (
                (len(c.changed), "outcome changed", "outcomes changed"),
                (len(c.only_before), "record gone", "records gone"),
                (len(c.only_after), "record new", "records new")) if n))
    else:
        lines.append("verdicts unchanged" + (
            f" (but {len(c.intermittent):,} intermittent)" if c.intermittent else ""))
    return lines


def run(before: PathLike, after: PathLike, known_failures: Sequence[PathLike] = (),
        shown: int = SHOWN, numbers: bool = False) -> int:
    """``mha-suite compare``: print the comparison; its exit status (0, 1; a bad file is a
    ResultsError, exit 2 through the CLI, before any comparing)."""
    old, new = read(before, "BEFORE"), read(after, "AFTER")
    entries = intermittent_entries(known_failures)
    c = compare(old, new, entries)
    print("\n".join(report_lines(c, shown=shown, numbers=numbers)))
    return c.exit_status
