"""Gradients of sum(out * g) against the float64 oracle gradient (k = 3), and causality."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from suite.agreement import K_GRAD, compare
from suite.check import attempt
from suite.oracle_grad import grads, naive_grads
from suite.plugin import expressible
from suite.problem import Mask, cotangent, make_problem

GRAD_CASES = {
    "plain": lambda s: make_problem(s, 2, 6, 6, 16, 2),
    "cross_no_bias": lambda s: make_problem(s, 2, 5, 9, 16, 4, bias=False),
    "masked": lambda s: make_problem(s, 2, 7, 7, 16, 2, mask=Mask(
        valid_lens=np.array([7, 4]), causal=True)),
    "gqa": lambda s: make_problem(s, 2, 6, 6, 32, 4, 2),
    "bias": lambda s: make_problem(s, 2, 6, 6, 16, 2, mask=Mask(
        bias=np.random.default_rng(s).standard_normal((1, 2, 6, 6)))),
}


# The inputs whose gradients a plugin returns, by its kv_source.
_INPUTS = {"separate": ("query", "key", "value"), "shared": ("query", "key"), "self": ("query",)}


def _inputs(impl) -> tuple:
    return _INPUTS[getattr(impl, "kv_source", "separate")]


def _reference(impl, p, dtype):
    """Oracle and same-dtype gradients of what ``impl`` ran; an input a plugin takes for
    several roles gets their sum (one key/value source: key + value under "key"; one input
    for all three: query + key + value under "query")."""
    p = expressible(impl, p)
    ref, base = grads(p), naive_grads(p, dtype)
    inputs = _inputs(impl)
    for g in (ref, *base):
        for n in ("query", "key", "value")[len(inputs):]:
            g[inputs[-1]] = g[inputs[-1]] + g.pop(n)
    return ref, base


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradient(name, conform):
    seed = 200 + sorted(GRAD_CASES).index(name)
    p = GRAD_CASES[name](seed).validate()

    def judge(impl, out):
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
        if failed:
            out.classify("fail", "; ".join(c.describe() for c in failed))
        return out

    conform("gradients", name, seed, judge)


def test_causal_gradients(conform):
    """Causal mask: with dL/d(out) zero on rows > 3, grads of query/key/value rows > 3 are 0."""
    seed = 210
    p = make_problem(seed, 1, 8, 8, 16, 2, mask=Mask(causal=True))
    g = cotangent(p).copy()
    g[:, 4:] = 0
    p = dataclasses.replace(p, grad_output=g)

    def judge(impl, out):
        res, refused = attempt(impl, [p], out.device, out.dtype, grad=True)
        if refused:
            return out.classify(*refused)
        got = res[0].grads
        inputs = _inputs(impl)
        leaks = [f"{n} rows 4: max {np.abs(got[n][:, 4:]).max():.3g}"
                 for n in inputs if n in got and np.any(got[n][:, 4:] != 0)]
        absent = [n for n in inputs if n not in got]
        if leaks or absent:
            out.classify("fail", "; ".join([*(f"gradient leaks from the future: {x}" for x in leaks),
                                            *(f"no gradient for {n}" for n in absent)]))
        return out

    conform("gradients", "causality", seed, judge)
