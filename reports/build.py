"""Results files -> one self-contained HTML page."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Iterable, List, Optional

from reports import figures, tables
from suite.results import _files, load


def _sweep_docs(paths: Iterable[str]) -> List[dict]:
    docs = []
    for f in _files(paths):
        try:
            doc = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if "benchmarks" in doc and "machine_info" in doc:
            doc["_source"] = str(f)
            docs.append(doc)
    return docs


def build_report(results: Iterable[str], out: Path, baseline: Optional[Iterable[str]] = None,
                 baseline_impl: Optional[str] = "numpy") -> Path:
    """Write the report for ``results`` (files or directories) to ``out``; return its path."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    results = [str(r) for r in results]
    sweeps, conformance = load(results)
    ok = sweeps[sweeps["status"] == "ok"].dropna(subset=["median_s"]) if len(sweeps) else sweeps
    fmt = {"median_s": "{:.3g}", "speedup": "{:.2f}x", "flops_per_s": "{:.3g}",
           "ratio": "{:.2f}", "median_s_base": "{:.3g}", "exponent": "{:.2f}"}
    ctx = {
        "generated": datetime.datetime.now().isoformat(timespec="seconds"),
        "n_files": len(_files(results)), "n_points": int(len(ok)),
        "n_not_measured": int(len(sweeps) - len(ok)), "n_cases": int(len(conformance)),
        "machines": tables.environment(sweeps, conformance, _sweep_docs(results)),
        "matrix": tables.conformance_matrix(conformance),
        "figs": {"length": [], "heads": [], "throughput": [], "memory": []},
        "exponents": "", "fastest": "", "ranking": "", "baseline_impl": baseline_impl,
        "not_measured": tables.to_html(tables.not_measured(sweeps)) if len(sweeps) else "",
        "baseline": None,
    }
    if len(ok):
        ctx["figs"] = {"length": figures.time_vs_length(ok), "heads": figures.time_vs_heads(ok),
                       "throughput": figures.throughput(ok),
                       "memory": figures.memory_vs_length(ok)}
        ex = tables.exponents(ok)
        ctx["exponents"] = tables.to_html(
            ex[["machine", "impl", "device", "dtype", "mask", "H", "interval", "n_points",
                "L_min", "L_max"]].rename(columns={"interval": "exponent [95% CI]"})
            if len(ex) else ex)
        ctx["fastest"] = tables.to_html(tables.fastest(ok), fmt)
        rank = tables.ranking(ok, baseline_impl)
        ctx["baseline_impl"] = rank.attrs.get("baseline_impl", baseline_impl)
        ctx["ranking"] = tables.to_html(rank, fmt)
    if baseline:
        base, _ = load([str(b) for b in baseline])
        cmp = tables.compare_baseline(ok, base) if len(ok) and len(base) else None
        if cmp is not None and len(cmp):
            counts = cmp["verdict"].value_counts()
            ctx["baseline"] = {
                "summary": ", ".join(f"{counts.get(v, 0)} {v}" for v in
                                     ("regression", "improvement", "within noise")) + ".",
                "table": tables.to_html(cmp[["impl", "device", "dtype", "H", "Lq", "mask",
                                             "median_s", "median_s_base", "ratio", "verdict"]],
                                        fmt)}
        else:
            ctx["baseline"] = {"summary": "No points in common with the baseline.", "table": ""}
    env = Environment(loader=PackageLoader("reports", "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    html = env.get_template("report.html.j2").render(**ctx)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out
