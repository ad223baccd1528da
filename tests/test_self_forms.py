"""Self-attention forms of the cases: a plugin with one input for query, key and value
(``kv_source="self"``) is given each case's square self-attention problem, so a mask-free
self-attention module still runs a broad matrix, and one that takes key padding runs the
padding cases with the padding in its one input."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from implementations.numpy.mha import NumpyMHA
from suite.conformance import catalog
from suite.conformance.judge import run_case
from suite.spec import oracle

PLUGINS = Path(__file__).parent / "plugins"


def _mask_free_self():
    spec = importlib.util.spec_from_file_location("mask_free_self", PLUGINS / "mask_free_self.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.MaskFreeSelf()


class SelfNumpy(NumpyMHA):
    """The NumPy reference with one input and key padding, as a decoder block."""

    name = "self.numpy"
    kv_source = "self"
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias", "weights"})


# Cases whose own problem is not square (or has no mask-free form): unsupported for a
# mask-free self-attention module until they have a self-attention form.
SELF_FORMS = ["masking/none", "shapes/odd_lengths", "numerics/long_rows",
              "tiles/unmasked_129x1025", "tiles/unmasked_1023x255", "special_values/nan_query",
              "special_values/inf_query", "special_values/subnormal_inputs",
              "special_values/huge_values", "layouts/contiguous",
              "properties/batch_equals_items", "properties/repeatable",
              "gradients/cross_no_bias"]


def test_a_mask_free_self_attention_module_runs_each_unmasked_form():
    impl = _mask_free_self()
    outcomes = {f"{c.family}/{c.name}": run_case(impl, impl.name, "cpu", "float32", c)
                for c in catalog.ALL}
    for name in SELF_FORMS:
        o = outcomes[name]
        assert o.outcome == "pass", (name, o.outcome, o.reason)
    ran = [n for n, o in outcomes.items() if o.outcome != "unsupported"]
    assert len(ran) >= 36, ran  # 23 before the self-attention forms
    assert all(o.outcome == "pass" for o in outcomes.values() if o.outcome != "unsupported"), \
        {n: o.reason for n, o in outcomes.items() if o.outcome not in ("pass", "unsupported")}


@pytest.mark.parametrize("name,where", [
    ("special_values/nan_key_causal", (0, 5, 2)), ("special_values/nan_value_causal", (1, 6, 0)),
    ("special_values/nan_query", (1, 4, 3)), ("special_values/inf_value_bool_mask", (0, 2, 5))])
def test_a_special_value_reaches_the_one_input(name, where):
    """The NaN or inf a case puts in key or value is in the self-attention form's one input
    (``expressible`` replacing key and value by query would drop it)."""
    p = catalog.get(*name.split("/")).problem_for(SelfNumpy())
    assert p.query is p.key is p.value and p.L == p.S
    assert not np.isfinite(p.query[where])
    assert (~np.isfinite(p.query)).sum() == 1


@pytest.mark.parametrize("name", ["nan_padding", "garbage_padding", "valid_lens",
                                  "fully_masked_valid_lens"])
def test_padding_cases_have_a_square_self_attention_form(name):
    case = catalog.get("masking", name)
    p = case.problem_for(SelfNumpy())
    assert p.query is p.key is p.value and (p.B, p.L, p.S) == (3, 13, 13)
    other = case.problem_for(NumpyMHA())  # a plugin with separate inputs: as before
    assert (other.L, other.S) == (11, 13) and other.query is not other.key
    out = run_case(SelfNumpy(), "self.numpy", "cpu", "float32", case)
    assert out.outcome == "pass", out.reason


def test_nan_padding_self_form_makes_exactly_the_padded_rows_nan():
    """NaN padding in the one input: the padded query rows read their own NaN query (the
    spec's NaN), every other row reads no NaN and is finite."""
    p = catalog.get("masking", "nan_padding").problem_for(SelfNumpy())
    ref, _ = oracle.oracle(p)
    padded = np.arange(p.L)[None, :] >= np.asarray(p.mask.valid_lens)[:, None]  # (B, L)
    assert padded.any()
    assert np.isnan(ref[padded]).all(axis=-1).all()
    assert np.isfinite(ref[~padded]).all()


def test_lanes_nan_padding_self_form_keeps_its_nan():
    p = catalog.get("lanes", "nan_padding_S9").problem_for(SelfNumpy())
    assert p.query is p.key is p.value
    assert np.isnan(p.query[1, -1]).all() and np.isfinite(p.query[0]).all()


def test_a_property_keeps_its_mask_where_the_plugin_takes_it():
    case = catalog.get("properties", "batch_equals_items")
    assert case.problem_for(SelfNumpy()).mask.valid_lens is not None
    assert case.problem_for(_mask_free_self()).mask.is_empty()
