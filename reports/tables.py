"""Tables for the report, computed from the long-form DataFrames (pandas only)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from reports.styles import Style, assign, family_order, ordered
from reports.styles import families as impl_families
from suite.plugins.conditions import ISA_LEVELS
from suite.results.records import Document, machine_ids, run_facts
from suite.results.vocabulary import OUTCOME_ORDER as WORST_FIRST
from suite.results.vocabulary import Outcome as V


@dataclass(frozen=True)
class Outcome:
    """A conformance outcome as the report words it: in a matrix cell and in the headline."""

    name: str  # as results files record it
    cell: str  # the matrix's short text
    said: str  # the headline's phrase before the cases it names
    summary: str  # the headline's count of implementations whose worst outcome it is
    glyph: str  # the matrix's mark before a count: the outcome without its colour
    colour: str  # its cells' background (the page's CSS is written from these)


# The report's words for suite.results.vocabulary's outcomes, worst first; a glyph each, so a cell reads
# without its colour, and colours at least 20 apart in CIELAB (about 10 under the three
# colour-vision deficiencies): known failures orange, declared deviations blue.
_WORDING = {V.FAIL: ("FAIL", "fails", "fail", "✗", "#ee8a8a"),
            V.ERROR: ("ERROR", "raises an error in", "raise errors", "!", "#c58fe0"),
            V.FLAKY: ("FLAKY", "flaky in", "flaky", "≈", "#f7ef9c"),
            V.KNOWN_FAILURE: ("known failure", "known failures:", "with known failures", "⚑",
                              "#f9b56e"),
            V.DEVIATION: ("deviation", "deviates as declared", "deviate as declared", "Δ",
                          "#9fc8ee"),
            V.UNSUPPORTED: ("unsupported", "unsupported", "not available or no case run", "○",
                            "#ececec"),
            V.PASS: ("pass", "conforms", "conform", "✓", "#d3eecb")}
OUTCOMES = tuple(Outcome(o.value, *_WORDING[o]) for o in WORST_FIRST)
OUTCOME = {o.name: o for o in OUTCOMES}
OUTCOME_ORDER = [o.name for o in OUTCOMES]
SHORT = {o.name: o.cell for o in OUTCOMES}
RANK_KEYS = ["machine", "device", "dtype", "B", "D", "mask", "H", "L"]
COMPARE_KEYS = ["machine", "impl", "device", "dtype", "B", "H", "K", "L", "S", "D", "mask",
                "grad"]


# --- environment ---------------------------------------------------------------------------
def environment(docs: List[Document]) -> List[Dict[str, Any]]:
    """One card per results file's machine: CPU, GPUs, libraries, threads, commit, when."""
    ids = machine_ids(docs)
    natives = native_levels(docs, ids)
    out = []
    for d in docs:
        f = run_facts(d)
        extra = f["extra"]
        card = {"kind": d.kind, "machine": ids[d.path], "file": d.path.name, "cpu": f["cpu"],
                "system": f["system"], "python": f["python"], "commit": f["commit"],
                "dirty": f["dirty"], "when": _when(f["datetime"]),
                "libraries": _libraries(extra.get("libraries")), "cores": extra.get("cores"),
                "isa": _isa(natives.get(ids[d.path]), d)}
        if d.kind == "sweep":
            card.update(
                preset=extra.get("preset") or d.doc.get("mha_suite_preset"),
                gpus=extra.get("gpus") or [], threads=_threads(extra.get("threads") or {}),
                peaks=_peaks(extra),
                points=len(d.doc.get("benchmarks") or []),
                not_measured=len(d.doc.get("mha_suite_not_measured") or []))
        else:
            card.update(preset=None, cases=len(d.doc.get("results") or []))
        out.append(card)
    return out


def _peaks(extra: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(framework:device:dtype, text) per matmul peak: the higher of the two measurements
    (before and after the points; shares use it), both, and their spread."""
    runs = extra.get("matmul_peak_runs") or {}
    out = []
    for key, best in sorted((extra.get("matmul_peak_flops") or {}).items()):
        text = f"{best / 1e9:.0f} GFLOP/s"
        run = runs.get(key) or {}
        if run.get("before") is not None and run.get("after") is not None:
            text += (f" (before {run['before'] / 1e9:.0f}, after {run['after'] / 1e9:.0f}, "
                     f"spread {100 * run['spread']:.0f}%)")
        out.append((key, text))
    return out


def native_levels(docs: List[Document], ids: Dict[Any, str]) -> Dict[str, str]:
    """Per machine, the CPU level torch picks natively there (suite.plugins.isa), as any of its files
    records it: one answer for every card of the machine. A file written where torch was
    never imported (the conformance run's main process) records none; its sweep does."""
    out: Dict[str, str] = {}
    for d in docs:
        native = run_facts(d)["extra"].get("isa_native")
        if native:
            out.setdefault(ids[d.path], str(native))
    return out


def _isa(native: Optional[str], d: Document) -> Optional[str]:
    """The CPU instruction-set levels of a file (suite.plugins.isa): its machine's native level
    (``native_levels``) and those its records ran at (each record's ``isa``), lowest first;
    a sweep's points record none (a sweep pins no level); None when neither is known."""
    items = (d.doc.get("results") or []) if d.kind == "conformance" else \
        [b.get("extra_info") or {} for b in d.doc.get("benchmarks") or []]
    ran = {str(r["isa"]) for r in items if isinstance(r, dict) and r.get("isa")}
    if not native and not ran:
        return None
    order = {lv: i for i, lv in enumerate(ISA_LEVELS)}
    text = f"native {native or 'not recorded'}; "
    if ran:
        return text + "ran at " + ", ".join(sorted(ran, key=lambda lv: (order.get(lv, len(order)),
                                                                        lv)))
    if d.kind == "sweep":
        return text + ("points record no level: torch's native one unless "
                       "ATEN_CPU_CAPABILITY pinned another")
    return text + "its records name no level"


def _threads(t: Dict[str, Any]) -> str:
    parts = []
    if t.get("requested"):
        parts.append(f"{t['requested']} requested")
    parts += [f"{b.get('internal_api')} {b.get('num_threads')}" for b in t.get("blas") or []]
    if t.get("torch"):
        parts.append(f"torch {t['torch']}")
    if t.get("omp_env"):
        parts.append(f"OMP_NUM_THREADS={t['omp_env']}")
    return ", ".join(parts) or "-"


def _libraries(libs: Optional[Dict[str, Any]]) -> str:
    return ", ".join(f"{k} {v}" for k, v in (libs or {}).items() if v) or "-"


def _when(text: Optional[str]) -> str:
    return (text or "-").replace("T", " ")[:19]


def implementations(docs: List[Document], styles: Optional[Dict[str, Style]] = None
                    ) -> List[Dict[str, Any]]:
    """Implementations named by conformance files: availability and declared deviations;
    available ones first, grouped by family, by name within a family."""
    seen: Dict[str, Dict[str, Any]] = {}
    versions_seen: Dict[str, List[str]] = {}
    for d in docs:
        for i in d.doc.get("implementations") or [] if d.kind == "conformance" else []:
            known = versions_seen.setdefault(i.get("name"), [])
            if i.get("framework_version") and i.get("framework_version") not in known:
                known.append(i.get("framework_version"))
            seen[i.get("name")] = {
                "name": i.get("name"), "framework": i.get("framework"),
                # every version a results file checked it at (a compat matrix has several)
                "version": ", ".join(sorted(known, key=_version_key)) or None,
                "source": i.get("source"),
                "available": i.get("available", True), "error": i.get("error"),
                "devices": ", ".join(i.get("devices") or []) or "-",
                "features": ", ".join(i.get("features") or []),
                "left": dict(i.get("left_to_check") or {}),
                "policies": sorted(set(_labels(i.get("deviations") or {}))
                                   - set(i.get("stale_deviations") or [])),
                "deviations": sorted(
                    (label, _declared(d) + (" (stale: no case needed it)"
                                            if label in (i.get("stale_deviations") or []) else ""))
                    for label, d in _labels(i.get("deviations") or {}).items())}
    fams = styles_or_own(styles, [(n, r["framework"]) for n, r in seen.items()])
    order = {f: i for i, f in enumerate(family_order(s.family for s in fams.values()))}
    for r in seen.values():
        r["family"] = fams[r["name"]].family if r["name"] in fams else "-"
    return sorted(seen.values(), key=lambda r: (not r["available"], order.get(r["family"], 0),
                                                r["name"] or ""))


def styles_or_own(styles: Optional[Dict[str, Style]], pairs: List[Any]) -> Dict[str, Style]:
    """``styles`` when it names every implementation of ``pairs`` (impl, framework), else
    an assignment of its own."""
    names = {str(i) for i, _ in pairs if i is not None}
    if styles is not None and names <= set(styles):
        return styles
    return assign(impl_families(pairs))


def _labels(deviations: Dict[str, Any]) -> Dict[str, Any]:
    """label -> {policy, reason}: the behaviour, or ``behaviour[dtype]`` for each dtype of a
    declaration that depends on the dtype (stored as dtype -> {policy, reason})."""
    out = {}
    for b, d in deviations.items():
        if isinstance(d, dict) and "policy" not in d and all(isinstance(v, dict)
                                                             for v in d.values()):
            out.update({f"{b}[{dtype}]": v for dtype, v in d.items()})
        else:
            out[b] = d
    return out


def _declared(d: Any) -> str:
    """A declared deviation as text: 'policy: reason' (older files hold the reason alone)."""
    return f"{d.get('policy')}: {d.get('reason')}" if isinstance(d, dict) else str(d)


# --- conformance ---------------------------------------------------------------------------
def _environment(conf: pd.DataFrame) -> pd.Series:
    """Per row: its framework version and the array libraries' versions of its file."""
    return (conf["framework_version"].fillna("?").astype(str) + " | "
            + conf["libraries"].fillna("").astype(str))


def several_versions(conf: pd.DataFrame) -> pd.Series:
    """Per row: whether its machine checked its implementation at more than one library
    version (a compat matrix merged into one report)."""
    if conf.empty:
        return pd.Series(False, index=conf.index)
    env = conf.assign(_env=_environment(conf))
    return env.groupby(["machine", "impl"])["_env"].transform("nunique") > 1


def _library_versions(text: Any) -> Dict[str, str]:
    return dict(part.split(" ", 1) for part in str(text or "").split("; ") if " " in part)


def version_labels(conf: pd.DataFrame) -> pd.Series:
    """Per row: "framework version", with the array libraries whose versions differ between
    the runs of its implementation on its machine ("flax 0.12.8 on jax 0.10.0")."""
    label = (conf["framework"].fillna("").astype(str) + " "
             + conf["framework_version"].fillna("?").astype(str))
    for _, g in conf.groupby(["machine", "impl"]):
        libs = {i: _library_versions(t) for i, t in g["libraries"].items()}
        names = sorted({n for d in libs.values() for n in d})
        # the libraries whose versions differ, less those that follow the framework's own
        # version (jax.nn's jax and jaxlib): "jax 0.6.2", not "jax 0.6.2 on jax 0.6.2"
        own = g["framework_version"].astype(str)
        varying = [n for n in names if len({d.get(n) for d in libs.values()}) > 1
                   and not all(libs[i].get(n) == own[i] for i in libs)]
        if varying:
            for i, d in libs.items():
                label[i] += " on " + ", ".join(f"{n} {d.get(n, '-')}" for n in varying)
    return label


def by_version(conf: pd.DataFrame) -> pd.DataFrame:
    """The rows with the library versions added to the machine's name where one machine
    checked an implementation at several (``version_labels``): each version is then a row of
    its own in the matrix and the headline (a verdict belongs to an implementation in an
    environment)."""
    several = several_versions(conf)
    if not several.any():
        return conf
    conf = conf.copy()
    labels = version_labels(conf)
    conf.loc[several, "machine"] = (conf["machine"].astype(str) + ", " + labels)[several]
    return conf


def versions(conf: pd.DataFrame) -> List[Dict[str, Any]]:
    """Outcome counts per (implementation, library version) (and machine when several),
    for the implementations checked at more than one version: one row each, the worst outcome
    first (unsupported cases are no finding), in name then version order."""
    several = several_versions(conf)
    if not several.any():
        return []
    multi = conf["machine"].nunique() > 1
    conf = conf.assign(_label=version_labels(conf))
    rows = []
    for (impl, machine, label), g in conf[several].groupby(["impl", "machine", "_label"]):
        counts = g["outcome"].where(g["outcome"].isin(OUTCOME_ORDER), "error").value_counts()
        worst = next((o for o in OUTCOME_ORDER if counts.get(o) and o != "unsupported"),
                     "unsupported")
        rows.append({"impl": impl, "machine": machine if multi else "",
                     "version": label, "outcome": worst,
                     "counts": {o: int(counts.get(o, 0)) for o in OUTCOME_ORDER},
                     "_key": (impl, str(machine), _version_key(label.split(" ", 1)[-1]))})
    rows.sort(key=lambda r: r.pop("_key"))
    return rows


def _version_key(version: str) -> Tuple:
    """A release's number as a tuple for ordering (5.3.0 before 5.12.0); text parts last."""
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x)
                 for x in re.split(r"[.+-]", version))


def anchor(impl: str, machine: Optional[str] = None) -> str:
    """The id of an implementation's conformance details (per machine when several)."""
    name = f"{impl}-{machine}" if machine else str(impl)
    return "impl-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


def _cell(r: pd.Series) -> Dict[str, str]:
    """One case result: the outcome, a short text (error vs bound) and the reason."""
    outcome = r["outcome"] if r["outcome"] in SHORT else "error"
    text = SHORT[outcome]
    if outcome in ("pass", "fail") and np.isfinite(r["err"]) and r["bound"] > 0:
        text += f" {r['err'] / r['bound']:.2g}×bound"
    elif outcome == "fail" and not np.isfinite(r["err"]):
        text += " (non-finite)"
    return {"outcome": outcome, "glyph": OUTCOME[outcome].glyph, "text": text,
            "reason": r["reason"] or ""}


def _family_cell(counts: pd.Series, worst: str) -> Dict[str, Any]:
    """A matrix cell: its worst outcome, and a glyph and a count per outcome (worst first),
    in words in ``title`` ("3 known failure, 3 pass")."""
    marks = [{"outcome": o, "glyph": OUTCOME[o].glyph, "n": int(counts[o])}
             for o in OUTCOME_ORDER if counts.get(o)]
    return {"outcome": worst, "marks": marks,
            "title": ", ".join(f"{m['n']} {OUTCOME[m['outcome']].cell}" for m in marks)}


CASE_COLUMNS = ["family", "case", "where", "outcome", "err", "bound", "reason", "test_id"]


def _by_case(g: pd.DataFrame) -> List[Tuple[Tuple[str, str], List[Dict[str, Any]]]]:
    """((family, case), its rows as records) in the order of family and case, each case's
    rows in the frame's order, a row without a family or case left out: what
    ``g.groupby(["family", "case"], sort=True)`` gives, without a DataFrame per case (a
    thousand cases an implementation took seconds)."""
    out: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for r in g[CASE_COLUMNS].to_dict("records"):
        if not (pd.isna(r["family"]) or pd.isna(r["case"])):
            out.setdefault((r["family"], r["case"]), []).append(r)
    return sorted(out.items(), key=lambda kv: kv[0])


def conformance_matrix(conf: pd.DataFrame, styles: Optional[Dict[str, Style]] = None
                       ) -> Dict[str, Any]:
    """Implementation x case-family cells (worst outcome, counts), each expandable to its
    cases; implementations grouped by framework family ("groups": name, colour, rows), in
    the families' fixed order, by name within a group."""
    if conf.empty:
        return {"families": [], "rows": [], "groups": []}
    styles = styles_or_own(styles, list(zip(conf["impl"], conf["framework"])))
    # where a case ran: the device, with the CPU level its library dispatched to (suite.plugins.isa)
    level = conf["isa"].map(lambda x: f"[{x}]" if isinstance(x, str) and x else "") \
        if "isa" in conf else ""
    conf = conf.assign(where=conf["device"].astype(str) + level + " " + conf["dtype"].astype(str))
    multi = conf["machine"].nunique() > 1
    families = sorted(conf["family"].dropna().unique())
    rows = []
    for (machine, impl), g in conf.groupby(["machine", "impl"]):
        cells = []
        for fam in families:
            counts = g[g["family"] == fam]["outcome"].value_counts()
            worst = next((o for o in OUTCOME_ORDER if counts.get(o)), "none")
            cells.append(_family_cell(counts, worst))
        wheres = sorted(g["where"].unique())
        cases = []
        for (fam, case), c in _by_case(g):
            by_where = {r["where"]: _cell(r) for r in c}
            cases.append({"name": f"{fam}/{case}", "test_id": c[0]["test_id"] or "",
                          "cells": [by_where.get(w) for w in wheres]})
        notes = [{"outcome": _cell(r)["outcome"], "case": f"{r['family']}/{r['case']}",
                  "where": r["where"], "reason": r["reason"] or "", "test_id": r["test_id"]}
                 for _, r in g[g["outcome"] != "pass"].sort_values(
                     ["outcome", "family", "case"]).iterrows()]
        closeness = g.loc[g["outcome"] == "pass", "ratio"].replace(np.inf, np.nan).dropna()
        counts = g["outcome"].value_counts()
        rows.append({"impl": f"{impl} ({machine})" if multi else impl, "cells": cells,
                     "anchor": anchor(impl, machine if multi else None),
                     "name": impl, "machine": machine, "family": styles[impl].family,
                     "wheres": wheres, "cases": cases, "notes": notes,
                     "summary": ", ".join(f"{counts[o]} {OUTCOME[o].cell}"
                                          for o in OUTCOME_ORDER if counts.get(o)),
                     "median_ratio": f"{closeness.median():.2f}" if len(closeness) else "-"})
    order = family_order(r["family"] for r in rows)
    rows.sort(key=lambda r: (order.index(r["family"]), r["name"], r["machine"]))
    groups = [{"name": fam, "colour": styles[next(r["name"] for r in rows
                                                  if r["family"] == fam)].family_colour,
               "rows": [r for r in rows if r["family"] == fam]} for fam in order]
    return {"families": families, "rows": rows, "groups": groups}


# --- scaling -------------------------------------------------------------------------------
def exponents(fits: pd.DataFrame, ok: pd.DataFrame,
              styles: Optional[Dict[str, Style]] = None) -> pd.DataFrame:
    """The fits (``fit_exponent(ok)``), one row per implementation (grouped by family, from
    ``ok``), one column per measured setting."""
    if fits.empty:
        return fits
    fits = fits.assign(
        cell=[f"{e:.2f} [{lo:.2f}, {hi:.2f}] · L² {q:.0%} · off {w:.0%} at {wl}"
              for e, lo, hi, q, w, wl in
              fits[["exponent", "ci_low", "ci_high", "quadratic_share", "worst_residual",
                    "worst_L"]].itertuples(index=False)],
        setting=[" · ".join(str(v) for v in vals) for vals in
                 fits[["device", "dtype", "mask"]].itertuples(index=False)],
        H=fits["H"].map(lambda h: f"H={h}"))
    index = ["machine", "impl"] if fits["machine"].nunique() > 1 else ["impl"]
    columns = ["setting", "H"] if fits["H"].nunique() > 1 else ["setting"]
    table = fits.pivot_table(index=index, columns=columns, values="cell", aggfunc="first")
    table.columns = [" · ".join(c) if isinstance(c, tuple) else c for c in table.columns]
    table = table.reset_index()
    rank = {impl: i for i, impl in enumerate(ordered(styles_or_own(
        styles, list(zip(ok["impl"], ok["framework"])))))}
    return table.sort_values(index, key=lambda c: c.map(rank) if c.name == "impl" else c,
                             kind="stable").reset_index(drop=True)


def exponent_ranges(fits: pd.DataFrame) -> str:
    """The length range each fit (``fit_exponent``) used, e.g. 'L = 1024..4096 (3 lengths)'."""
    if fits.empty:
        return ""
    spans = sorted({(int(a), int(b), int(n)) for a, b, n in
                    fits[["L_min", "L_max", "n_points"]].itertuples(index=False)})
    return "; ".join(f"L = {a}..{b} ({n} lengths)" for a, b, n in spans)


def pick_baseline_impl(ok: pd.DataFrame, wanted: Optional[str]) -> Optional[str]:
    """``wanted`` when measured, else "numpy", else the first implementation by name."""
    names = sorted(ok["impl"].dropna().unique())
    for name in (wanted, "numpy"):
        if name in names:
            return name
    return names[0] if names else None


NOISY_MARK = "(noisy)"  # a ranking entry whose point's rounds spread too widely


def ranking(ok: pd.DataFrame, baseline_impl: Optional[str]) -> pd.DataFrame:
    """Per point: implementations fastest first, each with its speed-up over the baseline.

    The order is one column of text ("1 torch.sdpa 3.10× · 2 jax.jit 2.52× ..."), each entry
    held together by no-break spaces, so the browser wraps the list between entries
    whatever the number of implementations.
    """
    if ok.empty:
        return pd.DataFrame()
    keys = [k for k in RANK_KEYS if k in ("mask", "H", "L") or ok[k].nunique() > 1]
    # a point whose rounds spread too widely for these ratios is marked (suite.sweep.timing.spread)
    noisy = ok["noisy"].notna() if "noisy" in ok else pd.Series(False, index=ok.index)
    med = ok.assign(noisy=noisy).groupby([*keys, "impl"], dropna=False).agg(
        median_s=("median_s", "median"), noisy=("noisy", "any")).reset_index()
    base = med[med["impl"] == baseline_impl].set_index(keys)["median_s"]
    column = ("fastest first, speed-up over " + baseline_impl) if baseline_impl else \
        "fastest first"
    rows = []
    for key, g in med.groupby(keys, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        ref = base.get(key, np.nan) if len(keys) > 1 else base.get(key[0], np.nan)
        row = dict(zip(keys, key))
        row["fastest (ms)"] = f"{g['median_s'].min() * 1e3:.3g}"
        entries = []
        for i, r in enumerate(g.sort_values("median_s").itertuples(index=False), 1):
            speed = f"\u00a0{ref / r.median_s:.2f}×" if np.isfinite(ref) else ""
            entries.append(f"{i}\u00a0{r.impl}{speed}" + (f"\u00a0{NOISY_MARK}" if r.noisy else ""))
        row[column] = "\u00a0· ".join(entries)  # a line never starts with the separator
        rows.append(row)
    return pd.DataFrame(rows)[[*keys, "fastest (ms)", column]]


def fastest(ok: pd.DataFrame) -> pd.DataFrame:
    """The fastest implementation per device, mask and length of the length sweep."""
    keys = [k for k in RANK_KEYS if k in ("device", "mask", "H", "L") or ok[k].nunique() > 1]
    idx = ok.groupby(keys, dropna=False)["median_s"].idxmin()
    best = ok.loc[idx, [*keys, "impl", "median_s"]]
    table = best.pivot_table(index=[k for k in keys if k != "L"], columns="L",
                             values="impl", aggfunc="first")
    table.columns = [f"L={c}" for c in table.columns]
    return table.reset_index().fillna("-")


# --- baseline ------------------------------------------------------------------------------
def compare_baseline(ok: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """Per point: current / baseline median, flagged only beyond the measured spread.

    regression: the current first quartile is above the baseline's third quartile;
    improvement: the current third quartile is below the baseline's first quartile;
    otherwise the interquartile ranges overlap and the point is "within noise". Points
    are matched on the machine too when the two sets share one, else across machines.
    """
    base = base[base["status"] == "ok"]
    if ok.empty or base.empty:
        return pd.DataFrame(columns=[*COMPARE_KEYS, "median_s", "median_s_base", "ratio",
                                     "verdict"])
    keys = COMPARE_KEYS if set(ok["machine"]) & set(base["machine"]) else COMPARE_KEYS[1:]
    cols = ["median_s", "q1_s", "q3_s"]
    cur = ok.groupby(keys, dropna=False)[cols].median()
    old = base.groupby(keys, dropna=False)[cols].median()
    m = cur.join(old.add_suffix("_base"), how="inner").reset_index()
    m["ratio"] = m["median_s"] / m["median_s_base"]
    m["verdict"] = np.select([m["q1_s"] > m["q3_s_base"], m["q3_s"] < m["q1_s_base"]],
                             ["regression", "improvement"], "within noise")
    order = {"regression": 0, "improvement": 1, "within noise": 2}
    return m.sort_values(["verdict", "ratio"], key=lambda s: s.map(order) if s.name ==
                         "verdict" else -s).reset_index(drop=True)


# --- not measured --------------------------------------------------------------------------
def not_measured(df: pd.DataFrame) -> pd.DataFrame:
    """Points not measured, one row per (implementation, status, reason) with the points."""
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return bad
    keys = [k for k in ("machine", "impl", "device", "dtype") if df[k].nunique() > 1
            or k in ("impl", "device")] + ["status", "reason"]
    rows = []
    for key, g in bad.groupby(keys, dropna=False, sort=True):
        pts = sorted({(int(r.L), int(r.H), str(r.mask)) for r in g.itertuples()})
        rows.append({**dict(zip(keys, key)), "points": len(g),
                     "which (L, H, mask)": ", ".join(f"{L}/{H}/{m}" for L, H, m in pts[:12])
                     + (" ..." if len(pts) > 12 else "")})
    return pd.DataFrame(rows)


def never_measured(df: pd.DataFrame) -> List[str]:
    """Implementations in the sweeps with no measured point at all."""
    measured = set(df.loc[df["status"] == "ok", "impl"])
    return sorted(set(df["impl"].dropna()) - measured)


# --- HTML ----------------------------------------------------------------------------------
def to_html(df: pd.DataFrame, formats: Optional[Dict[str, str]] = None, max_rows: int = 300,
            classes: str = "data") -> str:
    """A compact, escaped HTML table; numbers formatted per column."""
    if df is None or df.empty:
        return "<p class='muted'>none</p>"
    d = df.head(max_rows).copy()
    for col, fmt in (formats or {}).items():
        if col in d:
            d[col] = d[col].map(lambda v, f=fmt: "-" if pd.isna(v) else f.format(v))
    table = d.to_html(index=False, border=0, classes=classes, escape=True, na_rep="-")
    if len(df) > max_rows:
        table += f"<p class='muted'>{len(df) - max_rows} more rows not shown</p>"
    return table
