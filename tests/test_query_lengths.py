"""Query lengths alone (the ``q_lengths`` form) and the rows they pad.

The spec's answer for a padded query row is the answer for any row with no key: a zero head
output (the output row is b_o). Those rows are judged as their own behaviour,
``query_padded_rows``: a library that declares ``fully_masked_rows`` (what it does with rows
its attention mask empties) still owes the spec's answer for the rows its query lengths pad,
unless it declares ``query_padded_rows`` too. jax.nn declares ``fully_masked_rows=mean_values``
and documents (and, since 0.7.2, implements) zeroed padded query rows, while jax 0.4.32-0.7.1
gave query_seq_lengths alone the mean of the values there: the case tells the two apart.
"""

from __future__ import annotations

import numpy as np
import pytest

from implementations.numpy.mha import NumpyMHA
from suite.conformance.families import mask_forms
from suite.conformance.judge import Outcome, behaviours, judge
from suite.plugins import adapters
from suite.plugins.declarations import MASK_FORMS, Deviation
from suite.plugins.interface import Result
from suite.spec import oracle

CASES = {c.form: c for c in mask_forms.CASES}


def _problem(form: str):
    return adapters.with_form(CASES[form].problem(), form)


def _judged(impl, form: str, output: np.ndarray) -> Outcome:
    p = _problem(form)
    out = Outcome(impl.name, "cpu", "float32", "mask_forms", form, 0, "pass")
    return judge(impl, out, p, Result(output=output))


class _Declares(NumpyMHA):
    name = "test.declares"
    features = NumpyMHA.features - {"weights"}


def test_query_lengths_alone_is_a_form_with_padded_rows_and_no_key_lengths():
    assert "q_lengths" in MASK_FORMS and "kv_lengths" in MASK_FORMS
    p = _problem("q_lengths")
    form = adapters.form_mask(p)
    assert form.kv_lengths is None and form.attn is None
    assert form.q_lengths.tolist() == [mask_forms.L - 2, mask_forms.L // 2]
    # The padded rows are judged as query_padded_rows only: no other row lacks a key.
    assert behaviours(p) == ["query_padded_rows"]
    assert behaviours(_problem("q_lengths+kv_lengths")) == ["query_padded_rows"]


def test_padded_query_rows_owe_the_spec_despite_a_fully_masked_rows_policy():
    """The mean of the values in the padded rows (jax 0.4.32-0.7.1's answer to query lengths
    alone) fails under a declared fully_masked_rows=mean_values; a declared
    query_padded_rows=mean_values makes it a checked deviation; zero rows pass either way."""
    p = _problem("q_lengths")
    mean_rows = oracle.oracle(p, "mean_values")[0]
    spec = oracle.oracle(p)[0]
    assert not np.allclose(mean_rows, spec)  # the two answers differ on this problem

    class FullyMaskedMean(_Declares):
        deviations = {"fully_masked_rows": Deviation("mean_values", "test")}

    class PaddedMean(_Declares):
        deviations = {"query_padded_rows": Deviation("mean_values", "test")}

    assert _judged(FullyMaskedMean(), "q_lengths", mean_rows).outcome == "fail"
    assert _judged(_Declares(), "q_lengths", mean_rows).outcome == "fail"
    declared = _judged(PaddedMean(), "q_lengths", mean_rows)
    assert declared.outcome == "deviation", declared.reason
    assert declared.policies_used == ["query_padded_rows"]
    assert _judged(FullyMaskedMean(), "q_lengths", spec).outcome == "pass"
    # NaN in the padded rows follows neither the spec nor a mean_values policy.
    nan_rows = np.where(adapters.form_mask(p).q_lengths[:, None, None]
                        <= np.arange(p.L)[None, :, None], np.nan, spec)
    assert _judged(PaddedMean(), "q_lengths", nan_rows).outcome == "fail"


def test_jax_nn_declares_query_lengths_alone_and_a_mean_in_padded_rows_fails():
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from implementations.jax.nn import JaxNN, keywords

    if "query_seq_lengths" not in keywords():
        pytest.skip("this jax.nn.dot_product_attention takes no query_seq_lengths")
    assert "q_lengths" in JaxNN.mask_forms and "q_lengths+kv_lengths" in JaxNN.mask_forms

    class RowsAsMask(JaxNN):
        """jax 0.4.32-0.7.1's answer to query_seq_lengths alone, planted: the padded rows
        are masked whole (jax.nn gives them uniform weights) and not zeroed."""

        name = "bug.jax_nn_query_rows_as_mask"

        def attend(self, q, k, v, mask, scale, need_weights):
            form = mask.form
            if form is None or form.q_lengths is None:
                return super().attend(q, k, v, mask, scale, need_weights)
            rows = jnp.arange(q.shape[2])[None, :] < form.q_lengths[:, None]  # (B, L)
            attn = jnp.broadcast_to(rows[:, None, :, None], (q.shape[0], 1, q.shape[2],
                                                            k.shape[2]))
            form = form._replace(q_lengths=None, attn=attn)
            return super().attend(q, k, v, mask.replace(form=form), scale, need_weights)

    for form in ("q_lengths", "q_lengths+kv_lengths"):
        right = CASES[form].run(JaxNN(), Outcome("jax.nn", "cpu", "float32", "mask_forms",
                                                 form, 0, "pass"))
        assert right.outcome == "pass", (form, right.outcome, right.reason)
        wrong = CASES[form].run(RowsAsMask(), Outcome("bug", "cpu", "float32", "mask_forms",
                                                      form, 0, "pass"))
        assert wrong.outcome == "fail", (form, wrong.outcome, wrong.reason)
