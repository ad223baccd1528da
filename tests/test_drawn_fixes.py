"""What a plugin's module fixes beyond its features (``Implementation.causal``, ``rotary``):
the property-based family draws within it, so a causal decoder's or a rotary model's examples
are judged rather than refused (#50: before, a causal decoder was handed a non-causal problem
half the time and ``hf.model.gemma2[eager]`` refused all 25 of ``random_shapes``)."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from implementations.numpy.mha import NumpyMHA  # noqa: E402
from suite.conformance.tests.test_hypothesis import (  # noqa: E402
    drawn_within,
    inference_problems,
    problems,
)
from suite.plugins.interface import check_interface  # noqa: E402

QUICK = settings(max_examples=150, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))
DECODER = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "gqa",
                     "decode", "packed", "paged", "softcap"})


def _draws(strategy):
    seen = []

    @QUICK
    @given(strategy)
    def collect(p):
        p.validate()
        seen.append(p)

    collect()
    return seen


def test_a_causal_decoder_draws_causal_problems_only():
    for strategy in (problems(DECODER, True, causal=True),
                     inference_problems(DECODER, True, causal=True)):
        drawn = _draws(strategy)
        assert drawn and all(p.mask.causal for p in drawn), \
            [p.mask.kinds for p in drawn if not p.mask.causal][:3]
    # without the declaration the same features draw both, as before
    assert {bool(p.mask.causal) for p in _draws(problems(DECODER, True))} == {True, False}


def test_a_rotary_model_draws_even_head_widths():
    widths = {p.D for p in _draws(problems(DECODER, True, rotary=True))} | \
        {p.D for p in _draws(inference_problems(DECODER, True, rotary=True))}
    assert widths and all(d % 2 == 0 for d in widths), widths
    assert any(p.D % 2 for p in _draws(problems(DECODER, True)))


def test_an_encoder_never_draws_a_causal_problem():
    """``causal = False``: its draws use no causal feature (what an encoder never takes);
    a plugin declaring nothing draws as before."""
    class Encoder(NumpyMHA):
        name = "encoder"
        causal = False

    features, fixes = drawn_within(Encoder())
    assert fixes == {"causal": False, "rotary": False}
    assert not {"causal", "causal_bottom_right"} & features
    assert not any(p.mask.causal for p in _draws(problems(features, False, **fixes)))
    assert drawn_within(NumpyMHA()) == (frozenset(NumpyMHA.features),
                                        {"causal": None, "rotary": False})


@pytest.mark.parametrize("attr, value", [("causal", "yes"), ("causal", 1), ("rotary", None)])
def test_a_bad_declaration_is_one_line(attr, value):
    bad = type("Bad", (NumpyMHA,), {"name": "bad", attr: value})
    with pytest.raises(TypeError, match=rf"^Bad\.{attr}: expected "):
        check_interface(bad)
