"""Properties every implementation must have, whatever its numerics."""

from __future__ import annotations

import dataclasses

import numpy as np

from suite import oracle
from suite.agreement import ATOL, compare, max_abs_err
from suite.check import attempt
from suite.problem import Mask, Problem, make_problem


def _slack(p: Problem, dtype: str) -> float:
    """Two results each within the rule's bound of the oracle differ by at most twice it."""
    ref, _ = oracle.oracle(p)
    c = compare("oracle", ref, ref, [b[0] for b in oracle.baselines(p, dtype)], dtype)
    return 2 * c.bound


def test_permutation_equivariance(conform):
    """Unmasked self-attention: permuting the positions permutes the output."""
    seed = 101
    p = make_problem(seed, 2, 10, 10, 16, 2, self_attention=True)
    perm = np.random.default_rng(seed).permutation(10)
    x = p.query[:, perm]
    q = dataclasses.replace(p, query=x, key=x, value=x)

    def judge(impl, out):
        res, refused = attempt(impl, [p, q], out.device, out.dtype)
        if refused:
            return out.classify(*refused)
        err = max_abs_err(res[1].output, res[0].output[:, perm])
        bound = _slack(p, out.dtype)
        if not err <= bound:
            out.classify("fail", f"out(P x) - P out(x): max abs {err:.3g} > {bound:.3g}")
        return out

    conform("properties", "permutation_equivariance", seed, judge)


def test_weights_are_distributions(conform):
    """Returned attention weights are >= 0 and each row sums to 1 (0 for a fully masked row)."""
    seed = 102
    allowed = np.random.default_rng(seed).random((2, 1, 7, 9)) < 0.5
    allowed[..., 0] = True
    p = make_problem(seed, 2, 7, 9, 16, 2, mask=Mask(allowed=allowed))

    def judge(impl, out):
        res, refused = attempt(impl, [p], out.device, out.dtype, need_weights=True,
                               extra=frozenset({"weights"}))
        if refused:
            return out.classify(*refused)
        w = res[0].attn_weights
        tol = ATOL[out.dtype] * p.S
        if w is None:
            return out.classify("fail", "declares 'weights' but returned none")
        w = np.asarray(w, dtype=np.float64)
        if not (np.isfinite(w).all() and w.min() >= 0):
            return out.classify("fail", f"weights: min {np.nanmin(w):.3g} or not finite")
        row_err = np.abs(w.sum(-1) - 1).max()
        masked = np.abs(w[~np.broadcast_to(allowed, w.shape)]).max()
        if row_err > tol or masked > 0:
            out.classify("fail", f"weights: rows sum to 1 within {row_err:.3g} (allowed "
                                 f"{tol:.3g}); largest weight on a masked key {masked:.3g}")
        return out

    conform("properties", "weights_are_distributions", seed, judge)


def test_batch_equals_items(conform):
    """A batched call equals the per-item calls."""
    seed = 103
    p = make_problem(seed, 3, 8, 8, 16, 2, mask=Mask(valid_lens=np.array([8, 3, 6])))
    items = [dataclasses.replace(p, query=p.query[b:b + 1], key=p.key[b:b + 1],
                                 value=p.value[b:b + 1],
                                 mask=Mask(valid_lens=p.mask.valid_lens[b:b + 1]))
             for b in range(p.B)]

    def judge(impl, out):
        res, refused = attempt(impl, [p, *items], out.device, out.dtype)
        if refused:
            return out.classify(*refused)
        err = max(max_abs_err(r.output[0], res[0].output[b]) for b, r in enumerate(res[1:]))
        bound = _slack(p, out.dtype)
        if not err <= bound:
            out.classify("fail", f"batch vs items: max abs {err:.3g} > {bound:.3g}")
        return out

    conform("properties", "batch_equals_items", seed, judge)


def test_repeatable(conform):
    """Two identical calls give bit-identical results."""
    seed = 104
    p = make_problem(seed, 2, 12, 12, 16, 4, mask=Mask(causal=True))

    def judge(impl, out):
        res, refused = attempt(impl, [p, p], out.device, out.dtype)
        if refused:
            return out.classify(*refused)
        if not np.array_equal(res[0].output, res[1].output, equal_nan=True):
            out.classify("fail", f"two calls differ by "
                                 f"{max_abs_err(res[0].output, res[1].output):.3g}")
        return out

    conform("properties", "repeatable", seed, judge)
