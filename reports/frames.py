"""Results files -> long-form pandas DataFrames, and the scaling-exponent fit.

Files are read (and checked) by ``suite.results.records``; this module only shapes them.
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

from suite.results import records
from suite.results.records import Document, machine_ids, read

PathLike = Union[str, Path]

SWEEP_COLUMNS = [
    "machine", "source", "datetime", "commit", "impl", "framework", "framework_version",
    "device", "dtype", "B", "H", "K", "L", "S", "E", "D", "mask", "grad",
    "median_s", "min_s", "mean_s", "stddev_s", "iqr_s", "q1_s", "q3_s", "rounds",
    "flops", "flops_attention", "flops_projections", "flops_per_s", "peak_flops", "peak_share",
    "peak_spread", "share_untrusted", "peak_bytes", "peak_method", "memory_untrusted",
    "compile_s", "verified",
    "status", "reason", "noisy"]
CONFORMANCE_COLUMNS = [
    "machine", "source", "created", "commit", "impl", "framework", "framework_version",
    "libraries", "device",
    "dtype", "family", "case", "test_id", "seed", "outcome", "err", "err_naive", "bound", "ratio",
    "k", "atol", "reason", "isa"]
# What identifies a point: the same point from two files of one machine is a rerun.
POINT_KEYS = ["machine", "impl", "device", "dtype", "B", "H", "K", "L", "S", "E", "D",
              "mask", "grad"]
FIT_KEYS = ["machine", "impl", "device", "dtype", "mask", "H", "B", "D"]
NUMERIC = ["median_s", "min_s", "mean_s", "stddev_s", "iqr_s", "q1_s", "q3_s", "flops",
           "flops_attention", "flops_projections", "flops_per_s", "peak_flops", "peak_spread",
           "peak_bytes", "compile_s"]
# When a share of the measured matmul peak cannot be trusted: above the peak itself (the peak
# was measured slow, under load, or the kernel beats the plain matmul), or a peak whose two
# measurements (before and after the points) differ by more than this share of the higher.
SHARE_LIMIT = 1.0
PEAK_SPREAD_LIMIT = 0.2


def _sweep_rows(d: Document, machine: str) -> List[dict]:
    facts = records.run_facts(d)
    peaks = facts["extra"].get("matmul_peak_flops") or {}
    runs = facts["extra"].get("matmul_peak_runs") or {}
    rows = records.sweep_rows(d)
    for row in rows:
        key = _peak_key(peaks, row.get("array_library") or row.get("framework"),
                        row.get("device"), row.get("dtype"))
        row.update(machine=machine, source=str(d.path), datetime=facts["datetime"],
                   commit=facts["commit"], peak_flops=peaks.get(key) if key else None,
                   peak_spread=(runs.get(key) or {}).get("spread") if key else None)
    return rows


# The recorded libraries whose versions make an environment (the array libraries kernels run
# on); the suite's own tools and the report's libraries do not.
ENVIRONMENT_LIBRARIES = ("numpy", "torch", "jax", "jaxlib")


def _conformance_rows(d: Document, machine: str) -> List[dict]:
    facts = records.run_facts(d)
    libs = facts["extra"].get("libraries") or {}
    libraries = "; ".join(f"{n} {libs[n]}" for n in ENVIRONMENT_LIBRARIES if libs.get(n))
    return [{**r, "machine": machine, "source": str(d.path), "created": facts["datetime"],
             "commit": facts["commit"], "libraries": libraries}
            for r in records.conformance_rows(d)]


def _float(x: Any) -> float:
    """Conformance files write non-finite floats as strings ('nan', 'inf')."""
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return math.nan
    return math.nan if x is None else float(x)


def _peak_key(peaks: Dict[str, float], framework: Any, device: Any, dtype: Any
              ) -> Optional[str]:
    """The matmul peak's key for framework:device:dtype, else any framework's on
    device:dtype, else None."""
    exact = f"{framework}:{device}:{dtype}"
    if peaks.get(exact) is not None:
        return exact
    return next((k for k in sorted(peaks) if k.endswith(f":{device}:{dtype}")), None)


def untrusted_share(share: Any, spread: Any) -> Optional[str]:
    """Why a point's share of the measured peak cannot be trusted, or None when it can:
    above ``SHARE_LIMIT``, or its peak's before/after spread above ``PEAK_SPREAD_LIMIT``."""
    why = []
    if share is not None and np.isfinite(share) and share > SHARE_LIMIT:
        why.append(f"{share:.0%} of the measured peak")
    if spread is not None and np.isfinite(spread) and spread > PEAK_SPREAD_LIMIT:
        why.append(f"peak spread {spread:.0%} before/after")
    return "; ".join(why) or None


# When a peak-memory point cannot be trusted. An RSS rise (suite.sweep.timing.peak_memory) under
# the floor is within what the process's own objects and glibc's heap (blocks under its
# pinned 128 KiB mmap threshold come from pages already resident) move by. And a problem
# never needs less memory than the same problem at a shorter length: a point under this
# share of a shorter length's found memory already resident (an allocator that keeps what
# it freed, as XLA's does on the CPU) and counted no rise.
RSS_FLOOR_BYTES = 2**20
MEMORY_DROP_LIMIT = 0.8
MEMORY_LINE_KEYS = ["machine", "impl", "device", "dtype", "B", "H", "K", "D", "mask", "grad",
                    "peak_method"]


def untrusted_memory(df: pd.DataFrame) -> pd.Series:
    """Per row, why its peak memory cannot be trusted, or None when it can: an RSS rise
    under ``RSS_FLOOR_BYTES``, or under ``MEMORY_DROP_LIMIT`` times the most the same line
    (``MEMORY_LINE_KEYS``) measured at a shorter length."""
    out = pd.Series(None, index=df.index, dtype=object)
    measured = df[(df["status"] == "ok") & (df["peak_bytes"] > 0)
                  & df["peak_method"].ne("not measured")].sort_values("L", kind="stable")
    if measured.empty:
        return out
    shorter = measured.groupby(MEMORY_LINE_KEYS, dropna=False)["peak_bytes"].transform(
        lambda s: s.cummax().shift())  # the most at any shorter length of the line
    for i, r in measured.iterrows():
        if r["peak_method"] == "rss_hwm_delta" and r["peak_bytes"] < RSS_FLOOR_BYTES:
            out[i] = (f"RSS rise {r['peak_bytes'] / 2**10:.0f} KiB, under the "
                      f"{RSS_FLOOR_BYTES / 2**20:g} MiB noise floor")
        elif np.isfinite(shorter[i]) and r["peak_bytes"] < MEMORY_DROP_LIMIT * shorter[i]:
            out[i] = (f"{r['peak_bytes'] / 2**20:.3g} MiB, less than the "
                      f"{shorter[i] / 2**20:.3g} MiB of a shorter length")
    return out


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
    df["share_untrusted"] = [untrusted_share(a, b) for a, b in
                             zip(df["peak_share"], df["peak_spread"])]
    df = _newest(df, POINT_KEYS, "datetime").reset_index(drop=True)
    df["memory_untrusted"] = untrusted_memory(df)
    return df


def conformance_frame(docs: List[Document]) -> pd.DataFrame:
    ids = machine_ids(docs)
    rows = [r for d in docs if d.kind == "conformance"
            for r in _conformance_rows(d, ids[d.path])]
    df = pd.DataFrame(rows).reindex(columns=CONFORMANCE_COLUMNS)
    for c in ("err", "err_naive", "bound", "ratio", "k", "atol"):
        df[c] = df[c].map(_float).astype(float)
    # A rerun at the same library versions replaces a case; another version (of the
    # framework or of the array library under it) is another environment (a compat matrix
    # merges several into one report), kept beside it.
    # Each CPU instruction-set level (suite.plugins.isa) is its own verdict, kept beside the others.
    df = _newest(df, ["machine", "impl", "framework_version", "libraries", "device", "isa",
                      "dtype", "test_id"], "created")
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


def fit_exponent(df: pd.DataFrame, min_points: int = 4) -> pd.DataFrame:
    """Fit the cost model t(L) = a + b·L + c·L² per group and report its scaling at the
    largest length.

    Groups: ``FIT_KEYS`` (plus ``grad`` and ``K`` when present: forward and backward
    never share a fit). Times are each point's fastest round (``min_s``, ``median_s``
    where a file lacks it): on a shared machine other work only ever adds time. Every
    measured length is used: the constant and linear terms take
    the overheads and projections that bend a log-log line at short lengths, so no length
    is thrown away. Least squares on relative residuals ((model - t) / t: each length
    weighs the same whatever its time). At L_max: ``exponent`` = d ln t / d ln L =
    (b·L + 2c·L²) / t(L), between 0 and 2 for a model with non-negative terms, with its
    95% interval (delta method, t distribution with n - 3 degrees of freedom), and
    ``quadratic_share`` = c·L² / t(L). ``worst_residual`` is the measured time's largest
    relative distance from the model, at ``worst_L``: a wide interval with a large one there
    is a kernel changing regime at that length (a rerun misses there again) or a disturbed
    point (a rerun does not), not noise spread over every point. A group with fewer than
    ``min_points`` lengths is left out. Columns: the keys, exponent, ci_low, ci_high,
    quadratic_share, worst_residual, worst_L, n_points, L_min, L_max.
    """
    from scipy import stats

    if min_points < 4:
        raise ValueError(f"min_points: expected >= 4 (three terms and an interval need "
                         f"n - 3 > 0), got {min_points}")
    keys = FIT_KEYS + [k for k in ("grad", "K") if k in df.columns]
    columns = [*keys, "exponent", "ci_low", "ci_high", "quadratic_share", "worst_residual",
               "worst_L", "n_points", "L_min", "L_max"]
    # The fastest round: on a shared machine other work only ever adds time to a call.
    time = "min_s" if "min_s" in df.columns and df["min_s"].notna().all() else "median_s"
    ok = df[(df["status"] == "ok") & (df[time] > 0) & (df["L"] > 0)]
    rows = []
    for key, g in ok.groupby(keys, dropna=False, sort=True):
        per_length = g.groupby("L")[time].median()  # (n,)
        if len(per_length) < min_points:
            continue
        lengths, t = per_length.index.to_numpy(float), per_length.to_numpy(float)
        u = lengths / lengths.max()  # (n,) lengths in units of L_max: a well-conditioned fit
        X = np.stack([np.ones_like(u), u, u**2], axis=1) / t[:, None]  # (n, 3) relative
        coef, *_ = np.linalg.lstsq(X, np.ones_like(u), rcond=None)  # (3,) a, b, c at u = 1
        dof = len(u) - 3
        residual = X @ coef - 1.0  # (n,) relative errors: (model - t) / t
        worst = int(np.argmax(np.abs(residual)))
        cov = (residual @ residual / dof) * np.linalg.pinv(X.T @ X)  # (3, 3)
        a, b, c = coef
        top = a + b + c  # the model's time at L_max
        exponent = (b + 2 * c) / top
        grad = np.array([-exponent, 1.0 - exponent, 2.0 - exponent]) / top  # d exponent/d coef
        half = float(stats.t.ppf(0.975, dof) * np.sqrt(max(grad @ cov @ grad, 0.0)))
        rows.append({**dict(zip(keys, key)), "exponent": float(exponent),
                     "ci_low": float(exponent) - half, "ci_high": float(exponent) + half,
                     "quadratic_share": float(c / top),
                     "worst_residual": float(abs(residual[worst])),
                     "worst_L": int(lengths[worst]), "n_points": len(u),
                     "L_min": int(lengths.min()), "L_max": int(lengths.max())})
    return pd.DataFrame(rows, columns=columns)
