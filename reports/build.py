"""Results files -> DataFrames -> figures and tables -> one self-contained HTML page."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Union

import pandas as pd

from reports import figures, headline, tables
from reports.frames import MEMORY_DROP_LIMIT, RSS_FLOOR_BYTES, conformance_frame, fit_exponent, sweeps_frame
from suite.results.records import read, write_atomic
from suite.spec import agreement

PathLike = Union[str, Path]
FORMATS = {"median_s": "{:.4g}", "median_s_base": "{:.4g}", "ratio": "{:.3f}"}


def context(results: Iterable[PathLike], baseline: Optional[Iterable[PathLike]] = None,
            baseline_impl: Optional[str] = None) -> Dict[str, Any]:
    """Everything the template shows, computed from the results (and baseline) files."""
    docs = read(results)
    sweeps, conformance = sweeps_frame(docs), conformance_frame(docs)
    ok = sweeps[(sweeps["status"] == "ok") & (sweeps["median_s"] > 0)]
    ref_impl = tables.pick_baseline_impl(ok, baseline_impl)
    base = sweeps_frame(read(baseline)) if baseline else None
    # one colour and marker per implementation for every chart of the page
    styles = figures.impl_styles(sweeps, conformance, *([base] if base is not None else []))
    fits = fit_exponent(ok)  # the exponents table and the ranges it states
    impls = tables.implementations(docs, styles)
    verdicts = headline.verdicts(tables.by_version(conformance), impls, styles)
    ctx: Dict[str, Any] = {
        "generated": datetime.datetime.now().isoformat(sep=" ", timespec="seconds"),
        "n_files": len(docs), "n_points": len(ok), "n_not_measured": len(sweeps) - len(ok),
        "n_cases": len(conformance),
        "machines": sorted(set(sweeps["machine"].dropna()) | set(conformance["machine"].dropna())),
        "environment": tables.environment(docs),
        "implementations": impls,
        "matrix": tables.conformance_matrix(tables.by_version(conformance), styles),
        "versions": tables.versions(conformance),
        "figs": {"length": figures.time_vs_length(ok, styles),
                 "heads": figures.time_vs_heads(ok, styles),
                 "throughput": figures.throughput(ok, styles),
                 "memory": figures.memory_vs_length(ok, styles)},
        "exponents": tables.to_html(tables.exponents(fits, ok, styles)),
        "exponent_ranges": tables.exponent_ranges(fits),
        "fastest": tables.to_html(tables.fastest(figures.length_subset(ok)), classes="data wrap")
        if len(ok) else tables.to_html(None),
        "ranking": tables.to_html(tables.ranking(ok, ref_impl), classes="data rank"),
        "baseline_impl": ref_impl or "-",
        "memory_methods": _memory_methods(ok),
        "memory_trust": {"floor": f"{RSS_FLOOR_BYTES / 2**20:g} MiB",
                         "drop": f"{MEMORY_DROP_LIMIT:.0%}", "points": _memory_untrusted(ok)},
        "not_measured": tables.to_html(tables.not_measured(sweeps)),
        "never_measured": tables.never_measured(sweeps),
        "baseline": None,
        "outcome_words": tables.OUTCOMES,
        "rule": {"text": agreement.RULE_TEXT, "k": agreement.RULE_K_TEXT,
                 "terms": agreement.RULE_TERMS},
        "headline": {"verdicts": verdicts, "by_outcome": headline.by_outcome(verdicts),
                     "unavailable": headline.unavailable(impls, conformance),
                     "outcomes": headline.HEADLINE_OUTCOMES,
                     "fastest": headline.fastest(figures.length_subset(ok)),
                     "untrusted": headline.untrusted(ok),
                     "untrusted_mark": headline.UNTRUSTED_MARK,
                     "unmeasured": headline.unmeasured(sweeps, conformance, impls)},
    }
    if base is not None:
        cmp = tables.compare_baseline(ok, base)
        counts = cmp["verdict"].value_counts()
        rows = cmp.head(300)
        ctx["baseline"] = {
            "files": sorted({Path(s).name for s in base["source"].dropna()}),
            "counts": {v: int(counts.get(v, 0)) for v in
                       ("regression", "improvement", "within noise")},
            "figs": figures.baseline_ratios(cmp, styles),
            "columns": [c for c in ("machine", "impl", "device", "dtype", "mask", "H", "L")
                        if c in cmp and (c not in ("machine", "dtype") or cmp[c].nunique() > 1)],
            "rows": [{**r, "median_ms": r["median_s"] * 1e3,
                      "median_ms_base": r["median_s_base"] * 1e3}
                     for r in rows.to_dict("records")],
            "more": max(0, len(cmp) - len(rows))}
    return ctx


MEMORY_METHODS = {  # peak_method -> what it measures, said once in the report
    "rss_hwm_delta": "on the CPU, every framework alike: the rise of the process's peak RSS "
                     "during the call above its RSS before it",
    "cuda_max_memory_allocated": "on CUDA with torch: the allocator's max_memory_allocated "
                                 "above its level before the call",
}


def _memory_methods(ok: pd.DataFrame) -> str:
    """Each method used, said once; a method without a sentence names its implementations."""
    if ok.empty:
        return ""
    parts = []
    for method, impls in ok.groupby("peak_method")["impl"]:
        known = MEMORY_METHODS.get(str(method))
        parts.append(known or f"{method} ({', '.join(sorted(set(map(str, impls))))})")
    return "; ".join(parts)


def _memory_untrusted(ok: pd.DataFrame) -> str:
    """The memory points not to be trusted (``frames.untrusted_memory``), per implementation:
    'jax.jit at L 1536, 2048; numpy.flash at L 256'."""
    bad = ok[ok["memory_untrusted"].notna()] if "memory_untrusted" in ok else ok.iloc[:0]
    return "; ".join(f"{impl} at L {', '.join(str(int(v)) for v in sorted(set(g['L'])))}"
                     for impl, g in bad.groupby("impl", sort=True))


def render(ctx: Dict[str, Any]) -> str:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("reports", "templates"),
                      autoescape=select_autoescape(["html", "j2"]),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template("report.html.j2").render(**ctx)


def build_report(results_paths: Iterable[PathLike], out_path: PathLike,
                 baseline_paths: Optional[Iterable[PathLike]] = None,
                 baseline_impl: Optional[str] = None) -> Path:
    """Write the report for ``results_paths`` (files or directories) to ``out_path``.

    ``baseline_paths``: results to compare with (regressions judged against the spread);
    ``baseline_impl``: the implementation speed-ups are relative to (default "numpy", else
    the first present). Returns the written path. Raises FileNotFoundError for a missing
    path, ValueError for a file that is not results.
    """
    html = render(context(list(results_paths), list(baseline_paths or []) or None,
                          baseline_impl))
    return write_atomic(out_path, html)  # a reader never sees half a page
