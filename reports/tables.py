"""Tables for the report, computed from the long-form DataFrames (pandas only)."""

from __future__ import annotations

import html
from typing import Dict, List, Optional

import numpy as np
import pandas as pd

from suite.results import fit_exponent

OUTCOME_ORDER = ["fail", "error", "deviation", "unsupported", "pass"]


def environment(sweeps: pd.DataFrame, conformance: pd.DataFrame, docs: List[dict]) -> List[dict]:
    """One entry per machine: CPU, GPUs, libraries, threads, commit, when."""
    out = []
    for doc in docs:
        info = doc.get("machine_info") or {}
        extra = info.get("mha_suite") or {}
        out.append({
            "machine": info.get("node", "unknown"), "source": doc.get("_source"),
            "cpu": extra.get("cpu_model") or (info.get("cpu") or {}).get("brand_raw"),
            "cores": extra.get("cores"), "gpus": extra.get("gpus") or [],
            "threads": extra.get("threads"), "libraries": extra.get("libraries") or {},
            "peaks": {k: v / 1e9 for k, v in (extra.get("matmul_peak_flops") or {}).items()},
            "commit": (doc.get("commit_info") or {}).get("id"), "when": doc.get("datetime"),
            "python": info.get("python_version"), "preset": extra.get("preset")})
    return out


def conformance_matrix(conf: pd.DataFrame) -> Dict[str, object]:
    """Implementation x family cells, and per implementation the cases that did not pass."""
    if conf.empty:
        return {"families": [], "rows": []}
    families = sorted(conf["family"].dropna().unique())
    rows = []
    for impl, g in conf.groupby("impl"):
        cells = []
        for fam in families:
            counts = g[g["family"] == fam]["outcome"].value_counts()
            worst = next((o for o in OUTCOME_ORDER if counts.get(o)), None)
            text = ", ".join(f"{counts[o]} {o}" for o in OUTCOME_ORDER if counts.get(o))
            cells.append({"outcome": worst or "none", "text": text or "-"})
        details = []
        for _, r in g[g["outcome"] != "pass"].sort_values(["outcome", "family", "case"]).iterrows():
            ratio = r["err"] / r["bound"] if pd.notna(r["err"]) and r["bound"] else None
            details.append({"outcome": r["outcome"], "case": f"{r['family']}/{r['case']}",
                            "where": f"{r['device']}/{r['dtype']}",
                            "ratio": "-" if ratio is None or not np.isfinite(ratio)
                            else f"{ratio:.2f}x bound",
                            "reason": r["reason"] or "", "test_id": r["test_id"] or ""})
        passed = g[g["outcome"] == "pass"]
        closeness = passed["ratio"].replace([np.inf], np.nan).dropna()
        rows.append({"impl": impl, "cells": cells, "details": details,
                     "n": len(g), "median_ratio": f"{closeness.median():.2f}"
                     if len(closeness) else "-"})
    return {"families": families, "rows": rows}


def exponents(ok: pd.DataFrame) -> pd.DataFrame:
    fits = fit_exponent(ok)
    if fits.empty:
        return fits
    fits = fits.assign(interval=fits.apply(
        lambda r: f"{r['exponent']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]", axis=1))
    return fits.sort_values(["device", "mask", "exponent"])


def ranking(ok: pd.DataFrame, baseline_impl: Optional[str]) -> pd.DataFrame:
    """Per device, mask, H and length: fastest first, speed-up over the baseline impl."""
    if ok.empty:
        return ok
    keys = ["machine", "device", "dtype", "mask", "H", "Lq"]
    base = baseline_impl if baseline_impl in set(ok["impl"]) else ok["impl"].iloc[0]
    ref = ok[ok["impl"] == base].groupby(keys)["median_s"].median().rename("base_s")
    r = ok.merge(ref, left_on=keys, right_index=True, how="left")
    r = r.assign(speedup=r["base_s"] / r["median_s"], rank=r.groupby(keys)["median_s"].rank())
    r = r.sort_values([*keys, "rank"])
    r.attrs["baseline_impl"] = base
    return r[[*keys, "rank", "impl", "median_s", "speedup", "flops_per_s"]]


def fastest(ok: pd.DataFrame) -> pd.DataFrame:
    """The fastest implementation per device, mask, H and length."""
    keys = ["machine", "device", "dtype", "mask", "H", "Lq"]
    idx = ok.groupby(keys)["median_s"].idxmin()
    return ok.loc[idx, [*keys, "impl", "median_s"]].sort_values(keys)


def compare_baseline(ok: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """Per point: ratio of medians, flagged only when the interquartile ranges do not overlap.

    regression: current q1 > baseline q3; improvement: current q3 < baseline q1;
    otherwise the difference lies within the measured spread ("within noise").
    """
    keys = ["machine", "impl", "device", "dtype", "B", "H", "H_kv", "Lq", "Lk", "D", "mask",
            "grad"]
    cur = ok.groupby(keys, dropna=False)[["median_s", "q1_s", "q3_s"]].median()
    old = base[base["status"] == "ok"].groupby(keys, dropna=False)[
        ["median_s", "q1_s", "q3_s"]].median()
    m = cur.join(old, lsuffix="", rsuffix="_base", how="inner").reset_index()
    if m.empty:  # different machines: compare without the machine key
        cur = ok.groupby(keys[1:], dropna=False)[["median_s", "q1_s", "q3_s"]].median()
        old = base[base["status"] == "ok"].groupby(keys[1:], dropna=False)[
            ["median_s", "q1_s", "q3_s"]].median()
        m = cur.join(old, lsuffix="", rsuffix="_base", how="inner").reset_index()
    m["ratio"] = m["median_s"] / m["median_s_base"]
    m["verdict"] = np.where(m["q1_s"] > m["q3_s_base"], "regression",
                            np.where(m["q3_s"] < m["q1_s_base"], "improvement", "within noise"))
    return m.sort_values(["verdict", "ratio"], ascending=[True, False])


def not_measured(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["machine", "impl", "device", "dtype", "Lq", "H", "mask", "status", "reason"]
    return df[df["status"] != "ok"][cols].sort_values(["status", "impl", "Lq"])


def to_html(df: pd.DataFrame, formats: Optional[Dict[str, str]] = None, max_rows: int = 400
            ) -> str:
    """A compact HTML table (escaped); numbers formatted per column."""
    if df is None or df.empty:
        return "<p class='muted'>none</p>"
    d = df.head(max_rows).copy()
    for col, fmt in (formats or {}).items():
        if col in d:
            d[col] = d[col].map(lambda v, f=fmt: "-" if pd.isna(v) else f.format(v))
    table = d.to_html(index=False, border=0, classes="data", escape=True, na_rep="-")
    if len(df) > max_rows:
        table += f"<p class='muted'>{len(df) - max_rows} more rows not shown</p>"
    return table


def esc(text: object) -> str:
    return html.escape(str(text))
