"""Properties every implementation must have, whatever its numerics."""

from __future__ import annotations

import dataclasses

import numpy as np

from suite import oracle
from suite.agreement import ATOL, compare, max_abs_err
from suite.check import Outcome, call, error_text, missing_features
from suite.problem import Mask, Problem, make_problem


def _outcome(target, name: str, seed: int) -> Outcome:
    entry, device, dtype = target
    return Outcome(entry.name, device, dtype, "properties", name, seed, "pass")


def _run(target, out: Outcome, problems, need_weights=False, extra=frozenset()):
    """Call the implementation on each problem; None (and out classified) when it cannot."""
    entry, device, dtype = target
    missing = sorted(set().union(*(missing_features(entry.impl, p, extra) for p in problems)))
    if missing:
        out.outcome, out.reason = "unsupported", f"needs {', '.join(missing)}"
        return None
    try:
        return [call(entry.impl, p, device, dtype, need_weights) for p in problems]
    except Exception as exc:  # a plugin that raises is reported, the run goes on
        out.outcome, out.reason = "error", error_text(exc)
        return None


def _slack(p: Problem, dtype: str):
    """Two results each within the rule's bound of the oracle differ by at most twice it."""
    ref, _ = oracle.oracle(p)
    c = compare("oracle", ref, ref, oracle.naive(p, dtype)[0], dtype)
    return 2 * c.bound


def test_permutation_equivariance(target, record):
    """Unmasked self-attention: permuting the positions permutes the output."""
    seed = 101
    out = _outcome(target, "permutation_equivariance", seed)
    p = make_problem(seed, 2, 10, 10, 16, 2, self_attention=True)
    perm = np.random.default_rng(seed).permutation(10)
    x = p.query[:, perm]
    q = dataclasses.replace(p, query=x, key=x, value=x)
    res = _run(target, out, [p, q])
    if res is not None:
        err = max_abs_err(res[1].output, res[0].output[:, perm])
        bound = _slack(p, target[2])
        if not err <= bound:
            out.outcome = "fail"
            out.reason = f"out(P x) - P out(x): max abs {err:.3g} > {bound:.3g}"
    record(out)


def test_weights_are_distributions(target, record):
    """Returned attention weights are >= 0 and each row sums to 1 (0 for a fully masked row)."""
    seed = 102
    out = _outcome(target, "weights_are_distributions", seed)
    allowed = np.random.default_rng(seed).random((2, 1, 7, 9)) < 0.5
    allowed[..., 0] = True
    p = make_problem(seed, 2, 7, 9, 16, 2, mask=Mask(allowed=allowed))
    res = _run(target, out, [p], need_weights=True, extra=frozenset({"weights"}))
    if res is not None:
        w = res[0].attn_weights
        tol = ATOL[target[2]] * p.S
        if w is None:
            out.outcome, out.reason = "fail", "declares 'weights' but returned none"
        elif not (np.isfinite(w).all() and w.min() >= 0):
            out.outcome, out.reason = "fail", f"weights: min {np.nanmin(w):.3g} or not finite"
        else:
            row_err = np.abs(w.sum(-1) - 1).max()
            masked = np.abs(w[~np.broadcast_to(allowed, w.shape)]).max()
            if row_err > tol or masked > 0:
                out.outcome = "fail"
                out.reason = (f"weights: rows sum to 1 within {row_err:.3g} (allowed {tol:.3g}); "
                              f"largest weight on a masked key {masked:.3g}")
    record(out)


def test_batch_equals_items(target, record):
    """A batched call equals the per-item calls."""
    seed = 103
    out = _outcome(target, "batch_equals_items", seed)
    p = make_problem(seed, 3, 8, 8, 16, 2, mask=Mask(valid_lens=np.array([8, 3, 6])))
    items = [dataclasses.replace(p, query=p.query[b:b + 1], key=p.key[b:b + 1],
                                 value=p.value[b:b + 1],
                                 mask=Mask(valid_lens=p.mask.valid_lens[b:b + 1]))
             for b in range(p.B)]
    res = _run(target, out, [p, *items])
    if res is not None:
        err = max(max_abs_err(r.output[0], res[0].output[b]) for b, r in enumerate(res[1:]))
        bound = _slack(p, target[2])
        if not err <= bound:
            out.outcome, out.reason = "fail", f"batch vs items: max abs {err:.3g} > {bound:.3g}"
    record(out)


def test_repeatable(target, record):
    """Two identical calls give bit-identical results."""
    seed = 104
    out = _outcome(target, "repeatable", seed)
    p = make_problem(seed, 2, 12, 12, 16, 4, mask=Mask(causal=True))
    res = _run(target, out, [p, p])
    if res is not None and not np.array_equal(res[0].output, res[1].output, equal_nan=True):
        out.outcome = "fail"
        out.reason = f"two calls differ by {max_abs_err(res[0].output, res[1].output):.3g}"
    record(out)
