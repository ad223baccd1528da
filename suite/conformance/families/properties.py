"""The property and gradient cases: fixed problems (seeded from the case's name, like every
``suite.conformance.cases.Case``) with a judge that checks a property instead of the agreement rule.

properties: whatever its numerics, an implementation is permutation equivariant, returns
weights that are distributions, gives a batch what it gives each item, and repeats itself
bit for bit. gradients: the gradients of ``sum(out * g)`` against the float64 oracle's
(k = 3), and causality through gradients.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np

from suite.conformance.families.declare import Case, case
from suite.conformance.judge import Outcome, attempt, precision_behaviour, precision_of, slack_for
from suite.conformance.judge import dots_policy as _dots
from suite.plugins.interface import Implementation, declared, expressible
from suite.spec.agreement import ATOL, K_GRAD, compare, max_abs_err
from suite.spec.oracle_grad import differentiable, grads, naive_grads
from suite.spec.problem import Mask, Problem, cotangent, make_problem
from suite.spec.variants import Alibi, RelBias, alibi_slopes

CASES: List[Case] = []


# --- properties ----------------------------------------------------------------------------
def _permutation(seed: int, L: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(L)


def _judge_permutation(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
    perm = _permutation(out.seed, p.L)
    x = p.query[:, perm]  # (B, L, E), positions permuted
    q = dataclasses.replace(p, query=x, key=x, value=x)
    res, refused = attempt(impl, [p, q], out.device, out.dtype)
    if refused:
        return out.classify(*refused)
    err = max_abs_err(res[1].output, res[0].output[:, perm])
    bound = slack_for(impl, out, p)
    if not err <= bound:
        out.classify("fail", f"out(P x) - P out(x): max abs {err:.3g} > {bound:.3g}")
    return out


@case("properties", "permutation_equivariance", judge=_judge_permutation, into=CASES)
def _permutation_problem(seed: int) -> Problem:
    """Unmasked self-attention: permuting the positions permutes the output."""
    return make_problem(seed, 2, 10, 10, 16, 2, self_attention=True)


def _judge_weights(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
    res, refused = attempt(impl, [p], out.device, out.dtype, need_weights=True,
                           extra=frozenset({"weights"}))
    if refused:
        return out.classify(*refused)
    w = res[0].attn_weights
    tol = ATOL[out.dtype] * p.S
    if w is None:
        return out.classify("fail", "declares 'weights' but returned none")
    w = np.asarray(w, dtype=np.float64)  # (B, H, L, S)
    if not (np.isfinite(w).all() and w.min() >= 0):
        return out.classify("fail", f"weights: min {np.nanmin(w):.3g} or not finite")
    row_err = np.abs(w.sum(-1) - 1).max()
    masked = np.abs(w[~np.broadcast_to(p.mask.allowed, w.shape)]).max()
    if row_err > tol or masked > 0:
        out.classify("fail", f"weights: rows sum to 1 within {row_err:.3g} (allowed "
                             f"{tol:.3g}); largest weight on a masked key {masked:.3g}")
    return out


@case("properties", "weights_are_distributions", judge=_judge_weights, into=CASES)
def _weights_problem(seed: int) -> Problem:
    """Returned attention weights are >= 0 and each row sums to 1 (0 for a fully masked row)."""
    allowed = np.random.default_rng(seed).random((2, 1, 7, 9)) < 0.5
    allowed[..., 0] = True
    return make_problem(seed, 2, 7, 9, 16, 2, mask=Mask(allowed=allowed))


def _judge_batch(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
    vl = p.mask.valid_lens
    items = [dataclasses.replace(p, query=p.query[b:b + 1], key=p.key[b:b + 1],
                                 value=p.value[b:b + 1],
                                 mask=Mask(valid_lens=None if vl is None else vl[b:b + 1]))
             for b in range(p.B)]  # each (1, L, E)
    res, refused = attempt(impl, [p, *items], out.device, out.dtype)
    if refused:
        return out.classify(*refused)
    err = max(max_abs_err(r.output[0], res[0].output[b]) for b, r in enumerate(res[1:]))
    bound = slack_for(impl, out, p)
    if not err <= bound:
        out.classify("fail", f"batch vs items: max abs {err:.3g} > {bound:.3g}")
    return out


# The property does not rest on the mask: a self-attention module without the mask's
# feature runs it unmasked (``Case.mask_optional``).
@case("properties", "batch_equals_items", judge=_judge_batch, into=CASES, mask_optional=True)
def _batch_problem(seed: int) -> Problem:
    """A batched call equals the per-item calls."""
    return make_problem(seed, 3, 8, 8, 16, 2, mask=Mask(valid_lens=np.array([8, 3, 6])))


def _judge_repeatable(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
    res, refused = attempt(impl, [p, p], out.device, out.dtype)
    if refused:
        return out.classify(*refused)
    if not np.array_equal(res[0].output, res[1].output, equal_nan=True):
        out.classify("fail", f"two calls differ by "
                             f"{max_abs_err(res[0].output, res[1].output):.3g}")
    return out


@case("properties", "repeatable", judge=_judge_repeatable, into=CASES, mask_optional=True)
def _repeatable_problem(seed: int) -> Problem:
    """Two identical calls give bit-identical results."""
    return make_problem(seed, 2, 12, 12, 16, 4, mask=Mask(causal=True))


# --- gradients -----------------------------------------------------------------------------
# The inputs whose gradients a plugin returns, by its kv_source.
_INPUTS = {"separate": ("query", "key", "value"), "shared": ("query", "key"), "self": ("query",)}


def _inputs(impl: Implementation) -> Tuple[str, ...]:
    return _INPUTS[declared(impl, "kv_source")]


def _reference(impl: Implementation, p: Problem, dtype: str, dots: Optional[str] = None
               ) -> Tuple[Dict[str, np.ndarray], List[Dict[str, np.ndarray]]]:
    """Oracle and same-dtype gradients of what ``impl`` ran; an input a plugin takes for
    several roles gets their sum (one key/value source: key + value under "key"; one input
    for all three: query + key + value under "query")."""
    p = expressible(impl, p)
    ref, base = grads(p), naive_grads(p, dtype, dots)
    inputs = _inputs(impl)
    for g in (ref, *base):
        for n in ("query", "key", "value")[len(inputs):]:
            g[inputs[-1]] = g[inputs[-1]] + g.pop(n)
    return ref, base


def _judge_gradient(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
    why = differentiable(p)
    if why:  # no reference to judge against: unsupported, never a verdict on a wrong one
        return out.classify("unsupported", why)
    res, refused = attempt(impl, [p], out.device, out.dtype, grad=True)
    if refused:
        return out.classify(*refused)
    got = res[0].grads
    ref, base = _reference(impl, p, out.dtype)
    # d/d b_k is identically 0 (softmax ignores a shift shared by a row's logits): its
    # computed value is pure cancellation noise, so it is checked for finiteness only.
    if "b_k" in got and not np.isfinite(got["b_k"]).all():
        return out.classify("fail", "grad b_k is not finite")
    ref.pop("b_k", None)
    missing = sorted(set(ref) - set(got))
    if missing:
        return out.classify("fail", f"no gradient for {', '.join(missing)}")
    out.comparisons = [compare(f"grad {n}", got[n], ref[n], [b[n] for b in base],
                               out.dtype, k=K_GRAD) for n in ref]
    failed = [c for c in out.comparisons if not c.passed]
    # float32_dots in float32, float64_softmax in float64, where declared: the baselines
    # round the same operands (the softmax and its backward in float32 for the second)
    behaviour = precision_behaviour(out.dtype)
    dots = _dots(impl, out, p) if failed else None
    if dots is not None:
        spec = failed[0].describe()
        _, base = _reference(impl, p, out.dtype, precision_of({behaviour: dots.policy}))
        out.comparisons = [compare(f"grad {n}", got[n], ref[n], [b[n] for b in base],
                                   out.dtype, k=K_GRAD) for n in ref]
        failed = [c for c in out.comparisons if not c.passed]
        if not failed:
            out.policies_used = sorted(set(out.policies_used) | {behaviour})
            return out.classify("deviation", f"declared {dots.describe(behaviour)}; "
                                             f"checked (spec: {spec})")
    if failed:
        out.classify("fail", "; ".join(c.describe() for c in failed))
    return out


def _gradient_case(name: str, doc: str, square: Optional[int] = None, **kw) -> None:
    """``square``: the self-attention form's length where the problem is not square;
    ``variants``: seed -> the score variants (Problem fields, suite.spec.variants) to set."""
    def build(seed: int, square: Optional[int] = None) -> Problem:
        mask, variants = kw.get("mask"), kw.get("variants")
        B, L, S, *rest = kw["shape"]
        L, S = (L, S) if square is None else (square, square)
        p = make_problem(seed, B, L, S, *rest, bias=kw.get("bias", True),
                         mask=mask(seed) if mask else None, self_attention=square is not None,
                         value_head_dim=kw.get("value_head_dim"),
                         input_scale=kw.get("input_scale", 1.0))
        return dataclasses.replace(p, **variants(seed)) if variants else p
    build.__doc__ = doc
    case("gradients", name, judge=_judge_gradient, into=CASES, square=square)(build)


_gradient_case("plain", "Unmasked self-shaped attention.", shape=(2, 6, 6, 16, 2))
_gradient_case("cross_no_bias", "Cross-attention, Lq != Lk, projections without biases.",
               shape=(2, 5, 9, 16, 4), bias=False, square=9)
_gradient_case("masked", "valid_lens and causal.", shape=(2, 7, 7, 16, 2),
               mask=lambda s: Mask(valid_lens=np.array([7, 4]), causal=True))
_gradient_case("gqa", "GQA: H = 4 query heads share K = 2 kv heads.", shape=(2, 6, 6, 32, 4, 2))
_gradient_case("bias", "An additive (1, H, Lq, Lk) bias.", shape=(2, 6, 6, 16, 2),
               mask=lambda s: Mask(bias=np.random.default_rng(s).standard_normal((1, 2, 6, 6))))
_gradient_case("softcap_alibi", "Soft-capping (cap 2, inputs x2: the bend of tanh) and ALiBi "
               "(-slope |i - j|), causal.", shape=(2, 7, 7, 16, 2),
               mask=lambda s: Mask(causal=True), input_scale=2.0,
               variants=lambda s: {"softcap": 2.0,
                                   "alibi": Alibi(alibi_slopes(2), "distance")})
_gradient_case("sinks_rel_value_width", "Sinks, a clipped relative table (max_distance 3), "
               "value heads of width 8 over key width 4, GQA (H = 4, K = 2), key padding.",
               shape=(2, 6, 9, 16, 4, 2), value_head_dim=8,
               mask=lambda s: Mask(valid_lens=np.array([9, 4])),
               variants=lambda s: {
                   "sinks": np.random.default_rng(s).standard_normal(4),
                   "rel_bias": RelBias(np.random.default_rng(s + 1).standard_normal((4, 7)),
                                       "clip", True, 3)})

CAUSAL_ROWS = 4  # dL/d(out) is zero on rows >= 4 of the causality case


def _judge_causality(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
    res, refused = attempt(impl, [p], out.device, out.dtype, grad=True)
    if refused:
        return out.classify(*refused)
    got = res[0].grads
    inputs = _inputs(impl)
    n = CAUSAL_ROWS
    leaks = [f"{x} rows {n}: max {np.abs(got[x][:, n:]).max():.3g}"
             for x in inputs if x in got and np.any(got[x][:, n:] != 0)]
    absent = [x for x in inputs if x not in got]
    if leaks or absent:
        out.classify("fail", "; ".join([*(f"gradient leaks from the future: {x}" for x in leaks),
                                        *(f"no gradient for {x}" for x in absent)]))
    return out


@case("gradients", "causality", judge=_judge_causality, into=CASES)
def _causality_problem(seed: int) -> Problem:
    """Causal mask: with dL/d(out) zero on rows >= 4, grads of query/key/value rows >= 4 are 0."""
    p = make_problem(seed, 1, 8, 8, 16, 2, mask=Mask(causal=True))
    g = cotangent(p).copy()  # (B, L, E)
    g[:, CAUSAL_ROWS:] = 0
    return dataclasses.replace(p, grad_output=g)
