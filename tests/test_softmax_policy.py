"""The float64_softmax policy (#50 item 7): a library that runs the softmax of float64 logits
in float32 declares it, and the rule's baselines and rounding bound compute the softmax so:
it passes in float64 where it is right, and a wrong row still fails."""

import numpy as np
import pytest

from suite.conformance import catalog
from suite.spec import oracle
from tests.conftest import planted, run_catalog_case

FAMILIES = ("masking", "shapes", "numerics")
EMPTY_ROWS = {"fully_masked_valid_lens", "fully_masked_bool_row",
              "causal_bottom_right_long_query"}  # rows with no key to attend


def _outcomes(impl) -> dict:
    got = {}
    for family in FAMILIES:
        for c in catalog.of_family(family):
            got[f"{family}/{c.name}"] = run_catalog_case(impl, family, c.name, "float64")
    return got


def test_an_undeclared_float32_softmax_fails_in_float64():
    got = _outcomes(planted("softmax32_numpy").Softmax32Undeclared())
    failed = [k for k, o in got.items() if o.outcome == "fail"]
    assert len(failed) >= len(got) - 2, {k: o.outcome for k, o in got.items()}
    assert "float64_softmax" not in got["masking/causal"].reason


def test_the_declared_policy_passes_where_the_softmax_is_the_only_difference():
    got = _outcomes(planted("softmax32_numpy").Softmax32Declared())
    for k, o in got.items():
        assert o.outcome in ("pass", "deviation"), (k, o.outcome, o.reason)
    checked = got["masking/causal"]
    assert checked.outcome == "deviation" and "float64_softmax" in checked.policies_used
    assert "float64_softmax=float32" in checked.reason
    # judged against a float32 softmax's error, and near it: not a bound made wide
    (out,) = [c for c in checked.comparisons if c.what == "output"]
    assert 1e-9 < out.err < 1e-5 and out.ratio < 2, (out.err, out.ratio)


def test_a_nan_row_still_fails_under_the_declared_policy():
    got = _outcomes(planted("softmax32_numpy").Softmax32NanRows())
    failed = {k.split("/", 1)[1] for k, o in got.items() if o.outcome == "fail"}
    assert failed == EMPTY_ROWS, failed
    reason = got["masking/fully_masked_bool_row"].reason
    assert "nor does it follow the declared policy" in reason and "float64_softmax" in reason


def test_the_policy_changes_only_the_softmax_and_only_in_float64():
    (case,) = [c for c in catalog.of_family("masking") if c.name == "combined"]
    p = case.problem()
    exact = oracle.naive(p, "float64")
    soft = oracle.naive(p, "float64", dots="softmax32")
    # the weights are float32 values cast back; the oracle's own pass is unchanged
    assert np.array_equal(soft[1], soft[1].astype(np.float32).astype(np.float64))
    assert not np.array_equal(exact[1], soft[1])
    assert 1e-9 < np.abs(soft[0] - oracle.oracle(p)[0]).max() < 1e-5
    assert np.array_equal(exact[0], oracle.oracle(p)[0]) or \
        np.abs(exact[0] - oracle.oracle(p)[0]).max() < 1e-12
    for dtype in ("float32", "float16"):  # a float64 policy leaves the other dtypes alone
        assert np.array_equal(oracle.naive(p, dtype, dots="softmax32")[0],
                              oracle.naive(p, dtype)[0])
    bound = oracle.first_order(p, "float64", dots="softmax32")[0].max()
    assert bound > 100 * oracle.first_order(p, "float64")[0].max()
    with pytest.raises(ValueError, match="dots"):
        oracle.naive(p, "float64", dots="float32")
