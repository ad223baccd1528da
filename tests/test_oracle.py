"""The float64 oracle against hand-worked examples and its own invariants."""

from __future__ import annotations

import numpy as np
import pytest

from suite.spec.oracle import naive, oracle, round_to
from suite.spec.problem import Mask, Problem, Weights, make_problem


def _identity_problem(q, k, v, mask=None):
    E = q.shape[-1]
    eye = np.eye(E)
    return Problem(q[None], k[None], v[None], Weights(eye, eye, eye, eye), 1,
                   mask=mask or Mask())


def test_worked_two_token_example():
    """The tutorials' example: d_k = 2, weights row 0 ~ [0.52, 0.48], output row 0 ~ [1.06, 0.89]."""
    q = np.array([[0.9, 0.3], [0.6, 0.8]])
    k = np.array([[0.8, 0.4], [0.5, 0.9]])
    v = np.array([[1.2, 0.7], [0.9, 1.1]])
    out, w = oracle(_identity_problem(q, k, v))
    np.testing.assert_allclose(w[0, 0, 0], [0.52, 0.48], atol=0.005)
    np.testing.assert_allclose(out[0, 0], [1.06, 0.89], atol=0.005)
    # Exactly: softmax((q0 . k_j) / sqrt(2)).
    logits = q[0] @ k.T / np.sqrt(2)
    expect = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(w[0, 0, 0], expect, rtol=1e-15)
    np.testing.assert_allclose(out[0, 0], expect @ v, rtol=1e-15)


def test_causal_first_row_sees_only_first_key():
    q = np.array([[0.9, 0.3], [0.6, 0.8]])
    k = np.array([[0.8, 0.4], [0.5, 0.9]])
    v = np.array([[1.2, 0.7], [0.9, 1.1]])
    out, w = oracle(_identity_problem(q, k, v, Mask(causal=True)))
    np.testing.assert_array_equal(w[0, 0, 0], [1.0, 0.0])
    np.testing.assert_allclose(out[0, 0], v[0], rtol=1e-15)


def test_fully_masked_row_gives_output_bias():
    p = make_problem(0, 2, 4, 5, 8, 2, mask=Mask(valid_lens=np.array([5, 0])))
    out, w = oracle(p)
    np.testing.assert_array_equal(w[1], 0.0)
    np.testing.assert_allclose(out[1], np.broadcast_to(p.weights.b_o, out[1].shape), rtol=0)


def test_bool_mask_equals_minus_inf_bias():
    allowed = np.random.default_rng(1).random((2, 2, 4, 5)) < 0.6
    allowed[..., 0] = True
    a = make_problem(3, 2, 4, 5, 8, 2, mask=Mask(allowed=allowed))
    b = make_problem(3, 2, 4, 5, 8, 2, mask=Mask(bias=np.where(allowed, 0.0, -np.inf)))
    np.testing.assert_array_equal(oracle(a)[0], oracle(b)[0])


def test_gqa_reads_kv_head_h_div_groups():
    """With H = 4, K = 2, query heads 0,1 read kv head 0 and heads 2,3 read kv head 1."""
    p = make_problem(5, 1, 3, 3, 8, 4, 2)
    D = p.D
    _, w = oracle(p)
    # Rebuild head 1 by hand from kv head 0 (h // 2), not kv head 1 (h % 2).
    q = (p.query @ p.weights.w_q + p.weights.b_q)[0, :, D:2 * D]
    k = (p.key @ p.weights.w_k + p.weights.b_k)[0, :, 0:D]
    logits = q @ k.T / np.sqrt(D)
    expect = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(w[0, 1], expect / expect.sum(-1, keepdims=True), rtol=1e-12)


def test_padding_values_cannot_poison():
    p = make_problem(7, 2, 4, 6, 8, 2, mask=Mask(valid_lens=np.array([6, 3])))
    key, value = p.key.copy(), p.value.copy()
    key[1, 3:] = np.nan
    value[1, 3:] = np.nan
    q = Problem(p.query, key, value, p.weights, 2, mask=p.mask)
    np.testing.assert_array_equal(oracle(p)[0], oracle(q.validate())[0])


@pytest.mark.parametrize("dtype,eps", [("float32", 2**-24), ("float16", 2**-11), ("bfloat16", 2**-8)])
def test_round_to_is_within_half_ulp(dtype, eps):
    x = np.random.default_rng(0).standard_normal(10000)
    rel = np.abs(round_to(x, dtype) - x) / np.abs(x)
    assert rel.max() <= eps
    assert rel.max() > eps / 4  # it really rounds


def test_naive_error_grows_as_precision_drops():
    p = make_problem(11, 2, 16, 16, 32, 4)
    ref = oracle(p)[0]
    errs = [np.abs(naive(p, t)[0] - ref).max() for t in ("float32", "float16", "bfloat16")]
    assert 0 < errs[0] < errs[1] < errs[2]


def test_float32_baseline_is_computed_in_float32():
    """naive_float32 runs float32 matmuls (BLAS order): its q projection is exactly
    NumPy's float32 product, not a float64 product rounded once."""
    from suite.spec.oracle import Arithmetic, forward

    p = make_problem(12, 2, 9, 9, 64, 2)
    f = forward(p, Arithmetic("float32", "blas"))
    x32 = p.query.astype(np.float32)
    q32 = x32 @ p.weights.w_q.astype(np.float32) + p.weights.b_q.astype(np.float32)
    np.testing.assert_array_equal(f["q"], q32.reshape(2, 9, 2, 32).transpose(0, 2, 1, 3))
    once = round_to(p.query.astype(np.float32).astype(np.float64)
                    @ p.weights.w_q.astype(np.float32).astype(np.float64), "float32")
    assert not np.array_equal(f["q"], (once + p.weights.b_q.astype(np.float32)).reshape(
        2, 9, 2, 32).transpose(0, 2, 1, 3))


def test_two_reduction_orders_differ_and_both_are_float32_accurate():
    p = make_problem(13, 1, 16, 16, 256, 2)  # D = 128: long dot products
    ref = oracle(p)[0]
    blas, seq = (naive(p, "float32", o)[0] for o in ("blas", "sequential"))
    assert not np.array_equal(blas, seq)
    for got in (blas, seq):
        assert 0 < np.abs(got - ref).max() < 64 * 2**-23 * np.abs(ref).max()


def test_fully_masked_policies_change_only_the_empty_rows():
    from suite.spec.oracle import FULLY_MASKED

    p = make_problem(14, 2, 4, 5, 8, 2, mask=Mask(valid_lens=np.array([5, 0])))
    spec = oracle(p)[0]
    for policy in FULLY_MASKED:
        out, w = oracle(p, policy)
        np.testing.assert_array_equal(out[0], spec[0])  # rows with keys: the spec
        if policy == "nan":
            assert np.isnan(out[1]).all()
        elif policy == "mean_values":
            np.testing.assert_allclose(w[1], 1 / 5)
        elif policy == "unmasked":
            assert np.all(w[1] > 0) and np.allclose(w[1].sum(-1), 1)
        else:
            np.testing.assert_array_equal(out[1], spec[1])


# --- the special-value spec (README "Special values") -------------------------------------
def _nan_rows(out: np.ndarray) -> set:
    """{(b, i)} of output rows holding NaN; each such row must be NaN throughout."""
    rows = np.isnan(out).any(axis=-1)
    assert (rows == np.isnan(out).all(axis=-1)).all(), "a row is partly NaN"
    return {(int(b), int(i)) for b, i in np.argwhere(rows)}


def _with(p: Problem, name: str, index: tuple, value: float) -> Problem:
    arr = getattr(p, name).copy()
    arr[index] = value
    return Problem(**{**p.__dict__, name: arr}).validate(finite=False)


def test_nan_query_row_poisons_that_row_only():
    p = make_problem(11, 2, 6, 7, 8, 2)
    assert _nan_rows(oracle(_with(p, "query", (1, 4, 0), np.nan))[0]) == {(1, 4)}


@pytest.mark.parametrize("name", ["key", "value"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_key_or_value_reaches_the_rows_that_may_attend_it(name, bad):
    """Causal: rows i >= 3 may attend position 3 and are NaN; rows i < 3 are exactly as if
    the position held any finite number (a masked key is dropped, not weighted by 0)."""
    p = make_problem(12, 2, 6, 6, 8, 2, mask=Mask(causal=True))
    out = oracle(_with(p, name, (0, 3, 1), bad))[0]
    assert _nan_rows(out) == {(0, i) for i in range(3, 6)}
    np.testing.assert_array_equal(out[0, :3], oracle(_with(p, name, (0, 3, 1), 7.0))[0][0, :3])
    np.testing.assert_array_equal(out[1], oracle(p)[0][1])


def test_plus_inf_bias_makes_its_row_nan_minus_inf_masks():
    p = make_problem(13, 2, 5, 6, 8, 2)
    bias = np.zeros((2, 2, 5, 6))
    bias[1, 0, 2, 4] = np.inf
    out, w = oracle(Problem(**{**p.__dict__, "mask": Mask(bias=bias)}))
    assert _nan_rows(out) == {(1, 2)}
    assert np.isnan(w[1, 0, 2]).all() and not np.isnan(w[1, 1, 2]).any()
    # -inf entries and a row of -inf: the boolean mask exactly (a fully masked row gives 0).
    allowed = np.random.default_rng(2).random((2, 2, 5, 6)) < 0.5
    allowed[0, 1, 3] = False
    by_bias = Problem(**{**p.__dict__, "mask": Mask(bias=np.where(allowed, 0.0, -np.inf))})
    by_bool = Problem(**{**p.__dict__, "mask": Mask(allowed=allowed)})
    np.testing.assert_array_equal(oracle(by_bias)[0], oracle(by_bool)[0])
    np.testing.assert_array_equal(oracle(by_bias)[1][0, 1, 3], 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_finfo_min_mask_equals_the_boolean_mask(dtype):
    p = make_problem(14, 2, 5, 6, 8, 2)
    allowed = np.random.default_rng(3).random((2, 2, 5, 6)) < 0.5
    allowed[..., 0] = True
    fmin = Problem(**{**p.__dict__, "mask": Mask(bias=np.where(allowed, 0.0,
                                                               float(np.finfo(dtype).min)))})
    np.testing.assert_array_equal(oracle(fmin)[0],
                                  oracle(Problem(**{**p.__dict__, "mask": Mask(allowed=allowed)}))[0])


SPECIAL_NAN_ROWS = {  # case -> output rows (b, i) its docstring says are NaN
    "nan_query": {(1, 4)}, "inf_query": {(0, 2)},
    "nan_key_causal": {(0, i) for i in range(5, 11)},
    "neg_inf_key_causal": {(1, i) for i in range(3, 11)},
    "nan_value_causal": {(1, i) for i in range(6, 11)},
    "inf_value_bool_mask": {(0, i) for i in range(5, 11)},
    "inf_bias_entry": {(0, 3)},
}


def test_special_values_cases_are_nan_where_their_docstrings_say():
    from suite.conformance.cases import by_family
    special = by_family()["special_values"]
    for c in special:
        p = c.problem()
        out = oracle(p)[0]
        assert _nan_rows(out) == SPECIAL_NAN_ROWS.get(c.name, set()), c.name
        for dtype in ("float32", "float16", "bfloat16"):  # the baselines agree where finite
            for base in (naive(p, dtype, order)[0] for order in ("blas", "sequential")):
                assert _nan_rows(base) == _nan_rows(out), (c.name, dtype)
