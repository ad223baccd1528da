"""The dropout family: attention in training mode, dropout on the attention weights
(``Problem.dropout``, feature ``dropout``).

In training mode a library drops each attention weight with probability p, independently
per batch item, head, query row and key, and scales the kept ones by 1 / (1 - p) (inverted
dropout), so the output's expectation over the draws is the eval-mode output, which the
float64 oracle computes. One call's answer is random, so these cases judge a module by
what the draws must show:

- ``p_zero_is_eval``: training mode with p = 0 gives the eval-mode answer, within the
  same-dtype rule (a training path that computes something else, or that drops anyway).
- The mean of N calls is within ``Z`` standard errors of the oracle, per output element
  (its variance computed exactly from the oracle's weights and projected values: for
  output element e of row l, p / (1 - p) * sum over heads h and keys j of
  w[h, l, j]^2 * u[h, j, e]^2, u the value row j of head h through the output projection),
  plus the rule's bound for rounding. Catches weights left unscaled (the mean shrinks by
  1 - p) and dropout applied where the spec does not (a masked key, the output).
- The spread: the median over elements of the draws' sample variance over that exact
  variance lies in [SPREAD_LOW, SPREAD_HIGH]. Catches dropout ignored in training mode (no
  spread), the same mask every call, p taken as the keep probability, one mask shared
  where the library should draw per head. Measured on planted NumPy plugins, 8 runs of
  each case: p read as the keep probability gives median ratios 5.4 to 15.9 (and a biased
  mean); one mask shared by every head 0.79 to 0.81 on ``masked`` (caught every run), 0.81
  to 0.88 on ``mean_and_spread`` (mostly), 0.91 to 0.96 on ``gqa`` (not caught); whole head
  rows dropped 0.76 to 0.78 on ``gqa`` (every run), 0.85 to 0.93 on ``mean_and_spread``
  (some runs), 0.93 to 0.97 on ``masked`` (not caught). A spread test per element sees
  these only through their variance; their covariances differ more.

``Z`` is the two-sided normal quantile for a family-wise false alarm rate of 1e-6 over
the elements (Bonferroni: 5.8 for this family's problems). The spread band: on the NumPy
reference in float32, 45 runs (15 seeds of each statistical case, DRAWS draws each) gave
median ratios 0.972 to 1.021 and a largest mean error of 3.9 standard errors, so the band
[0.9, 1.1] lies about 6 standard deviations of that median from 1 (``tests/test_dropout.py``).
``suite.conformance.cases`` registers ``BUILDERS``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np

from suite.conformance.families.declare import family
from suite.spec.problem import Mask, Problem, make_problem

FAMILY = "dropout"
BUILDERS, case = family(FAMILY)  # (name, seed -> problem, Case keywords), in order
DRAWS = 200  # calls per statistical case
FALSE_ALARM = 1e-6  # family-wise, per case: the mean test's per-element z comes from it
SPREAD_LOW, SPREAD_HIGH = 0.9, 1.1  # the median variance ratio's band




def z_for(elements: int, alpha: float = FALSE_ALARM) -> float:
    """Two-sided normal quantile for a family-wise false alarm rate ``alpha`` over
    ``elements`` tests (Bonferroni), by bisection on erfc (no SciPy in the core)."""
    target = alpha / max(elements, 1)  # P(|Z| > z) = erfc(z / sqrt 2)
    lo, hi = 0.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erfc(mid / math.sqrt(2)) > target else (lo, mid)
    return hi


def dropout_variance(p: Problem) -> np.ndarray:
    """(B, L, E) the exact variance of one training-mode call's output under inverted
    dropout of ``p.dropout`` on the weights, from the float64 oracle's intermediates."""
    from suite.spec import oracle

    f = oracle.forward(p)
    weights, v = f["weights"], f["v"]  # (B, H, L, S), (B, H, S, V)
    H, V = p.H, p.V
    w_o = f["w"]["w_o"].reshape(H, V, -1)  # (H, V, E)
    u = np.einsum("bhsv,hve->bhse", v, w_o)  # each value row through the output projection
    rate = p.dropout / (1 - p.dropout)
    return rate * np.einsum("bhls,bhse->ble", weights ** 2, u ** 2)


def _judge_draws(impl: Any, out: Any, p: Problem) -> Any:
    """DRAWS calls of ``p`` in training mode: their mean against the oracle (Z standard
    errors plus the rule's bound), and their spread against the exact variance."""
    from suite.conformance.judge import attempt, expressible, slack_for
    from suite.plugins.interface import Unsupported
    from suite.spec import oracle

    try:
        p = expressible(impl, p)
    except Unsupported as exc:
        return out.classify("unsupported", str(exc))
    draws = []
    for _ in range(DRAWS):
        res, refused = attempt(impl, [p], out.device, out.dtype)
        if refused:
            return out.classify(*refused)
        draws.append(np.asarray(res[0].output, np.float64))
    x = np.stack(draws)  # (N, B, L, E)
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).any(axis=(1, 2, 3)).sum())
        return out.classify("fail", f"non-finite outputs in {bad} of {DRAWS} training-mode "
                                    f"calls")
    ref, _ = oracle.oracle(p)
    var = dropout_variance(p)
    live = var > 1e-12 * max(float(var.max()), 1e-300)  # elements dropout can move
    bound = slack_for(impl, out, p) / 2  # the rule's bound: rounding in this dtype
    z = z_for(int(live.sum()))
    err = np.abs(x.mean(axis=0) - ref)
    allowed = z * np.sqrt(var / DRAWS) + bound
    over = err - allowed
    worst = np.unravel_index(int(np.argmax(over)), over.shape)
    if over[worst] > 0:
        return out.classify(
            "fail", f"mean of {DRAWS} training-mode calls (dropout {p.dropout}) off the "
                    f"eval-mode oracle by {err[worst]:.3g} > {allowed[worst]:.3g} "
                    f"({z:.1f} standard errors {math.sqrt(var[worst] / DRAWS):.3g} + the "
                    f"rule's bound {bound:.3g}) at (b={worst[0]}, l={worst[1]}, e={worst[2]}): "
                    f"mean {x.mean(axis=0)[worst]:.5g}, expected {ref[worst]:.5g}")
    if not live.any():
        return out.classify("fail", "no output element can vary under this dropout: the "
                                    "case is wrong")
    ratio = float(np.median(x.var(axis=0, ddof=1)[live] / var[live]))
    if not SPREAD_LOW <= ratio <= SPREAD_HIGH:
        what = ("no spread at all: dropout not applied in training mode, or the same mask "
                "every call" if ratio < 1e-6 else
                "less spread than dropout of the weights gives" if ratio < SPREAD_LOW else
                "more spread than dropout of the weights gives")
        return out.classify(
            "fail", f"spread of {DRAWS} training-mode calls (dropout {p.dropout}): median "
                    f"sample variance / exact variance {ratio:.3g}, outside "
                    f"[{SPREAD_LOW}, {SPREAD_HIGH}]: {what}")
    return out


def dropout_problem(seed: int, rate: float, mask: Optional[Mask] = None,
                    square: Optional[int] = None, **kw: Any) -> Problem:
    """A small problem (B 2, Lq 6, Lk 8, E 16, H 4) in training mode with dropout ``rate``;
    ``square=n``: its self-attention form (Lq = Lk = n, one input), the problem a module that
    attends over its own input (``kv_source="self"``) is given."""
    if square is not None:
        if mask is not None and mask.causal_align == "bottom_right":  # the same mask, square
            mask = dataclasses.replace(mask, causal_align="top_left")
        return dataclasses.replace(make_problem(seed, 2, square, square, 16, 4,
                                                self_attention=True, mask=mask or Mask(), **kw),
                                   dropout=rate)
    return dataclasses.replace(make_problem(seed, 2, 6, 8, 16, 4, mask=mask or Mask(), **kw),
                               dropout=rate)


@case("p_zero_is_eval", square=8)
def _p_zero_is_eval(seed, square=None):
    """Training mode with dropout 0: the eval-mode answer, within the same-dtype rule."""
    return dropout_problem(seed, 0.0, square=square)


@case("mean_and_spread", judge=_judge_draws, square=8)
def _mean_and_spread(seed, square=None):
    """Dropout 0.2, no mask: the mean of the draws is the oracle's answer and their spread
    the exact variance of dropout on the weights."""
    return dropout_problem(seed, 0.2, square=square)


@case("masked", judge=_judge_draws, square=8)
def _masked(seed, square=None):
    """Dropout 0.5 beside key padding (lengths 8 and 5) and a bottom-right causal mask: a
    masked key stays out of every draw (dropping never revives it), the kept weights are
    scaled as in an unmasked row."""
    return dropout_problem(seed, 0.5, Mask(valid_lens=np.array([8, 5]), causal=True,
                                           causal_align="bottom_right"), square=square)


@case("gqa", judge=_judge_draws, square=8)
def _gqa(seed, square=None):
    """Dropout 0.3 with two key/value heads for four query heads: each query head draws
    its own mask."""
    return dropout_problem(seed, 0.3, K=2, square=square)
