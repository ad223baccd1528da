"""The report's headline: a verdict per implementation, the fastest per length band, the
shares of peak and the points the report does not vouch for, and what was not measured."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from reports.frames import PEAK_SPREAD_LIMIT, SHARE_LIMIT
from reports.styles import Style, ordered
from reports.tables import (
    OUTCOME,
    OUTCOME_ORDER,
    OUTCOMES,
    RANK_KEYS,
    Outcome,
    anchor,
    never_measured,
    styles_or_own,
)
from suite.plugins.interface import interpreted
from suite.results.vocabulary import first_of

CASES_NAMED = 3  # cases a verdict names before "+N more"
BANDS = ("short", "medium", "long")  # length bands of the headline, by the measured lengths


# An implementation that passes every case it ran but ran under this share of the cases it
# was given (the rest unsupported) is headlined apart from those that conform: it covered
# too little for "conforms" to say much.
COVERAGE_MIN = 0.5
PARTIAL = Outcome("partial", "pass on part", "conforms on", "pass where they run, but run "
                  f"under {COVERAGE_MIN:.0%} of their cases", "◐", OUTCOME["pass"].colour)
HEADLINE_OUTCOMES = (*[o for o in OUTCOMES if o.name not in ("unsupported", "pass")],
                     OUTCOME["pass"], PARTIAL, OUTCOME["unsupported"])
# Outcomes the headline names case by case for each implementation; the others, one line each.
FINDINGS = ("fail", "error", "flaky")


def _plural(n: int, word: str = "case") -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _coverage(ran: int, given: int) -> str:
    """'32 of 42 cases (76%)': how many of the cases given an implementation ran."""
    return f"{ran} of {_plural(given)} ({ran / given:.0%})" if given else "no case"


def _verdict(g: pd.DataFrame, policies: List[str]) -> Tuple[str, List[str], str]:
    """(headline outcome, phrases, coverage) for one implementation's results: what fails
    (the cases, how many), its known failures, how it deviates (the declared policies), how
    many of the cases given it ran (unsupported: a feature it does not declare), or that it
    conforms, with how much it covered ("partial" below ``COVERAGE_MIN``)."""
    counts = g["outcome"].where(g["outcome"].isin(OUTCOME_ORDER), "error").value_counts()
    # unsupported cases are no finding: the worst of the others, unless nothing else ran
    worst = next((o for o in OUTCOME_ORDER if counts.get(o) and o != "unsupported"),
                 "unsupported")
    given, skipped = int(counts.sum()), int(counts.get("unsupported", 0))
    ran = given - skipped
    phrases = []
    for o in OUTCOMES:
        n = int(counts.get(o.name, 0))
        if not n or o.name == "pass":
            continue
        if o.name == "deviation":
            phrases.append(f"{o.said} ({', '.join(policies) or 'no policy named'}) in "
                           f"{_plural(n)}")
        elif o.name == "unsupported":
            phrases.append(f"ran {_coverage(ran, given)}, {n} {o.said}")
        else:
            hit = g[g["outcome"] == o.name]
            named = [f"{f}/{c} {d}" for f, c, d in
                     hit[["family", "case", "dtype"]].drop_duplicates().itertuples(index=False)]
            phrases.append(f"{o.said} {_plural(n)}: {first_of(named, CASES_NAMED)}")
    if worst == "pass":  # every case it ran passed: say how many of those it was given
        if skipped:
            phrases[-1:] = [f"{OUTCOME['pass'].said} on the {_plural(ran)} it ran: "
                            f"{_coverage(ran, given)} it was given, "
                            f"{skipped} {OUTCOME['unsupported'].said}"]
        else:
            phrases.insert(0, f"{OUTCOME['pass'].said} (all {_plural(ran)} pass)")
        if ran < COVERAGE_MIN * given:
            worst = PARTIAL.name
    return worst, phrases, (f"{ran} of {given}" if skipped else f"all {given}")


def verdicts(conf: pd.DataFrame, impls: List[Dict[str, Any]],
             styles: Optional[Dict[str, Style]] = None) -> List[Dict[str, Any]]:
    """One line per implementation (and machine) checked: its headline outcome and what it
    means (``_verdict``), with the anchor of its conformance details and its coverage
    ("32 of 42": the cases it ran of those given)."""
    if conf.empty:
        return []
    styles = styles_or_own(styles, list(zip(conf["impl"], conf["framework"])))
    policies = {i["name"]: i.get("policies") or [] for i in impls}
    multi = conf["machine"].nunique() > 1
    order = {n: k for k, n in enumerate(ordered(styles))}
    rows = []
    for (machine, impl), g in sorted(conf.groupby(["machine", "impl"]),
                                     key=lambda kv: (order.get(kv[0][1], 0), kv[0])):
        worst, phrases, coverage = _verdict(g, policies.get(impl, []))
        rows.append({"impl": f"{impl} ({machine})" if multi else impl,
                     "anchor": anchor(impl, machine if multi else None),
                     "outcome": worst, "text": "; ".join(phrases), "coverage": coverage})
    return rows


def by_outcome(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The verdicts (``verdicts``) by headline outcome, worst first: each outcome's words,
    glyph and implementations, and whether the headline names each one's cases
    (``FINDINGS``) or only its name (with its coverage where it passes)."""
    out = []
    for o in HEADLINE_OUTCOMES:
        mine = [r for r in rows if r["outcome"] == o.name]
        if mine:
            out.append({"outcome": o.name, "glyph": o.glyph, "summary": o.summary,
                        "rows": mine, "detailed": o.name in FINDINGS,
                        "coverage": o.name in ("pass", PARTIAL.name)})
    return out


def unavailable(impls: List[Dict[str, Any]], conf: pd.DataFrame) -> List[Dict[str, Any]]:
    """Implementations named but not available here and never checked, grouped by their
    reason (which says what to install or set): [{reason, names}], by first name."""
    checked = set(conf["impl"]) if not conf.empty else set()
    groups: Dict[str, List[str]] = {}
    for i in impls:
        if not i["available"] and i["name"] not in checked:
            groups.setdefault(i.get("error") or "unknown reason", []).append(i["name"])
    return sorted(({"reason": r, "names": n} for r, n in groups.items()),
                  key=lambda g: g["names"][0])


def _bands(lengths: List[int]) -> List[Tuple[str, List[int]]]:
    """Sorted lengths in up to three bands (short, medium, long) of neighbouring lengths."""
    lengths = sorted(set(lengths))
    parts = [list(p) for p in np.array_split(np.array(lengths), min(len(BANDS), len(lengths)))]
    names = BANDS if len(parts) == 3 else BANDS[::2][:len(parts)]
    return [(n, [int(v) for v in p]) for n, p in zip(names, parts)]


def fastest(length_points: pd.DataFrame) -> List[Dict[str, Any]]:
    """Per device and dtype (and machine, when several) and length band: the implementation
    fastest at most of the band's points (among those that measured most of them; ties go
    to the smaller geometric mean of time / fastest time), how many points it won, and its
    median share of the measured matmul peak there."""
    ok = length_points
    if ok.empty:
        return []
    where_keys = [k for k in ("machine", "device", "dtype") if k == "device" or ok[k].nunique() > 1]
    point_keys = [k for k in RANK_KEYS + ["grad", "K"] if k in ok.columns]
    out = []
    for where, w in ok.groupby(where_keys, sort=True):
        where = where if isinstance(where, tuple) else (where,)
        for band, lengths in _bands(w["L"].tolist()):
            b = w[w["L"].isin(lengths)]
            t = b.groupby([*point_keys, "impl"], dropna=False)["median_s"].median()
            best = t.groupby(level=list(range(len(point_keys))), dropna=False).transform("min")
            score = np.log(t / best).groupby(level="impl").agg(["mean", "size"])
            score["wins"] = (t == best).groupby(level="impl").sum()
            n_points = int(best.groupby(level=list(range(len(point_keys))),
                                        dropna=False).size().shape[0])
            # among those that measured the most points of the band: the most wins, then
            # the closest to each point's best (geometric mean of the ratios)
            pick = score[score["size"] == score["size"].max()].sort_values(
                ["wins", "mean"], ascending=[False, True], kind="stable").index[0]
            wins = int(score.loc[pick, "wins"])
            share = b.loc[b["impl"] == pick, "peak_share"].median()
            flagged = b.loc[b["impl"] == pick, "share_untrusted"].notna().any() \
                if "share_untrusted" in b else False
            out.append({"where": " ".join(str(v) for v in where),
                        "band": band, "lengths": f"L {lengths[0]}–{lengths[-1]}"
                        if len(lengths) > 1 else f"L {lengths[0]}",
                        "impl": pick, "wins": wins, "points": n_points,
                        "share": f"{share:.0%}" if np.isfinite(share) else None,
                        "untrusted": bool(flagged)})
    return out


UNTRUSTED_MARK = "⚠"  # a share of peak the report does not vouch for, in the headline and charts


def untrusted(ok: pd.DataFrame) -> Optional[str]:
    """One sentence naming the shares of the measured matmul peak that cannot be trusted
    (``reports.frames.untrusted_share``): the implementations above 100% of the peak, and
    the peaks (device, dtype, machine when several) whose before/after spread exceeds 20%
    with the implementations whose shares use them; None when every share holds."""
    if ok.empty or "share_untrusted" not in ok or ok["share_untrusted"].isna().all():
        return None
    multi = ok["machine"].nunique() > 1

    def where(r: Any) -> str:
        return f"{r['device']} {r['dtype']}" + (f" on {r['machine']}" if multi else "")

    above, spread = [], []
    over = ok[ok["peak_share"] > SHARE_LIMIT]
    for (impl, *_), g in over.groupby(["impl", "machine", "device", "dtype"], sort=True):
        above.append(f"{impl} on {where(g.iloc[0])} (up to {g['peak_share'].max():.0%})")
    wide = ok[ok["peak_spread"] > PEAK_SPREAD_LIMIT]
    for _, g in wide.groupby(["machine", "device", "dtype"], sort=True):
        r = g.iloc[0]
        spread.append(f"{where(r)}, spread {g['peak_spread'].max():.0%}, used by "
                      + ", ".join(sorted(set(map(str, g["impl"])))))
    parts = []
    if above:
        parts.append(f"above {SHARE_LIMIT:.0%} of the measured peak, so the peak was "
                     f"measured low (a busy machine) or the kernel outruns the plain matmul: "
                     + "; ".join(above))
    if spread:
        parts.append(f"the peak's two measurements (before and after the points) differ by "
                     f"more than {PEAK_SPREAD_LIMIT:.0%}, so the machine's speed changed "
                     f"during the run: " + "; ".join(spread))
    return (f"Shares of peak not to be trusted ({UNTRUSTED_MARK} in the headline, a red cross "
            "in the throughput charts): " + "; and ".join(parts) + ".")


def unmeasured(sweeps: pd.DataFrame, conf: pd.DataFrame,
                        impls: List[Dict[str, Any]]) -> List[Dict[str, str]]:
    """What the run did not measure, each with the section that says more: implementations
    with no measured point, points not measured (by status), implementations checked but
    absent from the sweeps, interpreted kernels (checked, never timed) and implementations
    swept but never checked."""
    out = []
    swept = set(sweeps["impl"].dropna())
    never = never_measured(sweeps)
    if never:
        out.append({"anchor": "not-measured",
                    "text": f"no measured point: {', '.join(never)}"})
    bad = sweeps[sweeps["status"] != "ok"]
    if len(bad):
        by = bad["status"].value_counts()
        out.append({"anchor": "not-measured", "text": f"{len(bad)} sweep point"
                    f"{'s' * (len(bad) != 1)} not measured ("
                    + ", ".join(f"{n} {s}" for s, n in by.items()) + ")"})
    checked = set(conf["impl"].dropna()) if not conf.empty else set()
    interp = sorted(set(conf.loc[conf["device"].astype(str).map(interpreted), "impl"])) if len(conf) else []
    if interp:
        out.append({"anchor": "conformance", "text": "interpreted kernels, checked but never "
                    f"timed (interpreted times say nothing of the kernel): {', '.join(interp)}"})
    absent = sorted(checked - swept - set(interp))
    if absent and len(sweeps):
        out.append({"anchor": "scaling", "text": f"checked but not in the sweep: "
                    f"{', '.join(absent)}"})
    left: Dict[str, int] = {}
    for i in impls:
        for fam, n in (i.get("left") or {}).items():
            left[fam] = left.get(fam, 0) + int(n)
    if sum(left.values()):  # a sampled check (the main job's): what it did not run
        out.append({"anchor": "conformance", "text": f"conformance ran the main job's sample: "
                    f"{sum(left.values())} cases left to mha-suite check ("
                    + ", ".join(f"{fam} {n}" for fam, n in sorted(left.items())) + ")"})
    unchecked = sorted(swept - checked)
    if unchecked and len(conf):
        out.append({"anchor": "conformance", "text": f"timed but not checked: "
                    f"{', '.join(unchecked)}"})
    return out
