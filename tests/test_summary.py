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
    from suite.plugins.conditions import Where
    from suite.plugins.declarations import Deviation

    class Lib:
        deviations = {
            "fully_masked_rows": Deviation("nan", "old", where=Where(versions={"numpy": "<1"})),
            "nan_padding": Deviation("confined", "here", where=Where(versions={"numpy": ">=1"})),
            "bias_masked_rows": {"float16": Deviation("nan", "old",
                                                      where=Where(versions={"numpy": "<1"})),
                                 "float32": Deviation("nan", "any")},
        }

    assert declared_labels(Lib) == ["nan_padding", "bias_masked_rows[float32]"]


# ------------------------------------------------ the lines beneath the matrix: short labels

LONG = "a reason of a thousand characters " * 30  # as the real ones are: never on the terminal


def _case(impl, outcome, case, dtype="float32", reason=LONG, **extra):
    return {"impl": impl, "device": "cpu", "dtype": dtype, "family": case.split("/")[0],
            "case": case.split("/")[1], "outcome": outcome, "reason": reason, "isa": None,
            "known_used": [], "policies_used": [], **extra}


def _main_job_like():
    """53 known failures and deviations over three implementations, each with a long reason,
    and the passes and unsupported cases around them."""
    records = []
    for i in range(20):
        records.append(_case("torch.sdpa", "known_failure", f"lanes/nan_query_S{i}",
                             known_used=["torch-sdpa-nan-query-short-keys"],
                             reason="known behaviour torch-sdpa-nan-query-short-keys "
                                    "(nan_query_rows=zero): " + LONG))
        records.append(_case("torch.sdpa", "deviation", f"lanes/nan_padding_S{i}",
                             policies_used=["nan_padding"],
                             reason="declared nan_padding=confined (NaN reaches the output only "
                                    "in rows that read a NaN key or value): " + LONG))
    for i in range(9):
        records.append(_case("keras.mha[torch]", "known_failure", f"lanes/fully_masked_S{i}",
                             dtype="float16", reason="Keras (torch backend) in float16; " + LONG))
    for i in range(4):
        records.append(_case("numpy", "deviation", f"masking/nan_padding_{i}",
                             policies_used=["nan_padding"],
                             reason="declared nan_padding=confined (NaN only in rows): " + LONG))
    records += [_case(impl, outcome, "masking/none", reason=None if outcome == "pass" else LONG)
                for impl in ("numpy", "torch.sdpa", "keras.mha[torch]", "jax.jit")
                for outcome in ("pass", "unsupported")]
    return records


def test_outcome_lines_name_labels_and_counts_never_the_reasons():
    from suite.conformance.summary import LINE_WIDTH, outcome_lines

    lines = outcome_lines(_main_job_like())
    text = "\n".join(lines)
    assert "a reason of a thousand" not in text and "NaN reaches" not in text
    assert all(len(line) <= LINE_WIDTH for line in lines), max(map(len, lines))
    body = [line.strip() for line in lines[2:]]
    # one line per implementation with a known failure or deviation, sorted; none for an
    # implementation whose cases passed or were unsupported (the matrix counts those)
    assert [line.split(":")[0] for line in body] == ["keras.mha[torch]", "numpy", "torch.sdpa"]
    keras, numpy_, sdpa = body
    assert sdpa == ("torch.sdpa: 20 known failures (torch-sdpa-nan-query-short-keys x20), "
                    "20 declared deviations (nan_padding=confined x20)")
    assert numpy_ == "numpy: 4 declared deviations (nan_padding=confined x4)"
    # a listed known failure is named by its case; the dtype it is limited to is said
    assert keras.startswith("keras.mha[torch]: 9 known failures in float16 (lanes/fully_masked_S")
    assert keras.endswith("more)")


def test_outcome_lines_stay_short_however_many_labels():
    from suite.conformance.summary import LABEL_WIDTH, LINE_WIDTH, outcome_lines

    records = []
    for outcome in ("fail", "error", "flaky", "known_failure", "deviation"):
        records += [_case("lib." + "x" * 60, outcome, f"family_{i}/{'c' * 80}{i}")
                    for i in range(30)]
    (line,) = outcome_lines(records)[2:]
    assert len(line) <= LINE_WIDTH, line
    # every group keeps its count, and no label passes its width
    for words in ("30 failed", "30 errors", "30 flaky", "30 known failures",
                  "30 declared deviations"):
        assert words in line, line
    assert "c" * LABEL_WIDTH not in line


def test_no_outcome_lines_when_everything_passed_or_was_unsupported():
    from suite.conformance.summary import matrix_lines, outcome_lines

    records = [_case("numpy", "pass", "masking/none", reason=None),
               _case("numpy", "unsupported", "gradients/plain", reason="needs grad")]
    assert outcome_lines(records) == []
    assert not any("not passed" in line for line in matrix_lines(records))
