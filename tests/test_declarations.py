

def test_a_causal_fill_is_declared_for_the_rows_the_causal_mask_empties():
    """#52: a library whose causal flag gives the rows it empties the mean of the values
    and whose masks give zeros (x-transformers) declares causal_emptied_rows=mean_values:
    its causal rows pass as that deviation, the rows a mask empties still need the spec's
    zeros, and neither fully_masked_rows policy nor no declaration expresses it."""
    import dataclasses

    import numpy as np

    from suite.conformance.judge import Outcome, _causal_emptied_rows, attempt, behaviours, judge
    from suite.spec.problem import Mask, make_problem
    from tests.conftest import planted, run_catalog_case

    both = make_problem(0, 2, 12, 7, 16, 2, mask=Mask(
        causal=True, causal_align="bottom_right", valid_lens=np.array([7, 0])))
    rows = _causal_emptied_rows(both)[..., 0]
    assert rows[0, :5].all() and not rows[0, 5:].any() and not rows[1].any(), rows
    assert {"fully_masked_rows", "causal_emptied_rows"} <= set(behaviours(both))
    assert not _causal_emptied_rows(dataclasses.replace(
        both, mask=Mask(valid_lens=np.array([7, 0])))).any()

    mod = planted("causal_fill")
    long_query = "causal_bottom_right_long_query"
    assert run_catalog_case(mod.CausalFillUndeclared(), "masking", long_query,
                            "float32").outcome == "fail"
    out = run_catalog_case(mod.CausalFillDeclared(), "masking", long_query, "float32")
    assert out.outcome == "deviation" and "causal_emptied_rows" in out.reason, out.reason
    # a mask's empty rows: zeros, which the spec asks, pass with or without the declaration
    assert run_catalog_case(mod.CausalFillDeclared(), "masking", "fully_masked_valid_lens",
                            "float32").outcome == "pass"
    every = run_catalog_case(mod.EveryRowDeclaredCausal(), "masking",
                             "fully_masked_valid_lens", "float32")
    assert every.outcome == "fail", every.reason

    def judged(impl, p):  # the problem with both kinds of empty row, in float32
        (res,), refused = attempt(impl, [p], "cpu", "float32")
        assert refused is None, refused
        return judge(impl, Outcome(impl.name, "cpu", "float32", "masking", "both", 0, "pass"),
                     p, res)

    assert judged(mod.CausalFillDeclared(), both).outcome == "deviation"
    for wrong in (mod.CausalFillAsFullyMasked(), mod.EveryRowDeclaredCausal(),
                  mod.CausalFillUndeclared()):
        out = judged(wrong, both)
        assert out.outcome == "fail", (wrong.name, out.outcome, out.reason)
