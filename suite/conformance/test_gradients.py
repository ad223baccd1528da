"""Gradients of sum(out * g) against the float64 oracle gradient (k = 3), and causality."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from suite.agreement import K_GRAD, compare
from suite.check import Outcome, error_text, missing_features
from suite.oracle_grad import grads, naive_grads
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


def _grads(entry, device, dtype, p, out: Outcome):
    missing = missing_features(entry.impl, p, frozenset({"grad"}))
    if missing:
        out.outcome, out.reason = "unsupported", f"needs {', '.join(missing)}"
        return None
    try:
        state = entry.impl.prepare(p, device, dtype, grad=True)
        handle = entry.impl.run(state)
        entry.impl.synchronize(state)
        res = entry.impl.fetch(state, handle)
    except Exception as exc:  # a plugin that raises is reported, the run goes on
        out.outcome, out.reason = "error", error_text(exc)
        return None
    if not res.grads:
        out.outcome, out.reason = "fail", "declares 'grad' but returned no gradients"
        return None
    return res.grads


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradient(target, name, record):
    entry, device, dtype = target
    seed = 200 + sorted(GRAD_CASES).index(name)
    out = Outcome(entry.name, device, dtype, "gradients", name, seed, "pass")
    p = GRAD_CASES[name](seed).validate()
    got = _grads(entry, device, dtype, p, out)
    if got is not None:
        ref, base = grads(p), naive_grads(p, dtype)
        # d/d b_k is identically 0 (softmax ignores a shift shared by a row's logits): its
        # computed value is pure cancellation noise, so it is checked for finiteness only.
        if "b_k" in got and not np.isfinite(got["b_k"]).all():
            out.outcome, out.reason = "fail", "grad b_k is not finite"
        ref.pop("b_k", None)
        missing = sorted(set(ref) - set(got))
        if missing:
            out.outcome, out.reason = "fail", f"no gradient for {', '.join(missing)}"
        elif out.outcome == "pass":
            out.comparisons = [compare(f"grad {n}", got[n], ref[n], base[n], dtype, k=K_GRAD)
                               for n in ref]
            failed = [c for c in out.comparisons if not c.passed]
            if failed:
                out.outcome, out.reason = "fail", "; ".join(c.describe() for c in failed)
    record(out)


def test_causal_gradients(target, record):
    """Causal mask: with dL/d(out) zero on rows > 3, grads of query/key/value rows > 3 are 0."""
    entry, device, dtype = target
    seed = 210
    out = Outcome(entry.name, device, dtype, "gradients", "causality", seed, "pass")
    p = make_problem(seed, 1, 8, 8, 16, 2, mask=Mask(causal=True))
    g = cotangent(p).copy()
    g[:, 4:] = 0
    got = _grads(entry, device, dtype, dataclasses.replace(p, grad_output=g), out)
    if got is not None:
        leaks = [f"{n} rows 4: max {np.abs(got[n][:, 4:]).max():.3g}"
                 for n in ("query", "key", "value") if n in got and np.any(got[n][:, 4:] != 0)]
        absent = [n for n in ("query", "key", "value") if n not in got]
        if leaks or absent:
            out.outcome = "fail"
            out.reason = "; ".join([*(f"gradient leaks from the future: {x}" for x in leaks),
                                    *(f"no gradient for {n}" for n in absent)])
    record(out)
