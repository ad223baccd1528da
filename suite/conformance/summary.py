"""The implementation x family matrix printed after a run, and the results JSON."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Dict, Iterable, List

from suite import pytest_plugin

ORDER = ("fail", "error", "flaky", "known_failure", "deviation", "unsupported", "pass")
SHORT = {"fail": "fail", "error": "err", "flaky": "flaky", "known_failure": "known",
         "deviation": "dev", "unsupported": "unsup", "pass": "ok"}


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
    for r in records:
        rows[r["impl"]][r["family"]][r["outcome"]] += 1
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
        unavailable = [e for e in pytest_plugin.selected_entries(config, available_only=False)
                       if not e.available]
        for e in unavailable:
            lines.append(f"{e.name.ljust(width)}  unavailable: {e.error}")
    return lines


def implementations(config) -> List[dict]:
    out = []
    for e in pytest_plugin.session_registry(config).entries.values():
        item = {"name": e.name, "source": e.source, "available": e.available, "error": e.error,
                "framework": None, "framework_version": None, "devices": [], "dtypes": {},
                "features": [], "deviations": {}}
        if e.available:
            impl = e.impl
            devices = impl.devices()
            item.update(framework=impl.framework, framework_version=impl.framework_version(),
                        devices=devices, dtypes={d: list(impl.dtypes(d)) for d in devices},
                        features=sorted(impl.features), deviations={b: dataclasses.asdict(d)
                                    for b, d in impl.deviations.items()})
        out.append(item)
    return out


def write_json(path: str, records: Iterable[dict], config) -> None:
    """Merge this run's records into the conformance file at ``path`` (suite.records)."""
    from suite.records import merge_conformance, run_info

    merge_conformance(path, run_info(config), implementations(config), records)
