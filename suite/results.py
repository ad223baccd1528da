"""Results files -> long-form pandas DataFrames, and the scaling-exponent fit.

``load(paths)`` reads any mix of sweep files (pytest-benchmark JSON) and
conformance files, or directories of them; one row per point x implementation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, List, Tuple, Union

import numpy as np
import pandas as pd

SWEEP_COLUMNS = [
    "machine", "source", "datetime", "commit", "impl", "framework", "framework_version",
    "device", "dtype", "B", "H", "H_kv", "Lq", "Lk", "E", "D", "mask", "grad",
    "median_s", "min_s", "mean_s", "stddev_s", "iqr_s", "q1_s", "q3_s", "rounds",
    "flops", "flops_attention", "flops_projections", "flops_per_s", "peak_flops", "peak_share",
    "peak_bytes", "peak_method", "compile_s", "status", "reason"]
CONFORMANCE_COLUMNS = [
    "machine", "source", "created", "commit", "impl", "framework", "framework_version", "device",
    "dtype", "family", "case", "test_id", "seed", "outcome", "err", "err_naive", "bound", "ratio",
    "k", "atol", "reason"]
PathLike = Union[str, Path]


def _files(paths: Iterable[PathLike]) -> List[Path]:
    out: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(p.rglob("*.json"))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"results: {p} does not exist")
    return out


def _kind(doc: dict) -> str:
    if doc.get("kind") == "mha-suite/conformance":
        return "conformance"
    if "benchmarks" in doc and "machine_info" in doc:
        return "sweep"
    return "other"


def _read(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"results: {path} is not a readable JSON file ({exc})") from exc


def _float(x):
    """Conformance files write non-finite floats as strings ('nan', 'inf')."""
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return math.nan
    return math.nan if x is None else float(x)


def _sweep_rows(doc: dict, source: str) -> List[dict]:
    info = doc.get("machine_info", {})
    machine = info.get("node") or "unknown"
    commit = (doc.get("commit_info") or {}).get("id")
    peaks = (info.get("mha_suite") or {}).get("matmul_peak_flops", {})
    rows = []
    for b in doc.get("benchmarks", []):
        x = dict(b.get("extra_info", {}))
        s = b.get("stats", {})
        x.update(median_s=s.get("median"), min_s=s.get("min"), mean_s=s.get("mean"),
                 stddev_s=s.get("stddev"), iqr_s=s.get("iqr"), q1_s=s.get("q1"),
                 q3_s=s.get("q3"), rounds=s.get("rounds"), status=x.get("status") or "ok")
        rows.append(x)
    for x in doc.get("mha_suite_not_measured", []):
        rows.append(dict(x))
    for x in rows:
        x.update(machine=machine, source=source, datetime=doc.get("datetime"), commit=commit)
        peak = peaks.get(f"{x.get('framework')}:{x.get('device')}:{x.get('dtype')}")
        if peak is None:  # any framework's peak on this device and dtype
            peak = next((v for k, v in peaks.items()
                         if k.endswith(f":{x.get('device')}:{x.get('dtype')}")), None)
        x["peak_flops"] = peak
    return rows


def load_sweeps(paths: Iterable[PathLike]) -> pd.DataFrame:
    return load(paths)[0]


def load_conformance(paths: Iterable[PathLike]) -> pd.DataFrame:
    return load(paths)[1]


def load(paths: Iterable[PathLike]) -> Tuple[pd.DataFrame, pd.DataFrame]:
    """(sweeps, conformance) DataFrames from files or directories of them."""
    sweep_rows, conf_rows = [], []
    for path in _files(paths):
        doc = _read(path)
        kind = _kind(doc)
        if kind == "sweep":
            sweep_rows += _sweep_rows(doc, str(path))
        elif kind == "conformance":
            machine = (doc.get("machine") or {}).get("node", "unknown")
            impls = {i["name"]: i for i in doc.get("implementations", [])}
            for r in doc.get("results", []):
                meta = impls.get(r.get("impl"), {})
                conf_rows.append({**r, "machine": machine, "source": str(path),
                                  "created": doc.get("created"), "commit": doc.get("commit"),
                                  "framework": meta.get("framework"),
                                  "framework_version": meta.get("framework_version")})
    sweeps = pd.DataFrame(sweep_rows).reindex(columns=SWEEP_COLUMNS)
    if len(sweeps):
        for c in ("median_s", "min_s", "mean_s", "stddev_s", "iqr_s", "q1_s", "q3_s", "flops",
                  "flops_attention", "flops_projections", "flops_per_s", "peak_flops",
                  "peak_bytes", "compile_s"):
            sweeps[c] = pd.to_numeric(sweeps[c], errors="coerce")
        sweeps["peak_share"] = sweeps["flops_per_s"] / sweeps["peak_flops"]
    conformance = pd.DataFrame(conf_rows).reindex(columns=CONFORMANCE_COLUMNS)
    for c in ("err", "err_naive", "bound", "ratio"):
        conformance[c] = conformance[c].map(_float)
    return sweeps, conformance


FIT_KEYS = ["machine", "impl", "device", "dtype", "mask", "H", "B", "D"]


def fit_exponent(df: pd.DataFrame, upper_fraction: float = 0.5, min_points: int = 3
                 ) -> pd.DataFrame:
    """Fit log(median_s) = a + b log(Lq) per group over the upper part of the lengths.

    Uses lengths >= the group's quantile (1 - upper_fraction) of lengths, at least
    ``min_points`` of them (else the group is left out); b's 95% interval uses the t
    distribution with n - 2 degrees of freedom (infinite width for n = 2 is avoided by
    min_points >= 3).
    """
    from scipy import stats as st

    rows = []
    ok = df[(df["status"] == "ok") & (df["median_s"] > 0)]
    for key, g in ok.groupby(FIT_KEYS, dropna=False):
        lengths = np.sort(g["Lq"].unique())
        cut = np.quantile(lengths, 1 - upper_fraction) if len(lengths) else 0
        upper = lengths[lengths >= cut]
        if len(upper) < min_points:
            upper = lengths[-min_points:]
        sel = g[g["Lq"].isin(upper)].groupby("Lq")["median_s"].median()
        n = len(sel)
        if n < min_points:
            continue
        x, y = np.log(sel.index.to_numpy(float)), np.log(sel.to_numpy(float))
        fit = st.linregress(x, y)
        half = st.t.ppf(0.975, n - 2) * fit.stderr
        rows.append({**dict(zip(FIT_KEYS, key)), "exponent": fit.slope,
                     "ci_low": fit.slope - half, "ci_high": fit.slope + half, "n_points": n,
                     "L_min": int(sel.index.min()), "L_max": int(sel.index.max())})
    return pd.DataFrame(rows, columns=[*FIT_KEYS, "exponent", "ci_low", "ci_high", "n_points",
                                       "L_min", "L_max"])
