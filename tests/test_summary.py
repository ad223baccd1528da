"""The run summary's advice: a declaration is called stale only when removing it is safe."""

from __future__ import annotations

from suite.conformance.summary import stale_declarations


def _rec(outcome, behaviours=("fully_masked_rows",), used=(), dtype="float32"):
    return {"impl": "lib", "dtype": dtype, "outcome": outcome, "behaviours": list(behaviours),
            "policies_used": list(used)}


DECLARED = {"lib": ["fully_masked_rows"]}


def test_a_declaration_every_exhibiting_case_passed_without_is_stale():
    records = [_rec("pass"), _rec("pass", dtype="float16"), _rec("pass", behaviours=())]
    assert stale_declarations(records, DECLARED) == {"lib": ["fully_masked_rows"]}


def test_a_deviation_in_one_dtype_keeps_the_declaration():
    records = [_rec("pass", dtype="float64"), _rec("deviation", used=["fully_masked_rows"])]
    assert stale_declarations(records, DECLARED) == {}


def test_a_failure_or_known_failure_in_another_dtype_keeps_the_declaration():
    # The float16 row failed (say, its mask fill overflows); removing the declaration would
    # break nothing there but could only make it worse: it is not advice to give.
    for outcome in ("fail", "known_failure", "error"):
        records = [_rec("pass", dtype="float64"), _rec(outcome, dtype="float16")]
        assert stale_declarations(records, DECLARED) == {}, outcome


def test_unsupported_cases_say_nothing_and_unmet_behaviours_are_not_stale():
    assert stale_declarations([_rec("unsupported"), _rec("pass", behaviours=())], DECLARED) == {}


PER_DTYPE = {"lib": ["fully_masked_rows[float32]", "fully_masked_rows[float16]"]}


def test_a_per_dtype_declaration_is_stale_on_its_own_dtype_only():
    # float16 gave the spec's answer wherever it exhibited the behaviour; float32 needed it.
    records = [_rec("deviation", used=["fully_masked_rows"]), _rec("pass", dtype="float16")]
    assert stale_declarations(records, PER_DTYPE) == {"lib": ["fully_masked_rows[float16]"]}
    # A failure in float16 keeps float16's declaration, and says nothing of float32's.
    records = [_rec("pass"), _rec("fail", dtype="float16")]
    assert stale_declarations(records, PER_DTYPE) == {"lib": ["fully_masked_rows[float32]"]}
    # The single-policy form is judged on every dtype together, as before.
    assert stale_declarations(records, DECLARED) == {}


def test_a_declaration_keyed_to_other_versions_is_not_offered_for_staleness():
    # torch < 2.5 SDPA gives NaN rows; on a newer torch the declaration is never applied, so
    # the spec's answer there says nothing of it (it is not stale, it is elsewhere).
    from suite.conformance.summary import declared_labels
    from suite.plugin import Deviation
    from suite.where import Where

    class Lib:
        deviations = {
            "fully_masked_rows": Deviation("nan", "old", where=Where(versions={"numpy": "<1"})),
            "nan_padding": Deviation("confined", "here", where=Where(versions={"numpy": ">=1"})),
            "bias_masked_rows": {"float16": Deviation("nan", "old",
                                                      where=Where(versions={"numpy": "<1"})),
                                 "float32": Deviation("nan", "any")},
        }

    assert declared_labels(Lib) == ["nan_padding", "bias_masked_rows[float32]"]
