"""The special_values and tiles families: which behaviours their problems exhibit, and the
checked policies they brought (bias_masked_rows; weights of a NaN row)."""

from __future__ import annotations

import numpy as np

from implementations.numpy.mha import NumpyMHA
from suite.conformance import judge
from suite.conformance.cases import by_family, get
from suite.plugins.declarations import Deviation


def test_behaviours_are_read_from_the_special_problems():
    sv = {c.name: judge.behaviours(c.problem()) for c in by_family()["special_values"]}
    # A non-finite query row is a declarable behaviour (nan_query_rows); a +inf bias is not.
    assert sv["nan_query"] == sv["inf_query"] == ["nan_query_rows"]
    assert sv["inf_bias_entry"] == [] and sv["huge_values"] == []
    # Causal: the NaN / inf key or value is masked for the rows above it.
    assert sv["nan_key_causal"] == sv["nan_value_causal"] == ["nan_padding"]
    assert sv["neg_inf_bias_rows"] == ["fully_masked_rows", "bias_masked_rows"]
    assert judge.behaviours(get("tiles", "masked_blocks_additive").problem()) == \
        ["fully_masked_rows", "bias_masked_rows"]
    assert judge.behaviours(get("tiles", "masked_blocks_bool").problem()) == ["fully_masked_rows"]


class _NanBiasRows(NumpyMHA):
    """Adds the bias and takes a plain softmax: a row of -inf gives NaN."""

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, w = super().attend(q, k, v, mask, scale, need_weights)
        dead = np.isneginf(np.broadcast_to(mask.bias, w.shape)).all(-1, keepdims=True)
        return np.where(dead, np.nan, heads), np.where(dead, np.nan, w)


class DeclaresNan(_NanBiasRows):
    name = "policy.bias_nan"
    deviations = {"bias_masked_rows": Deviation("nan", "planted")}


class Undeclared(_NanBiasRows):
    name = "policy.bias_nan_undeclared"


class DeclaresButZeroesAll(_NanBiasRows):
    """Declares NaN rows, but also zeroes a row that has keys: the policy excuses only the
    rows it names."""

    name = "policy.bias_nan_wrong"
    deviations = {"bias_masked_rows": Deviation("nan", "planted")}

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, w = super().attend(q, k, v, mask, scale, need_weights)
        heads = heads.copy()
        heads[0, 0, 0] = 0.0
        return heads, w


def _outcome(cls, name: str) -> judge.Outcome:
    return judge.run_case(cls(), cls.name, "cpu", "float32", get("special_values", name))


def test_bias_masked_rows_policy_is_checked():
    assert _outcome(DeclaresNan, "neg_inf_bias_rows").outcome == "deviation"
    assert _outcome(Undeclared, "neg_inf_bias_rows").outcome == "fail"
    wrong = _outcome(DeclaresButZeroesAll, "neg_inf_bias_rows")
    assert wrong.outcome == "fail" and "nor does it follow" in wrong.reason
    # The spec's zero (plain numpy) needs no declaration.
    assert _outcome(NumpyMHA, "neg_inf_bias_rows").outcome == "pass"


class NanOnlyAtInf(NumpyMHA):
    """The weights of a +inf-logit row: NaN at that key, 0 elsewhere (a kernel that resets a
    non-finite row max to 0); the output row is NaN all the same."""

    name = "weights.nan_at_inf_only"

    def attend(self, q, k, v, mask, scale, need_weights):
        s = (q @ k.transpose(0, 1, 3, 2)) * scale + mask.bias  # (B, H, L, S)
        top = s.max(-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(top), top, 0))
        with np.errstate(invalid="ignore"):
            w = e / e.sum(-1, keepdims=True)
        return w @ v, w


class ZeroesNanWeights(NanOnlyAtInf):
    name = "weights.zeroed"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, w = super().attend(q, k, v, mask, scale, need_weights)
        return heads, np.nan_to_num(w, nan=0.0)


def test_weights_of_a_nan_row_need_a_nan_not_a_pattern():
    assert _outcome(NanOnlyAtInf, "inf_bias_entry").outcome == "pass"
    bad = _outcome(ZeroesNanWeights, "inf_bias_entry")
    assert bad.outcome == "fail" and "not NaN" in bad.reason
