"""The implementation x family matrix printed after a run, and the results JSON."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from typing import Dict, Iterable, List, Optional

from suite.plugins.declarations import Deviation, declaration_labels
from suite.plugins.interface import interpreted
from suite.plugins.selection import Selection
from suite.results.vocabulary import OUTCOME_ORDER, Outcome, first_of

ORDER = tuple(o.value for o in OUTCOME_ORDER)
SHORT = {Outcome.FAIL.value: "fail", Outcome.ERROR.value: "err", Outcome.FLAKY.value: "flaky",
         Outcome.KNOWN_FAILURE.value: "known", Outcome.DEVIATION.value: "dev",
         Outcome.UNSUPPORTED.value: "unsup", Outcome.PASS.value: "ok"}


def cell(counts: Counter) -> str:
    """'ok 12' when all passed, else the non-pass counts first: '2 fail 1 dev 9 ok'."""
    if not counts:
        return "-"
    if set(counts) == {"pass"}:
        return f"ok {counts['pass']}"
    return " ".join(f"{counts[o]} {SHORT[o]}" for o in ORDER if counts.get(o))


def row_label(r: dict) -> str:
    """An implementation's row in the matrix: a kernel run by its interpreter says so, and
    the CPU instruction-set level its library ran at (suite.plugins.isa) is named."""
    return r["impl"] + (" (interpreted)" if interpreted(r["device"]) else "") \
        + (f" @{r['isa']}" if r.get("isa") else "")


def matrix_lines(records: List[dict], config=None) -> List[str]:
    """The implementation x family matrix, then ``outcome_lines``: one line per
    implementation naming what its cells other than ok and unsup are."""
    families = sorted({r["family"] for r in records})
    rows: Dict[str, Dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for r in records:
        rows[row_label(r)][r["family"]][r["outcome"]] += 1
    width = max(len("implementation"), *(len(k) for k in rows))
    widths = [max(len(f), *(len(cell(rows[i][f])) for i in rows)) for f in families]
    header = "implementation".ljust(width) + "  " + "  ".join(
        f.ljust(w) for f, w in zip(families, widths))
    lines = ["", "conformance (cases per implementation and family; all devices and dtypes):",
             header, "-" * len(header)]
    for impl in sorted(rows):
        lines.append(impl.ljust(width) + "  " + "  ".join(
            cell(rows[impl][f]).ljust(w) for f, w in zip(families, widths)))
    for e in _unavailable(config):
        lines.append(f"{e.name.ljust(width)}  unavailable: {e.error}")
    return lines + outcome_lines(records)


def _unavailable(config) -> list:
    """The selected implementations not available here (none without a pytest config)."""
    if config is None:
        return []
    return [e for e in Selection.from_config(config).entries(available_only=False)
            if not e.available]


def brief_lines(records: List[dict], config=None) -> List[str]:
    """The run in a few lines (the main job's terminal): the totals per outcome, then
    ``outcome_lines`` for the implementations with a failure, an error or a flaky case only.
    The matrix and every known failure and declared deviation are in the report."""
    counts = Counter(r["outcome"] for r in records)
    impls = {row_label(r) for r in records}
    words = [f"{counts[o]} {o.replace('_', ' ')}" for o in
             ("pass", "deviation", "known_failure", "unsupported", "flaky", "fail", "error")
             if counts.get(o)]
    lines = ["", f"conformance: {len(records)} cases of {len(impls)} implementations: "
                 + ", ".join(words) + " (the matrix, by family: the report)"]
    gone = [e.name for e in _unavailable(config)]
    if gone:
        lines.append(f"not available here: {len(gone)} ({first_of(gone, 6)}; "
                     "mha-suite list says why)")
    bad = {row_label(r) for r in records if r["outcome"] in
           (Outcome.FAIL.value, Outcome.ERROR.value, Outcome.FLAKY.value)}
    return lines + outcome_lines([r for r in records if row_label(r) in bad])


# The outcomes outcome_lines names, in its order, and their words (singular, plural).
# Unsupported is left to the matrix's "unsup" counts: a feature not declared, not a verdict.
GROUPS = {Outcome.FAIL.value: ("failed", "failed"), Outcome.ERROR.value: ("error", "errors"),
          Outcome.FLAKY.value: ("flaky", "flaky"),
          Outcome.KNOWN_FAILURE.value: ("known failure", "known failures"),
          Outcome.DEVIATION.value: ("declared deviation", "declared deviations")}
LINE_WIDTH = 160  # an outcome line's characters at most (labels are dropped to fit)
LABEL_WIDTH = 40  # a label's characters at most
LABELS = 3  # labels named per outcome group at most, the rest counted
_POLICY = re.compile(r"([A-Za-z0-9_]+)=([A-Za-z0-9_.+-]+) \(")


def outcome_label(r: dict) -> str:
    """A short name for why a case did not pass, never its whole reason (that is the record's
    ``reason``): a declared deviation's behaviour=policy, a known failure's known library
    behaviour (suite.plugins.known_behaviours) or, for one listed in a known-failures file, the case."""
    if r.get("outcome") == Outcome.KNOWN_FAILURE.value and r.get("known_used"):
        return ",".join(r["known_used"])
    if r.get("outcome") == Outcome.DEVIATION.value:
        used = set(r.get("policies_used") or ()) | {"float32_dots", "float64_softmax"}
        said = [f"{b}={p}" for b, p in _POLICY.findall(r.get("reason") or "") if b in used]
        if said:
            return ",".join(dict.fromkeys(said))
        if r.get("policies_used"):
            return ",".join(r["policies_used"])
    return f"{r.get('family')}/{r.get('case')}"


def _short(text: str, width: int = LABEL_WIDTH) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _group_text(outcome: str, rs: List[dict], dtypes: set, labels: int) -> str:
    singular, plural = GROUPS[outcome]
    text = f"{len(rs)} {singular if len(rs) == 1 else plural}"
    here = {r.get("dtype") for r in rs}
    if len(here) == 1 and len(dtypes) > 1:  # only in one of the run's dtypes
        text += f" in {next(iter(here))}"
    if labels:
        counts = Counter(outcome_label(r) for r in rs)
        named = sorted(counts, key=lambda k: (-counts[k], k))
        shown = [_short(k) + (f" x{counts[k]}" if counts[k] > 1 else "") for k in named]
        text += f" ({first_of(shown, labels)})"
    return text


def outcome_lines(records: Iterable[dict], width: int = LINE_WIDTH) -> List[str]:
    """One line per implementation (row of the matrix) with a case that did not pass and was
    not unsupported: per outcome, how many and short labels (``outcome_label``), never the
    reasons, which stay in the results file's records and the report. A line is kept within
    ``width`` by naming fewer labels (the counts always stay)."""
    rows: Dict[str, Dict[str, List[dict]]] = defaultdict(lambda: defaultdict(list))
    dtypes: Dict[str, set] = defaultdict(set)
    for r in records:
        label = row_label(r)
        dtypes[label].add(r.get("dtype"))
        if r.get("outcome") in GROUPS:
            rows[label][r["outcome"]].append(r)
    if not rows:
        return []
    lines = ["", "not passed, per implementation (each case's reason: its record's \"reason\" "
                 "in the results file, and the report):"]
    for impl in sorted(rows):
        groups = {o: rows[impl][o] for o in GROUPS if rows[impl].get(o)}
        labels = dict.fromkeys(groups, 0)  # one more label per group in turn, while it fits
        for _ in range(LABELS):
            for o in groups:
                more = {**labels, o: labels[o] + 1}
                if len(_impl_line(impl, groups, dtypes[impl], more)) <= width:
                    labels = more
        lines.append(_impl_line(impl, groups, dtypes[impl], labels))
    return lines


def _impl_line(impl: str, groups: Dict[str, List[dict]], dtypes: set,
               labels: Dict[str, int]) -> str:
    return f"  {impl}: " + ", ".join(_group_text(o, rs, dtypes, labels[o])
                                     for o, rs in groups.items())


def stale_declarations(records: Iterable[dict], declared: Dict[str, Iterable[str]]
                       ) -> Dict[str, List[str]]:
    """impl -> the declared behaviours no case needed: some judged case exhibited each of them
    and every judged case that did gave the spec's answer (outcome pass). A label
    ``behaviour[dtype]`` (a per-dtype declaration, ``suite.plugins.declarations.declaration_labels``) is
    judged on that dtype's cases only.

    A case that exhibits a behaviour and did not pass (a deviation, a failure, a known failure
    in another dtype, an error) keeps the declaration alive: removing it could only break that
    case further, so the advice to remove it would be wrong."""
    # (impl, dtype or None for all dtypes) -> behaviours exhibited where the spec's answer
    # came out, and where anything else came out
    spec_answer: Dict[tuple, set] = defaultdict(set)
    otherwise: Dict[tuple, set] = defaultdict(set)
    for r in records:
        if r.get("outcome") == "unsupported":  # not run: says nothing about the declaration
            continue
        shown = set(r.get("behaviours") or ()) | set(r.get("policies_used") or ())
        seen = spec_answer if r.get("outcome") == "pass" else otherwise
        for scope in ((r["impl"], None), (r["impl"], r.get("dtype"))):
            seen[scope].update(shown)
    out = {}
    for impl, labels in declared.items():
        stale = []
        for label in labels:
            behaviour, _, dtype = label.rstrip("]").partition("[")
            scope = (impl, dtype or None)
            if behaviour in spec_answer[scope] and behaviour not in otherwise[scope]:
                stale.append(label)
        if stale:
            out[impl] = sorted(stale)
    return out


def declared_labels(impl) -> List[str]:
    """The labels of ``impl``'s declarations (``suite.plugins.declarations.declaration_labels``) that hold
    at the installed library versions: one keyed to other versions (``torch<2.5`` on torch
    2.13) is never applied here, so the spec's answer here does not make it stale."""
    out = []
    for b, d in impl.deviations.items():
        if isinstance(d, Deviation):
            out += declaration_labels(b, d) if d.where.versions_hold() else []
        else:
            held = {dtype: dd for dtype, dd in d.items() if dd.where.versions_hold()}
            out += declaration_labels(b, held) if held else []
    return out


def stale_lines(records: List[dict], config,
                left: Optional[Dict[str, Dict[str, int]]] = None) -> List[str]:
    """Warnings for declarations the code no longer needs, like unused known failures; not
    for an implementation a sampled run left cases of (``left``): a case it did not run may
    be the one that needs the declaration."""
    declared = {e.name: declared_labels(e.impl)
                for e in Selection.from_config(config).entries(available_only=True)
                if not (left or {}).get(e.name)}
    return [f"warning: stale declaration: {impl} declares {b} but every case that exhibits "
            f"it{_in(b)} gave the spec's answer (remove the declaration)"
            for impl, bs in stale_declarations(records, declared).items() for b in bs]


def stale_known_lines(records: Iterable[dict]) -> List[str]:
    """Warnings for known library behaviours (suite.plugins.known_behaviours) whose conditions
    held in some case of this run and that no case needed: the library may be fixed (the behaviour stays
    declared until someone narrows its ``where``, but the run says so)."""
    held: Counter = Counter()
    used: set = set()
    for r in records:
        held.update(r.get("known_held") or ())
        used.update(r.get("known_used") or ())
    return [f"warning: known behaviour {name} held in {n} cases of this run and none showed "
            "it (fixed here? narrow its where in suite/plugins/known_behaviours.py)"
            for name, n in sorted(held.items()) if name not in used]


def _in(label: str) -> str:
    """' in float16' for a per-dtype label ``behaviour[float16]``, else ''."""
    return f" in {label.rstrip(']').partition('[')[2]}" if "[" in label else ""


def _asdict(decl) -> dict:
    """A declaration as JSON: {policy, reason}, or dtype -> {policy, reason}."""
    if isinstance(decl, Deviation):
        return dataclasses.asdict(decl)
    return {dtype: dataclasses.asdict(d) for dtype, d in decl.items()}


def implementations(config, records: Iterable[dict] = (),
                    left: Optional[Dict[str, Dict[str, int]]] = None) -> List[dict]:
    """The registry's implementations as the results file describes them; an available one
    run by a sampled check carries ``left_to_check`` (family -> cases not run)."""
    records = list(records)
    ran = {r.get("impl") for r in records} | set(left or {})
    out = []
    for e in Selection.from_config(config).registry().entries.values():
        if e.name not in ran and e.loaded_from_cache():
            # not run here and not loaded: its cached description, no framework imported (a
            # check of one name loaded every built-in to write this list: 6 of its 8 s)
            out.append(_from_description(e))
            continue
        item = {"name": e.name, "source": e.source, "available": e.available, "error": e.error,
                "framework": None, "framework_version": None, "devices": [], "dtypes": {},
                "features": [], "deviations": {}}
        if e.available:
            impl = e.impl
            devices = impl.devices()
            item.update(framework=impl.framework, framework_version=impl.framework_version(),
                        devices=devices, dtypes={d: list(impl.dtypes(d)) for d in devices},
                        features=sorted(impl.features), deviations={b: _asdict(d)
                                    for b, d in impl.deviations.items()},
                        stale_deviations=stale_declarations(
                            records, {e.name: declared_labels(impl)}).get(e.name, []))
            if left and left.get(e.name):  # sampled: no case left out may be the one needing it
                item["left_to_check"] = dict(sorted(left[e.name].items()))
                item["stale_deviations"] = []
        out.append(item)
    return out


def _from_description(e) -> dict:
    """A results-file entry of an implementation this run did not run, from the registry's
    cached description: the declared policies without their reasons, ``checked`` false (a
    merge keeps a run's fuller entry over it)."""
    d = e.description
    item = {"name": e.name, "source": e.source, "available": d is not None, "error": e.error,
            "framework": None, "framework_version": None, "devices": [], "dtypes": {},
            "features": [], "deviations": {}, "stale_deviations": [], "checked": False}
    if d is not None:
        item.update(framework=d.framework, framework_version=d.framework_version,
                    devices=list(d.devices), dtypes={k: list(v) for k, v in d.dtypes.items()},
                    features=sorted(d.features),
                    deviations={b: {"policy": text, "reason": "(not run here)"}
                                for b, text in d.deviations.items()})
    return item


def write_json(path: str, records: Iterable[dict], config,
               left: Optional[Dict[str, Dict[str, int]]] = None) -> None:
    """Merge this run's records into the conformance file at ``path`` (suite.results.records);
    ``left``: impl -> family -> cases a sampled run (``--sample``) left to a full check."""
    from suite.results.records import merge_conformance, run_info

    records = list(records)
    merge_conformance(path, run_info(config), implementations(config, records, left), records)
