"""A failing comparison says which rows broke (suite.spec.diagnose through suite.conformance.judge.judge):
NaN vs inf vs finite-but-wrong vs a number where NaN is due, in rows with no key to attend
vs rows with keys (partly masked, unmasked, beside masked NaN keys, reading a NaN key or
value, holding a NaN query), counted in the record's ``bad_rows`` and said in the reason.

Each test plants one kind of bad row in the oracle's own answer (which passes untouched)
and judges it as a plugin's result."""

from __future__ import annotations

import json

import numpy as np
import pytest

from suite.conformance.judge import Outcome, judge
from suite.plugins.interface import Implementation, Result
from suite.spec import diagnose, oracle
from suite.spec.problem import Mask, make_problem

B, L, S, E, H = 2, 6, 8, 8, 2


class Planted(Implementation):
    """Declares every mask and the weights, and no deviation: the judge holds it to the spec."""

    name = "planted"
    framework = "planted"
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias", "weights"})


def masked_problem():
    """Batch 0: row 0 has no key, rows 1-2 see only keys 4..7 (a leading block masked),
    rows 3-5 every key; batch 1: every row every key."""
    allowed = np.ones((B, 1, L, S), bool)
    allowed[0, 0, 0] = False
    allowed[0, 0, 1:3, :4] = False
    return make_problem(11, B, L, S, E, H, mask=Mask(allowed=allowed))


def special_problem():
    """Batch 0: keys 5..7 are padding holding NaN (rows beside masked NaN keys); batch 1:
    query row 2 is NaN; batch 2: value 0 is NaN and every row attends it."""
    p = make_problem(12, 3, L, S, E, H, mask=Mask(valid_lens=np.array([5, S, S])))
    key, value, query = p.key.copy(), p.value.copy(), p.query.copy()
    key[0, 5:] = value[0, 5:] = np.nan
    query[1, 2] = np.nan
    value[2, 0] = np.nan
    return p.__class__(query, key, value, p.weights, p.H, p.K, p.mask, p.scale)


def judged(p, output=None, weights=None):
    """Judge the oracle's answer of ``p`` with ``output`` / ``weights`` (functions of a copy)
    applied: the planted bug."""
    ref_out, ref_w = oracle.oracle(p)
    out, w = np.array(ref_out), np.array(ref_w)
    if output:
        output(out)
    if weights:
        weights(w)
    o = Outcome("planted", "cpu", "float32", "masking", "planted", 0, "pass")
    return judge(Planted(), o, p, Result(out, w))


def test_the_oracle_itself_passes_with_no_bad_rows():
    for p in (masked_problem(), special_problem()):
        o = judged(p)
        assert o.outcome == "pass", o.reason
        assert o.bad_rows is None and o.record()["bad_rows"] is None


def test_nan_in_rows_with_keys_after_a_masked_leading_block():
    """torch 2.4.0's kind: NaN in rows that have keys to attend."""
    def bug(out):
        out[0, 1:3] = np.nan  # the two rows whose leading key block is masked
    o = judged(masked_problem(), bug)
    assert o.outcome == "fail"
    assert o.bad_rows == {"output": {"rows": B * L, "bad": 2, "nan": {"masked": 2}}}
    assert ("bad output rows: 2 of 12: 2 NaN (2 with keys to attend: 2 partly masked; "
            "none with no key to attend)") in o.reason


def test_nan_only_in_rows_with_no_key_reads_differently():
    """torch 2.4.1's kind: NaN only in the row the mask leaves empty."""
    def bug(out):
        out[0, 0] = np.nan
    o = judged(masked_problem(), bug)
    assert o.bad_rows == {"output": {"rows": B * L, "bad": 1, "nan": {"no_keys": 1}}}
    assert ("bad output rows: 1 of 12: 1 NaN (none with keys to attend; 1 with no key to "
            "attend)") in o.reason
    with_keys = judged(masked_problem(), lambda out: out.__setitem__((0, 1), np.nan))
    # both fail with err nan at a NaN row: the row kinds are what tells the two bugs apart
    assert o.reason.split("; bad output rows")[1] != with_keys.reason.split("; bad output rows")[1]


def test_finite_but_wrong_and_inf_rows_are_counted_apart():
    def bug(out):
        out[1, 0] += 1.0  # unmasked, finite but wrong
        out[1, 4, 3] += 1.0
        out[0, 3, 0] = np.inf  # unmasked, inf
        out[0, 0, 1] = -np.inf  # no key, -inf
    o = judged(masked_problem(), bug)
    assert o.bad_rows["output"] == {"rows": 12, "bad": 4, "inf": {"no_keys": 1, "unmasked": 1},
                                    "wrong": {"unmasked": 2}}
    assert ("2 inf (1 with keys to attend: 1 unmasked; 1 with no key to attend); "
            "2 finite but wrong (2 with keys to attend: 2 unmasked; none with no key to "
            "attend)") in o.reason


def test_a_row_counts_once_as_its_worst_entry():
    def bug(out):
        out[1, 5, 0] = np.nan
        out[1, 5, 1] = np.inf
        out[1, 5, 2] += 1.0
    o = judged(masked_problem(), bug)
    assert o.bad_rows["output"] == {"rows": 12, "bad": 1, "nan": {"unmasked": 1}}


def test_entries_within_the_bound_are_not_bad_rows():
    """A row off by less than the comparison's bound is fine even when another row fails."""
    def bug(out):
        out[1, 0, 0] += 1.0
        out[1, 1, 0] += 1e-9
    o = judged(masked_problem(), bug)
    assert o.bad_rows["output"] == {"rows": 12, "bad": 1, "wrong": {"unmasked": 1}}


def test_nan_leaking_from_masked_padding():
    def bug(out):
        out[0, :] = np.nan  # batch 0 attends only keys 0..4; its padding holds NaN
    o = judged(special_problem(), bug)
    assert o.bad_rows["output"] == {"rows": 3 * L, "bad": L, "nan": {"beside_nan": L}}
    assert "6 NaN (6 with keys to attend: 6 beside masked NaN/inf keys; none with" in o.reason


def test_a_zeroed_nan_query_row_and_a_zeroed_nan_value_row():
    def bug(out):
        out[1, 2] = 0.0  # the NaN query's row, zeroed
        out[2, 0] = 0.0  # a row reading the NaN value, zeroed
    o = judged(special_problem(), bug)
    assert o.bad_rows["output"] == {"rows": 3 * L, "bad": 2,
                                    "not_nan": {"nan_query": 1, "nan_kv": 1}}
    assert ("2 a number where NaN is due (2 with keys to attend: 1 with a NaN/inf query, "
            "1 reading a NaN/inf key or value; none with no key to attend)") in o.reason


def test_weights_rows_are_per_head():
    def bug(w):
        w[1, 1, 4] = w[1, 1, 4][::-1].copy()  # one head's row permuted: sums to 1, wrong
    o = judged(masked_problem(), weights=bug)
    assert o.outcome == "fail"
    assert o.bad_rows == {"weights": {"rows": B * H * L, "bad": 1, "wrong": {"unmasked": 1}}}
    assert ("bad weights rows: 1 of 24: 1 finite but wrong (1 with keys to attend: "
            "1 unmasked; none with no key to attend)") in o.reason


def test_two_bugs_in_one_case_and_the_record_is_json():
    def out_bug(out):
        out[0, 0] = np.nan  # the keyless row
        out[0, 2] += 1.0  # a partly masked row, finite but wrong
    o = judged(masked_problem(), out_bug, lambda w: w.__setitem__((0, 0, 2, 5), np.nan))
    rec = json.loads(json.dumps(o.record(), allow_nan=False))
    assert rec["bad_rows"] == {
        "output": {"rows": 12, "bad": 2, "nan": {"no_keys": 1}, "wrong": {"masked": 1}},
        "weights": {"rows": 24, "bad": 1, "nan": {"masked": 1}}}
    assert ("bad output rows: 2 of 12: 1 NaN (none with keys to attend; 1 with no key to "
            "attend); 1 finite but wrong (1 with keys to attend: 1 partly masked; none with no "
            "key to attend)") in o.reason


@pytest.mark.parametrize("heads", [False, True])
def test_row_context_precedence(heads):
    """no key > NaN query > reads a NaN key/value > beside masked NaN > partly masked >
    unmasked, the first that applies."""
    allowed = np.ones((2, 1, 4, 4), bool)
    allowed[0, 0, 0] = False  # batch 0 row 0: no key (and a NaN query)
    allowed[0, 0, 2, 3] = False  # row 2: the NaN key 3 masked
    allowed[1, 0, 1, 0] = False  # batch 1 row 1: partly masked
    bad_kv = np.array([[False, False, False, True], [False] * 4])
    bad_q = np.array([[True, True, False, False], [False] * 4])
    got = diagnose.row_context(allowed, bad_kv, bad_q, heads=heads)
    assert got.shape == ((2, 1, 4) if heads else (2, 4))
    names = [diagnose.WHERE[i] for i in got.reshape(-1)]
    assert names == ["no_keys", "nan_query", "beside_nan", "nan_kv",
                     "unmasked", "masked", "unmasked", "unmasked"]


def test_an_output_row_with_a_keyless_head_is_told_from_rows_with_keys():
    allowed = np.ones((1, 2, 2, 3), bool)
    allowed[0, 0, 0] = False  # row 0: head 0 has no key, head 1 every key
    allowed[0, :, 1] = False  # row 1: no head has a key
    none = np.zeros((1, 3), bool)
    rows = diagnose.row_context(allowed, none, np.zeros((1, 2), bool), heads=False)
    assert [diagnose.WHERE[i] for i in rows[0]] == ["head_no_keys", "no_keys"]
    per_head = diagnose.row_context(allowed, none, np.zeros((1, 2), bool), heads=True)
    assert [diagnose.WHERE[i] for i in per_head[0, :, 0]] == ["no_keys", "unmasked"]


def test_nan_from_one_keyless_head_counts_with_the_keyless_rows():
    """A head with no key that gives NaN poisons its output row: the row reads as keyless in
    some heads, not as a row with keys to attend."""
    allowed = np.ones((B, H, L, S), bool)
    allowed[1, 0, 4] = False  # batch 1 row 4: head 0 has no key, head 1 every key
    p = make_problem(13, B, L, S, E, H, mask=Mask(allowed=allowed))
    o = judged(p, lambda out: out.__setitem__((1, 4), np.nan))
    assert o.bad_rows["output"] == {"rows": 12, "bad": 1, "nan": {"head_no_keys": 1}}
    assert ("1 NaN (none with keys to attend; 1 with no key to attend, 1 of them in some "
            "heads only)") in o.reason
