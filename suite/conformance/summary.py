"""The implementation x family matrix printed after a run, and the results JSON."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Dict, Iterable, List

from suite.plugin import interpreted
from suite.selection import Selection
from suite.vocab import OUTCOME_ORDER, Outcome

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


def matrix_lines(records: List[dict], config=None) -> List[str]:
    families = sorted({r["family"] for r in records})
    rows: Dict[str, Dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for r in records:  # a kernel run by its interpreter says so in its row
        label = r["impl"] + (" (interpreted)" if interpreted(r["device"]) else "")
        rows[label][r["family"]][r["outcome"]] += 1
    width = max(len("implementation"), *(len(k) for k in rows))
    widths = [max(len(f), *(len(cell(rows[i][f])) for i in rows)) for f in families]
    header = "implementation".ljust(width) + "  " + "  ".join(
        f.ljust(w) for f, w in zip(families, widths))
    lines = ["", "conformance (cases per implementation and family; all devices and dtypes):",
             header, "-" * len(header)]
    for impl in sorted(rows):
        lines.append(impl.ljust(width) + "  " + "  ".join(
            cell(rows[impl][f]).ljust(w) for f, w in zip(families, widths)))
    if config is not None:
        unavailable = [e for e in Selection.from_config(config).entries(available_only=False)
                       if not e.available]
        for e in unavailable:
            lines.append(f"{e.name.ljust(width)}  unavailable: {e.error}")
    return lines


def stale_declarations(records: Iterable[dict], declared: Dict[str, Iterable[str]]
                       ) -> Dict[str, List[str]]:
    """impl -> the declared behaviours no case needed: some judged case exhibited each of them
    and every judged case that did gave the spec's answer (outcome pass).

    A case that exhibits a behaviour and did not pass (a deviation, a failure, a known failure
    in another dtype, an error) keeps the declaration alive: removing it could only break that
    case further, so the advice to remove it would be wrong."""
    spec_answer: Dict[str, set] = defaultdict(set)  # exhibited, and the spec's answer came out
    otherwise: Dict[str, set] = defaultdict(set)  # exhibited, and anything else came out
    for r in records:
        if r.get("outcome") == "unsupported":  # not run: says nothing about the declaration
            continue
        shown = set(r.get("behaviours") or ()) | set(r.get("policies_used") or ())
        (spec_answer if r.get("outcome") == "pass" else otherwise)[r["impl"]].update(shown)
    out = {}
    for impl, behaviours in declared.items():
        stale = sorted((set(behaviours) & spec_answer[impl]) - otherwise[impl])
        if stale:
            out[impl] = stale
    return out


def stale_lines(records: List[dict], config) -> List[str]:
    """Warnings for declarations the code no longer needs, like unused known failures."""
    declared = {e.name: list(e.impl.deviations)
                for e in Selection.from_config(config).entries(available_only=True)}
    return [f"warning: stale declaration: {impl} declares {b} but every case that exhibits "
            f"it gave the spec's answer (remove the declaration)"
            for impl, bs in stale_declarations(records, declared).items() for b in bs]


def implementations(config, records: Iterable[dict] = ()) -> List[dict]:
    records = list(records)
    out = []
    for e in Selection.from_config(config).registry().entries.values():
        item = {"name": e.name, "source": e.source, "available": e.available, "error": e.error,
                "framework": None, "framework_version": None, "devices": [], "dtypes": {},
                "features": [], "deviations": {}}
        if e.available:
            impl = e.impl
            devices = impl.devices()
            item.update(framework=impl.framework, framework_version=impl.framework_version(),
                        devices=devices, dtypes={d: list(impl.dtypes(d)) for d in devices},
                        features=sorted(impl.features), deviations={b: dataclasses.asdict(d)
                                    for b, d in impl.deviations.items()},
                        stale_deviations=stale_declarations(
                            records, {e.name: list(impl.deviations)}).get(e.name, []))
        out.append(item)
    return out


def write_json(path: str, records: Iterable[dict], config) -> None:
    """Merge this run's records into the conformance file at ``path`` (suite.records)."""
    from suite.records import merge_conformance, run_info

    records = list(records)
    merge_conformance(path, run_info(config), implementations(config, records), records)
