"""Input validation: each bad input raises InputError naming the argument."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from suite.spec.problem import InputError, Mask, make_problem


def _p(**mask):
    return make_problem(0, 2, 4, 5, 8, 2, mask=Mask(**mask))


@pytest.mark.parametrize("change,needle", [
    (lambda p: dataclasses.replace(p, num_heads=3), "E=8 is not divisible by H=3"),
    (lambda p: dataclasses.replace(p, key=p.key[:1]), "key/value batch"),
    (lambda p: dataclasses.replace(p, value=p.value[:, :, :4]), "key/value width"),
    (lambda p: dataclasses.replace(p, value=p.value[:, :3]), "value length"),
    (lambda p: dataclasses.replace(p, query=p.query[0]), "query: expected a 3-d array"),
    (lambda p: dataclasses.replace(p, num_kv_heads=3), "num_kv_heads"),
    (lambda p: dataclasses.replace(p, scale=float("nan")), "scale"),
    (lambda p: dataclasses.replace(p, weights=dataclasses.replace(
        p.weights, w_q=p.weights.w_q[:, :4])), "weights.w_q"),
])
def test_bad_shapes(change, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        change(_p()).validate()


@pytest.mark.parametrize("mask,needle", [
    (dict(valid_lens=np.array([1, 9])), r"mask.valid_lens: expected values in \[0, 5\]"),
    (dict(valid_lens=np.array([1, -1])), r"values in \[0, 5\]"),
    (dict(valid_lens=np.array([1, 2, 3])), r"shape \(2,\) or \(2, 4\)"),
    (dict(valid_lens=np.array([1.0, 2.0])), "integers"),
    (dict(allowed=np.ones((4, 4), bool)), "mask.allowed: expected a shape broadcastable"),
    (dict(allowed=np.ones((4, 5))), "mask.allowed: expected a bool array"),
    (dict(bias=np.ones((3, 4, 5))), "mask.bias: expected a shape broadcastable"),
    (dict(bias=np.ones((4, 5), dtype=int)), "mask.bias: expected a float array"),
    (dict(bias=np.full((4, 5), np.nan)), "mask.bias: expected no NaN"),
    (dict(causal=True, causal_align="middle"), "mask.causal_align"),
])
def test_bad_masks(mask, needle):
    with pytest.raises(InputError, match=needle):
        _p(**mask).validate()


def test_nan_input_is_an_error_outside_padding():
    p = _p()
    q = p.query.copy()
    q[1, 2, 3] = np.nan
    with pytest.raises(InputError, match="query: expected finite values"):
        dataclasses.replace(p, query=q).validate()
    k = p.key.copy()
    k[1, 4, 0] = np.nan
    with pytest.raises(InputError, match="key: .* batch 1, position 4"):
        dataclasses.replace(p, key=k).validate()
    # The same NaN inside a padded-out position is allowed.
    dataclasses.replace(p, key=k, mask=Mask(valid_lens=np.array([5, 4]))).validate()


def test_features_follow_the_problem():
    assert _p().features() == {"cross"}
    assert make_problem(0, 1, 4, 4, 8, 4, 2, mask=Mask(causal=True), scale=0.5).features() == {
        "gqa", "causal", "scale"}
    assert _p(causal=True, causal_align="bottom_right").features() == {
        "cross", "causal_bottom_right"}
