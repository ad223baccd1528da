"""Known failures: records of the conformance cases a library fails, by test id.

A record (a ``[[failure]]`` table of a TOML file, ``KnownFailure``) names an implementation,
the cases it fails (with the devices and dtypes), where it holds (``condition``, in
``suite.plugins.conditions``'s language: versions, instruction-set level, device, CPU flags,
``intermittent``), what it is (``kind``: a library bug or a behaviour), the library and the
versions it was measured on, the upstream issue and the reproducer under ``docs/repro/``.
The suite's own records are ``known_failures.toml`` beside this module (read by every run)
and ``known_failures_compat.toml`` (the version matrix's, read through --known-failures).
Users add files with ``--known-failures FILE``: TOML records, or the short form, one
test-id glob a line (``read_lines``).

Each record lists test-id globs (``KnownFailure.test_globs``), one entry each: a listed test
that fails where the entry's condition holds is a known failure, one that passes is
reported (an error with --strict-declarations), an entry that matches no test warns. A
library behaviour that follows conditions rather than test ids is a
``suite.plugins.known_behaviours.KnownBehaviour``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from suite.plugins.conditions import Where, WhereError, parse, split_line
from suite.plugins.known_behaviours import (
    DeclarationError,
    check_fields,
    read_tables,
    record_where,
    text_fields,
)

CONFORMANCE = Path(__file__).resolve().parent
KNOWN_FAILURES_FILE = CONFORMANCE / "known_failures.toml"  # read by every conformance run
# Read only by `nox -s compat` (the version matrix), through --known-failures.
KNOWN_FAILURES_COMPAT_FILE = CONFORMANCE / "known_failures_compat.toml"
KINDS = ("bug", "behaviour")
REQUIRED = ("name", "implementation", "cases", "kind", "reason")
OPTIONAL = ("device", "dtype", "condition", "library", "versions", "upstream", "reproducer",
            "detail", "raises")
DEVICES = ("cpu", "cpu-interpret", "cuda")
DTYPES = ("float64", "float32", "float16", "bfloat16")
# The test function that runs each family's cases with a ``family/case`` parameter (the
# agreement families: test_case); the families below run otherwise.
FAMILY_TEST = {"mask_forms": "test_mask_form", "wrapper": "test_wrapper",
               "contracts": "test_contract"}
NO_CASE_PARAMETER = ("properties", "gradients", "hypothesis")


class KnownFailuresError(DeclarationError):
    """A known-failures file that cannot be read or a record that is wrong (one line
    naming the file and the record)."""


@dataclasses.dataclass(frozen=True)
class KnownFailure:
    """One record of a known-failures TOML file: cases an implementation fails, where.

    It lists the test ids ``implementation x device x dtype x cases`` (each a glob; see
    ``test_globs``) and holds where ``condition`` holds (``suite.plugins.conditions``; None: anywhere)."""

    name: str
    implementation: Tuple[str, ...]  # registry names, ``*`` and ``?`` as wildcards
    cases: Tuple[str, ...]  # "family/case" globs, or test kinds (see case_glob)
    kind: str  # one of KINDS: a library bug, or a behaviour by design / documented
    reason: str  # one line
    device: Tuple[str, ...] = ("*",)
    dtype: Tuple[str, ...] = ("*",)
    condition: Optional[Where] = None
    library: str = ""  # the distribution whose code shows it (torch, jax, transformers, ...)
    versions: str = ""  # the versions it was measured on
    upstream: str = ""  # the upstream issue or pull request (URL)
    reproducer: str = ""  # a standalone reproducer under docs/repro/
    detail: str = ""  # the long explanation, where no reproducer's README holds it
    # A regular expression the error of a case that raises must match (re.search) for the
    # record to hold there; a record without one lists wrong answers only, so a case that
    # raises (a construction TypeError on an old release, say) stays an error.
    raises: str = ""
    source: str = ""  # the file it was read from

    def test_globs(self) -> List[str]:
        """The test-id globs it lists (one entry each, as a line of the short form)."""
        return [case_glob(case, f"{_escaped(impl)}-{_device_glob(device)}-{dtype}")
                for impl in self.implementation for device in self.device
                for dtype in self.dtype for case in self.cases]

    def shown(self) -> str:
        """What a case it covers says (the reason, reproducer, upstream and condition)."""
        parts = [self.reason]
        if self.reproducer:
            parts.append(f"reproducer {self.reproducer}")
        if self.upstream:
            parts.append(f"upstream {self.upstream}")
        text = "; ".join(parts)
        if self.condition is not None:
            text += f" [where {self.condition.text()}]"
        return text


@dataclasses.dataclass(frozen=True)
class Listed:
    """One known-failure entry: a test-id glob, the reason a case it covers shows, where it
    holds (None: anywhere), and its record (None for a line of the short form)."""

    glob: str
    reason: str
    where: Optional[Where]
    record: Optional[KnownFailure] = None

    def absorbs(self, outcome: str, reason: str) -> bool:
        """Whether a case it lists that ended ``outcome`` (its text ``reason``) is this
        entry's known failure: a wrong answer always; an error (the case raised) only where
        the record's ``raises`` matches the error (a line of the short form: never)."""
        if outcome != "error":
            return True
        raises = self.record.raises if self.record is not None else ""
        return bool(raises) and re.search(raises, reason) is not None

    def label(self) -> str:
        """The entry in a warning: its glob, with its record's file and name."""
        if self.record is None:
            return repr(self.glob)
        return f"{self.glob!r} ({Path(self.record.source).name}: {self.record.name})"


def _escaped(name: str) -> str:
    """A registry name (``*`` and ``?`` wildcards) as a test-id glob: brackets literal."""
    return "".join({"[": "[[]", "]": "[]]"}.get(ch, ch) for ch in name)


def _device_glob(device: str) -> str:
    """``cuda`` covers every CUDA device of a test id (``cuda``, ``cuda:1``)."""
    return "cuda*" if device == "cuda" else device


def case_glob(case: str, target: str) -> str:
    """The test-id glob of one ``cases`` item on ``target`` (``impl-device-dtype``):
    ``family/case`` (its case glob): the test that runs it; ``test_name``: a test that takes
    no case (``test_random_shapes``, ``test_batch_equals_items``); ``test_name[param]``: that
    test with that parameter (``test_gradient[plain]``, ``test_*[*]``: every test with a case
    parameter); ``*``: every test."""
    if case == "*":
        return f"*[[]{target}*"
    if not case.startswith("test_"):
        family = case.split("/", 1)[0]
        test = FAMILY_TEST.get(family, "test_case") if _literal(family) else "test_*"
        return f"{test}[[]{target}-{case}[]]"
    if "[" in case:
        test, _, param = case.partition("[")
        return f"{test}[[]{target}-{param.removesuffix(']')}[]]"
    return f"{case}[[]{target}[]]"


def _literal(text: str) -> bool:
    return not any(ch in text for ch in "*?[")


def catalogue_tests() -> List[Tuple[str, Optional[str]]]:
    """(test function, case parameter or None) of every conformance test of the catalogue;
    a contract's parameter is ``contracts/*`` (each plugin declares its own)."""
    from suite.conformance import catalog

    out: List[Tuple[str, Optional[str]]] = []
    for c in catalog.ALL:
        if c.family == "gradients":
            out.append(("test_causal_gradients", None) if c.name == "causality"
                       else ("test_gradient", c.name))
        elif c.family == "properties":
            out.append((f"test_{c.name}", None))
        else:
            out.append((FAMILY_TEST.get(c.family, "test_case"), f"{c.family}/{c.name}"))
    drawn = [(f"test_{name}", None) for names in catalog.DRAWN_CASES.values() for name in names]
    return out + drawn + [("test_contract", "contracts/*")]


def _matches_catalogue(case: str, tests: List[Tuple[str, Optional[str]]]) -> bool:
    """True when a ``cases`` item names a test of the catalogue."""
    if case == "*":
        return True
    if not case.startswith("test_"):
        return "/" in case and any(p is not None and (fnmatch.fnmatchcase(p, case) or (
            p == "contracts/*" and case.startswith("contracts/"))) for _t, p in tests)
    if "[" in case:
        test, _, param = case.partition("[")
        param = param.removesuffix("]")
        return any(fnmatch.fnmatchcase(t, test) and p is not None
                   and (fnmatch.fnmatchcase(p, param) or p == "contracts/*")
                   for t, p in tests)
    return any(p is None and fnmatch.fnmatchcase(t, case) for t, p in tests)


def _strings(value: Any, field: str, where: str) -> Tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(
            isinstance(v, str) and v.strip() for v in items):
        raise KnownFailuresError(f"{where}: {field}: expected a string or a non-empty list "
                                 f"of strings, got {value!r}")
    return tuple(v.strip() for v in items)


def _record(raw: Any, path: str, number: int,
            tests: List[Tuple[str, Optional[str]]]) -> KnownFailure:
    """One ``[[failure]]`` table, validated."""
    where = record_where(raw, path, number)
    check_fields(raw, where, REQUIRED, OPTIONAL, KnownFailuresError)
    text = text_fields(raw, where, ("name", "kind", "reason", "condition", *OPTIONAL[3:]),
                       KnownFailuresError)
    if text["kind"] not in KINDS:
        raise KnownFailuresError(f"{where}: kind: expected one of {', '.join(KINDS)}, got "
                                 f"{text['kind']!r}")
    if not text["reason"] or "\n" in text["reason"]:
        raise KnownFailuresError(f"{where}: reason: expected one line, got "
                                 f"{text['reason']!r}")
    try:
        condition = parse(text["condition"]) if text["condition"] else None
    except WhereError as exc:
        raise KnownFailuresError(f"{where}: condition: {exc}") from None
    if text["raises"]:
        try:
            re.compile(text["raises"])
        except re.error as exc:
            raise KnownFailuresError(f"{where}: raises: expected a regular expression, got "
                                     f"{text['raises']!r} ({exc})") from None
    lists = {f: _strings(raw[f], f, where) for f in ("implementation", "cases")}
    for field, known in (("device", DEVICES), ("dtype", DTYPES)):
        lists[field] = _strings(raw.get(field, "*"), field, where)
        bad = [v for v in lists[field] if not fnmatch.filter(known, v)]
        if bad:
            raise KnownFailuresError(f"{where}: {field}: {', '.join(bad)} matches none of "
                                     f"{', '.join(known)}")
    bad = [c for c in lists["cases"] if not _matches_catalogue(c, tests)]
    if bad:
        raise KnownFailuresError(
            f"{where}: cases: {', '.join(bad)} matches no case of the catalogue (expected "
            "family/case globs such as masking/fully_masked_*, or a test such as "
            "test_random_shapes)")
    return KnownFailure(name=text["name"], kind=text["kind"], reason=text["reason"],
                        condition=condition, library=text["library"],
                        versions=text["versions"], upstream=text["upstream"],
                        reproducer=text["reproducer"], detail=text["detail"],
                        raises=text["raises"], source=str(path), **lists)


def read_records(path: Union[str, Path]) -> List[KnownFailure]:
    """The records of a known-failures TOML file (``[[failure]]`` tables), validated."""
    failures = read_tables(path, "failure", KnownFailuresError)
    tests = catalogue_tests()
    records = [_record(raw, str(path), i, tests) for i, raw in enumerate(failures, 1)]
    seen: Dict[str, int] = {}
    for i, r in enumerate(records, 1):
        if r.name in seen:
            raise KnownFailuresError(f"{path}, record {i} ({r.name}): name already used by "
                                     f"record {seen[r.name]}")
        seen[r.name] = i
    return records


def _read_text(path: Union[str, Path]) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except IsADirectoryError:
        raise KnownFailuresError(f"expected a known-failures file, got the folder "
                                 f"{path}") from None
    except FileNotFoundError:
        raise KnownFailuresError(f"expected a known-failures file, got {path}, which does "
                                 "not exist") from None
    except UnicodeDecodeError:
        raise KnownFailuresError(f"expected a UTF-8 text file, got binary data in "
                                 f"{path}") from None
    except OSError as exc:
        raise KnownFailuresError(f"cannot read {path}: {exc.strerror}") from None


def read_lines(path: Union[str, Path]) -> List[Listed]:
    """The entries of a file in the short form: one test-id glob a line (brackets escaped as
    ``[[]`` and ``[]]``), optionally where it holds between braces
    (``{torch<2.5; isa=avx512}``, ``suite.plugins.conditions``), then ``#`` and the reason."""
    out = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        try:
            glob, where, reason = split_line(line)
        except WhereError as exc:
            raise KnownFailuresError(f"{path}, line {number}: {exc}") from None
        if glob and (any(ch.isspace() for ch in glob) or "{" in glob):
            raise KnownFailuresError(
                f"{path}, line {number}: expected TEST_ID_GLOB [{{condition}}] [# reason], "
                f"got {line.strip()!r}")
        if glob:
            reason = reason or f"listed in {path}"
            if where is not None:
                reason += f" [where {where.text()}]"
            out.append(Listed(glob, reason, where))
    return out


def read_known_failures(paths: Iterable[Union[str, Path]]) -> Dict[str, Listed]:
    """{test-id glob: entry} of the files, in order: ``.toml`` files hold records
    (``KnownFailure``), any other file the short form (``read_lines``). A glob listed
    twice keeps its first entry."""
    out: Dict[str, Listed] = {}
    for path in paths:
        if str(path).endswith(".toml"):
            entries = [Listed(g, r.shown(), r.condition, r)
                       for r in read_records(path) for g in r.test_globs()]
        else:
            entries = read_lines(path)
        for entry in entries:
            out[entry.glob] = entry  # (a later duplicate's entry, at the first's place)
    return out


def unknown_implementations(entries: Iterable[Listed], names: Iterable[str],
                            sources: Iterable[Union[str, Path]]) -> List[str]:
    """One line for each record of the files ``sources`` whose ``implementation`` names
    (wildcards allowed) match none of the registry's ``names``: a misspelt or renamed
    implementation, whose record would otherwise list no test and hold nowhere, silently.
    A record whose ``library`` is not installed here is not one: its built-ins are not
    registered without it (a file of records for every framework, read where one is
    installed: the compat sessions' known_failures_compat.toml)."""
    from suite.plugins.conditions import installed

    names, sources = list(names), {str(s) for s in sources}
    lines, seen = [], set()
    for entry in entries:
        r = entry.record
        if r is None or r.source not in sources or (r.source, r.name) in seen:
            continue
        if r.library and installed(r.library) is None:
            continue
        seen.add((r.source, r.name))
        missing = [i for i in r.implementation if not fnmatch.filter(names, _escaped(i))]
        if missing:
            lines.append(f"known failure record {r.name!r} ({r.source}) names no implementation "
                         f"here: {', '.join(map(repr, missing))}")
    return lines


def unknown_error(lines: List[str]) -> str:
    """The one line a strict run stops on: the first of ``unknown_implementations``' lines,
    with how many more there are."""
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    return f"--known-failures: {lines[0]}{more}"
