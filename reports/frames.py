"""Results files -> long-form pandas DataFrames, and the scaling-exponent fit.

Files are read (and checked) by ``suite.records``; this module only shapes them.
``load(paths)`` reads any mix of sweep files (pytest-benchmark JSON) and conformance
files, or directories of them (every ``*.json`` inside, recursively). Sweeps give one row
per point x implementation, measured or not; conformance gives one row per case result.
A point (or case) found in several files of the same machine is kept from the newest
file, so a rerun replaces what it re-measured. Times are in seconds, memory in bytes,
throughput in FLOP/s. Only report code imports this module (it needs pandas).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
import pandas as pd

from suite import records
from suite.records import Document, machine_ids, read

PathLike = Union[str, Path]

SWEEP_COLUMNS = [
    "machine", "source", "datetime", "commit", "impl", "framework", "framework_version",
    "device", "dtype", "B", "H", "H_kv", "Lq", "Lk", "E", "D", "mask", "grad",
    "median_s", "min_s", "mean_s", "stddev_s", "iqr_s", "q1_s", "q3_s", "rounds",
    "flops", "flops_attention", "flops_projections", "flops_per_s", "peak_flops", "peak_share",
    "peak_bytes", "peak_method", "compile_s", "verified", "status", "reason"]
CONFORMANCE_COLUMNS = [
    "machine", "source", "created", "commit", "impl", "framework", "framework_version", "device",
    "dtype", "family", "case", "test_id", "seed", "outcome", "err", "err_naive", "bound", "ratio",
    "k", "atol", "reason"]
# What identifies a point: the same point from two files of one machine is a rerun.
POINT_KEYS = ["machine", "impl", "device", "dtype", "B", "H", "H_kv", "Lq", "Lk", "E", "D",
              "mask", "grad"]
FIT_KEYS = ["machine", "impl", "device", "dtype", "mask", "H", "B", "D"]
NUMERIC = ["median_s", "min_s", "mean_s", "stddev_s", "iqr_s", "q1_s", "q3_s", "flops",
           "flops_attention", "flops_projections", "flops_per_s", "peak_flops", "peak_bytes",
           "compile_s"]


def _sweep_rows(d: Document, machine: str) -> List[dict]:
    facts = records.run_facts(d)
    peaks = facts["extra"].get("matmul_peak_flops") or {}
    rows = records.sweep_rows(d)
    for row in rows:
        row.update(machine=machine, source=str(d.path), datetime=facts["datetime"],
                   commit=facts["commit"], peak_flops=_peak(peaks, row.get("framework"),
                                                            row.get("device"), row.get("dtype")))
    return rows


def _conformance_rows(d: Document, machine: str) -> List[dict]:
    facts = records.run_facts(d)
    return [{**r, "machine": machine, "source": str(d.path), "created": facts["datetime"],
             "commit": facts["commit"]} for r in records.conformance_rows(d)]


def _float(x: Any) -> float:
    """Conformance files write non-finite floats as strings ('nan', 'inf')."""
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return math.nan
    return math.nan if x is None else float(x)


def _peak(peaks: Dict[str, float], framework: Any, device: Any, dtype: Any) -> Optional[float]:
    """The matmul peak for framework:device:dtype, else any framework's on device:dtype."""
    exact = peaks.get(f"{framework}:{device}:{dtype}")
    if exact is not None:
        return exact
    return next((v for k, v in sorted(peaks.items()) if k.endswith(f":{device}:{dtype}")), None)


def _newest(df: pd.DataFrame, keys: List[str], when: str) -> pd.DataFrame:
    """Keep, per key, the row of the newest file (a rerun replaces the earlier point)."""
    if df.empty:
        return df
    order = df.assign(_when=df[when].fillna("").astype(str)).sort_values("_when", kind="stable")
    return order.drop_duplicates(keys, keep="last").drop(columns="_when").sort_index()


def sweeps_frame(docs: List[Document]) -> pd.DataFrame:
    ids = machine_ids(docs)
    rows = [r for d in docs if d.kind == "sweep" for r in _sweep_rows(d, ids[d.path])]
    df = pd.DataFrame(rows).reindex(columns=SWEEP_COLUMNS)
    for c in NUMERIC:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df["peak_share"] = df["flops_per_s"] / df["peak_flops"]
    df = _newest(df, POINT_KEYS, "datetime")
    return df.reset_index(drop=True)


def conformance_frame(docs: List[Document]) -> pd.DataFrame:
    ids = machine_ids(docs)
    rows = [r for d in docs if d.kind == "conformance"
            for r in _conformance_rows(d, ids[d.path])]
    df = pd.DataFrame(rows).reindex(columns=CONFORMANCE_COLUMNS)
    for c in ("err", "err_naive", "bound", "ratio", "k", "atol"):
        df[c] = df[c].map(_float).astype(float)
    df = _newest(df, ["machine", "impl", "device", "dtype", "test_id"], "created")
    return df.reset_index(drop=True)


def load_sweeps(paths: Iterable[PathLike]) -> pd.DataFrame:
    """One row per point x implementation, measured (status "ok") or not."""
    return sweeps_frame(read(paths))


def load_conformance(paths: Iterable[PathLike]) -> pd.DataFrame:
    """One row per conformance result, with machine, framework, framework_version."""
    return conformance_frame(read(paths))


def load(paths: Iterable[PathLike]) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """(sweeps, conformance) from files or directories, sorted by each file's kind."""
    docs = read(paths)
    return sweeps_frame(docs), conformance_frame(docs)


def fit_exponent(df: pd.DataFrame, upper_fraction: float = 0.5, min_points: int = 3
                 ) -> pd.DataFrame:
    """Fit log(median_s) = a + b log(Lq) per group, over the upper part of the lengths.

    Groups: ``FIT_KEYS`` (plus ``grad`` and ``H_kv`` when present: forward and backward
    never share a fit). Lengths used: those >= the (1 - upper_fraction) quantile of the
    group's lengths (the median for 0.5), widened to the ``min_points`` largest when fewer;
    a group with fewer than ``min_points`` lengths is left out. b's 95% interval uses the
    t distribution with n - 2 degrees of freedom. Columns: the keys, exponent, ci_low,
    ci_high, n_points, L_min, L_max.
    """
    from scipy import stats

    if not 0 < upper_fraction <= 1:
        raise ValueError(f"upper_fraction: expected a value in (0, 1], got {upper_fraction}")
    if min_points < 3:
        raise ValueError(f"min_points: expected >= 3 (an interval needs n - 2 > 0), "
                         f"got {min_points}")
    keys = FIT_KEYS + [k for k in ("grad", "H_kv") if k in df.columns]
    columns = [*keys, "exponent", "ci_low", "ci_high", "n_points", "L_min", "L_max"]
    ok = df[(df["status"] == "ok") & (df["median_s"] > 0) & (df["Lq"] > 0)]
    rows = []
    for key, g in ok.groupby(keys, dropna=False, sort=True):
        per_length = g.groupby("Lq")["median_s"].median()  # (n_lengths,)
        lengths = per_length.index.to_numpy(float)
        if len(lengths) < min_points:
            continue
        upper = lengths[lengths >= np.quantile(lengths, 1 - upper_fraction)]
        if len(upper) < min_points:
            upper = lengths[-min_points:]
        sel = per_length.loc[upper]
        x, y = np.log(sel.index.to_numpy(float)), np.log(sel.to_numpy(float))
        fit = stats.linregress(x, y)
        half = float(stats.t.ppf(0.975, len(x) - 2) * fit.stderr)
        rows.append({**dict(zip(keys, key)), "exponent": float(fit.slope),
                     "ci_low": float(fit.slope) - half, "ci_high": float(fit.slope) + half,
                     "n_points": len(x), "L_min": int(upper.min()), "L_max": int(upper.max())})
    return pd.DataFrame(rows, columns=columns)
