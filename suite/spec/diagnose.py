"""Which rows a failing comparison broke, and what kind of rows they are (pure NumPy).

A failing comparison says how far the worst entry is off; two different bugs in one case
can say the same. Here each row (an output row (b, l), a weights row (b, h, l)) that breaks
the rule is sorted twice:

- what went wrong (the worst of its entries): ``nan`` (NaN where the reference is a
  number), ``inf`` (+-inf there), ``not_nan`` (a number where the reference is NaN: the row
  reads a NaN) or ``wrong`` (finite, off by more than the comparison's bound);
- where it is: ``no_keys`` (the mask leaves it no key to attend), ``head_no_keys`` (an
  output row some of whose heads have no key: those heads' part of it is keyless), or a row
  with keys to attend that ``nan_query`` (holds a NaN/inf query), ``nan_kv`` (attends a NaN/inf key or
  value), ``beside_nan`` (finite inputs, but keys it may not attend hold NaN/inf),
  ``masked`` (some keys masked) or ``unmasked`` (every key visible), the first that applies.

``classify`` gives the counts as a small JSON-friendly dict (the record's ``bad_rows``),
``describe`` the sentence for the reason: torch 2.4.0's NaN in rows with visible keys after
a fully masked key block reads "NaN (4 with keys to attend: 4 partly masked; none with no
key to attend)", 2.4.1's NaN in keyless rows only "NaN (none with keys to attend; 2 with no
key to attend)".
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

WHAT = ("nan", "inf", "not_nan", "wrong")  # worst first: a row counts once, as its worst
WHERE = ("no_keys", "head_no_keys", "nan_query", "nan_kv", "beside_nan", "masked", "unmasked")
WHAT_TEXT = {"nan": "NaN", "inf": "inf", "not_nan": "a number where NaN is due",
             "wrong": "finite but wrong"}
WHERE_TEXT = {"nan_query": "with a NaN/inf query", "nan_kv": "reading a NaN/inf key or value",
              "beside_nan": "beside masked NaN/inf keys", "masked": "partly masked",
              "unmasked": "unmasked"}


def row_context(allowed: np.ndarray, bad_kv: np.ndarray, bad_query: np.ndarray,
                heads: bool) -> np.ndarray:
    """Each row's WHERE index: (B, H, L) with ``heads`` (weights rows), else (B, L) (output
    rows, which mix every head: a row has a key when any head has one).

    ``allowed`` (B, H, L, S): True where a row may attend a key; ``bad_kv`` (B, S): key or
    value positions holding NaN/inf; ``bad_query`` (B, L): query rows holding NaN/inf."""
    allowed = np.asarray(allowed, bool)
    kv = np.asarray(bad_kv, bool)[:, None, None, :]  # (B, 1, 1, S)
    has_key = allowed.any(-1)  # (B, H, L)
    reads = (allowed & kv).any(-1)
    beside = (~allowed & kv).any(-1)
    partial = ~allowed.all(-1)
    nan_q = np.broadcast_to(np.asarray(bad_query, bool)[:, None, :], has_key.shape)
    some_keyless = np.zeros(has_key.shape, bool)
    if not heads:  # an output row: over its heads
        some_keyless = (~has_key).any(1)
        has_key, reads, beside, partial, nan_q = (
            a.any(1) for a in (has_key, reads, beside, partial, nan_q))
    where = np.full(has_key.shape, WHERE.index("unmasked"))
    # The first that applies wins: assign from the last to the first.
    for name, cond in (("masked", partial), ("beside_nan", beside), ("nan_kv", reads),
                       ("nan_query", nan_q), ("head_no_keys", some_keyless),
                       ("no_keys", ~has_key)):
        where = np.where(cond, WHERE.index(name), where)
    return where


def row_faults(got: np.ndarray, ref: np.ndarray, bound: float) -> np.ndarray:
    """Each row's WHAT index (-1: the row is fine), rows being every axis but the last."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    ref_nan = np.isnan(ref)
    with np.errstate(invalid="ignore"):
        off = np.abs(got - ref) > bound
    entry = {"nan": ~ref_nan & np.isnan(got),
             "inf": ~ref_nan & np.isinf(got) & (got != ref),
             "not_nan": ref_nan & ~np.isnan(got),
             "wrong": ~ref_nan & np.isfinite(got) & off}
    fault = np.full(got.shape[:-1], -1)
    for name in reversed(WHAT):  # the worst last, so it wins
        fault = np.where(entry[name].any(-1), WHAT.index(name), fault)
    return fault


def classify(got: np.ndarray, ref: np.ndarray, bound: float, where: np.ndarray
             ) -> Optional[Dict[str, object]]:
    """{"rows": n, "bad": m, what: {where: count}} (nonzero counts only) for rows of ``got``
    against ``ref`` (every axis but the last is a row); ``where`` is ``row_context``'s
    index per row. None when shapes differ."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape or where.shape != got.shape[:-1]:
        return None
    fault = row_faults(got, ref, bound)
    out: Dict[str, object] = {"rows": int(fault.size), "bad": int((fault >= 0).sum())}
    for i, what in enumerate(WHAT):
        counts = {w: int(((fault == i) & (where == j)).sum()) for j, w in enumerate(WHERE)}
        counts = {w: n for w, n in counts.items() if n}
        if counts:
            out[what] = counts
    return out


def describe(name: str, found: Optional[Dict[str, object]]) -> str:
    """One sentence for ``classify``'s dict, e.g. "bad output rows: 4 of 32 NaN (4 with
    keys to attend: 4 partly masked; none with no key to attend)"."""
    if not found or not found.get("bad"):
        return ""
    parts = []
    for what in WHAT:
        counts = found.get(what)
        if not counts:
            continue
        no_keys = counts.get("no_keys", 0) + counts.get("head_no_keys", 0)
        keyed = {w: n for w, n in counts.items() if w not in ("no_keys", "head_no_keys")}
        with_keys = sum(keyed.values())
        kinds = ", ".join(f"{n} {WHERE_TEXT[w]}" for w, n in keyed.items())
        keys_text = f"{with_keys} with keys to attend: {kinds}" if with_keys else \
            "none with keys to attend"
        some = counts.get("head_no_keys", 0)
        some_text = f", {some} of them in some heads only" if some else ""
        parts.append(f"{with_keys + no_keys} {WHAT_TEXT[what]} ({keys_text}; "
                     f"{no_keys or 'none'} with no key to attend{some_text})")
    return f"bad {name} rows: {found['bad']} of {found['rows']}: " + "; ".join(parts)
