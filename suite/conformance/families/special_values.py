"""The special values family: NaN and inf in a query, key, value or bias, -inf vs finfo.min
in additive masks, subnormal and huge magnitudes."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from suite.conformance.families.declare import family
from suite.conformance.families.declare import rng as seeded_rng
from suite.conformance.families.tiles import TE, TH
from suite.spec.problem import Mask, Problem, make_problem

FAMILY = "special_values"
BUILDERS, case = family(FAMILY)

# --- special values ------------------------------------------------------------------------
# NaN and inf where a mask does not hide them, -inf and finfo.min in an additive mask,
# subnormal and huge magnitudes. The spec (suite.spec.oracle, README "Special values"): IEEE
# arithmetic over the keys a row may attend; a masked key is dropped, never multiplied by 0.
# The self-attention form (``kv_source="self"``) is square, Lq = Lk = 13 (11 for the causal
# cases), with each special value in the one input where the case puts it in query, key or
# value: it is then in that position's query, key and value, and reaches the rows that read
# that key and the position's own row.
SB, SL, SS = 2, 11, 13


def _special(seed: int, L: int = SL, S: int = SS, mask: Optional[Mask] = None,
             square: Optional[int] = None, **kw) -> Problem:
    if square is not None:
        return make_problem(seed, SB, square, square, TE, TH, mask=mask, self_attention=True,
                            **kw)
    return make_problem(seed, SB, L, S, TE, TH, mask=mask, **kw)


def _sl(square: Optional[int]) -> int:
    """Query rows of a special-values problem (the self-attention form: ``square``)."""
    return SL if square is None else square


def _ss(square: Optional[int]) -> int:
    """Keys of a special-values problem (the self-attention form: ``square``)."""
    return SS if square is None else square


def _put(p: Problem, name: str, index: tuple, value: float, square: Optional[int] = None
         ) -> Problem:
    """``p`` with ``value`` at ``index`` of input ``name``; in the self-attention form
    (``square``) in the one input, which is query, key and value."""
    arr = getattr(p, name).copy()
    arr[index] = value
    if square is not None:
        return dataclasses.replace(p, query=arr, key=arr, value=arr)
    return dataclasses.replace(p, **{name: arr})


@case("nan_query", finite=False, square=SS)
def _nan_query(seed, square=None):
    """NaN in one element of query row (b=1, i=4): that output row is NaN, no other
    (self-attention: the NaN is key 4 too, so every row of batch 1 is NaN, batch 0 right)."""
    return _put(_special(seed, square=square), "query", (1, 4, 3), np.nan, square)


@case("inf_query", finite=False, square=SS)
def _inf_query(seed, square=None):
    """+inf in query row (b=0, i=2): its logits mix +inf and -inf terms, so the row is NaN."""
    return _put(_special(seed, square=square), "query", (0, 2, 7), np.inf, square)


@case("nan_key_causal", finite=False, square=SL)
def _nan_key(seed, square=None):
    """NaN in unmasked key (b=0, j=5), causal: rows i >= 5 of batch 0 are NaN; rows i < 5
    may not attend it and must be right."""
    return _put(_special(seed, SL, SL, Mask(causal=True), square), "key", (0, 5, 2), np.nan,
                square)


@case("neg_inf_key_causal", finite=False, square=SL)
def _neg_inf_key(seed, square=None):
    """-inf in unmasked key (b=1, j=3), causal: rows i >= 3 of batch 1 are NaN (their logits
    mix +inf and -inf), rows i < 3 must be right."""
    return _put(_special(seed, SL, SL, Mask(causal=True), square), "key", (1, 3, 0), -np.inf,
                square)


@case("nan_value_causal", finite=False, square=SL)
def _nan_value(seed, square=None):
    """NaN in unmasked value (b=1, j=6), causal: rows i >= 6 of batch 1 are NaN, rows i < 6
    must be right (a masked value is dropped, not weighted by 0)."""
    return _put(_special(seed, SL, SL, Mask(causal=True), square), "value", (1, 6, 0), np.nan,
                square)


@case("inf_value_bool_mask", finite=False, square=SS)
def _inf_value(seed, square=None):
    """+inf in value (b=0, j=2) under a boolean mask: the rows that may attend key 2 are NaN
    (after the output projection), the rows that may not must be right."""
    allowed = seeded_rng(seed).random((SB, 1, _sl(square), _ss(square))) < 0.6
    allowed[..., 0] = True
    allowed[0, 0, :5, 2] = False  # rows 0-4 may not attend it
    allowed[0, 0, 5:, 2] = True
    return _put(_special(seed, mask=Mask(allowed=allowed), square=square), "value", (0, 2, 5),
                np.inf, square)


@case("inf_bias_entry", square=SS)
def _inf_bias(seed, square=None):
    """+inf in bias entry (b=0, h=1, i=3, j=4): logit - row max is inf - inf, so row (0, 3)
    of head 1, and through the output projection output row (0, 3), is NaN; no other row."""
    bias = seeded_rng(seed).standard_normal((SB, TH, _sl(square), _ss(square)))
    bias[0, 1, 3, 4] = np.inf
    return _special(seed, mask=Mask(bias=bias), square=square)


@case("neg_inf_bias_rows", square=SS)
def _neg_inf_bias(seed, square=None):
    """-inf bias entries are masked keys; a row of -inf (b=1, h=0, i=2) is a fully masked row
    (zero head output), and a row with only its last key finite attends that key alone."""
    rng = seeded_rng(seed)
    shape = (SB, TH, _sl(square), _ss(square))
    bias = np.where(rng.random(shape) < 0.4, -np.inf, rng.standard_normal(shape))
    bias[..., 0] = 0.5
    bias[1, 0, 2] = -np.inf
    bias[0, 1, 6, :-1] = -np.inf
    return _special(seed, mask=Mask(bias=bias), square=square)


def _finfo_min_case(dtype: type):
    def build(seed: int, square: Optional[int] = None) -> Problem:
        allowed = seeded_rng(seed).random((SB, TH, _sl(square), _ss(square))) < 0.6
        allowed[..., 1] = True
        bias = np.where(allowed, 0.0, float(np.finfo(dtype).min))
        return _special(seed, mask=Mask(bias=bias), square=square)
    build.__doc__ = (f"An additive mask of 0 and finfo({np.dtype(dtype).name}).min (every row keeps "
                     "a key): exp underflows to exactly 0, so it equals the boolean mask.")
    return build


for _dt in (np.float32, np.float16):
    case(f"finfo_min_mask_{np.dtype(_dt).name}", square=SS)(
        _finfo_min_case(_dt))


@case("subnormal_inputs", square=SS)
def _subnormal(seed, square=None):
    """query, key and value at 1e-40 (subnormal in float32 and bfloat16, 0 in float16): the
    logits are ~0, the weights uniform, the output the output bias; no NaN from 0 / 0."""
    p = _special(seed, square=square)
    if square is not None:
        x = 1e-40 * p.query
        return dataclasses.replace(p, query=x, key=x, value=x)
    return dataclasses.replace(p, query=1e-40 * p.query, key=1e-40 * p.key, value=1e-40 * p.value)


@case("subnormal_weights", square=SS)
def _subnormal_weights(seed, square=None):
    """A bias of -90 .. -100 on every key but one a row: those weights are ~1e-40, subnormal
    in float32 (flushed to zero by some kernels, which the rule allows)."""
    bias = -seeded_rng(seed).uniform(90, 100, (SB, TH, _sl(square), _ss(square)))
    bias[..., 3] = 0.0
    return _special(seed, mask=Mask(bias=bias), square=square)


@case("huge_values", square=SS)
def _huge_values(seed, square=None):
    """value x 3000: outputs in the thousands, within float16's range (65504) (self-attention:
    the value projection x 3000, as the one input is also query and key)."""
    p = _special(seed, square=square)
    if square is not None:
        w = p.weights
        return dataclasses.replace(p, weights=dataclasses.replace(
            w, w_v=3000.0 * w.w_v, b_v=None if w.b_v is None else 3000.0 * w.b_v))
    return dataclasses.replace(p, value=3000.0 * p.value)


