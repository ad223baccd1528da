"""The property-based family's inference forms (issue 50): ``test_random_inference`` draws
decode rows at offsets in a cache, packed sequences and paged caches, with the score
variants a plugin declares on top; its draws are valid problems that use only declared
features, they reach planted bugs of each form, and a plugin declaring no form is
unsupported."""

from __future__ import annotations

import json
import sys

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, find, given, settings  # noqa: E402

from implementations.numpy.mha import NumpyMHA  # noqa: E402
from suite.conformance import catalog  # noqa: E402
from suite.conformance.judge import Outcome, run_problem  # noqa: E402
from suite.conformance.known_failures import catalogue_tests  # noqa: E402
from suite.conformance.tests.test_hypothesis import (  # noqa: E402
    inference_examples,
    inference_forms,
    inference_problems,
    no_inference_form,
)
from suite.plugins.declarations import VARIANT_FEATURES  # noqa: E402
from tests.conftest import PLUGINS  # noqa: E402

sys.path.insert(0, str(PLUGINS))
import decode_planted  # noqa: E402  (tests/plugins, as --plugin loads it)
import packed_planted  # noqa: E402
import paged_planted  # noqa: E402
import score_mod_planted  # noqa: E402

EVERY = frozenset(NumpyMHA.features)
QUICK = settings(max_examples=300, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))


def form_of(p) -> str:
    if p.paging is not None:
        return "paged"
    return "decode" if p.mask.query_offset is not None else "packed"


FORMS = ("decode", "packed", "paged")
VARIANTS = ("softcap", "alibi", "rel_bias", "sinks", "score_mod", "value_width")


def _has(p, variant: str) -> bool:
    return p.V != p.D if variant == "value_width" else getattr(p, variant) is not None


def test_each_form_draws_each_declared_variant():
    """Each inference form is drawn with each score variant on it, in one run of draws (a
    search per pair, shrinking what it found, took 18 times as long); derandomised, so
    the same draws on every run."""
    seen = set()

    @settings(QUICK, derandomize=True, phases=[Phase.generate])
    @given(inference_problems(EVERY))
    def draw(p):
        assert p.validate() is p
        seen.update((form_of(p), v) for v in VARIANTS if _has(p, v))

    draw()
    missing = {(f, v) for f in FORMS for v in VARIANTS} - seen
    assert not missing, sorted(missing)


@pytest.mark.parametrize("features, self_attention", [
    (EVERY, False),  # numpy: every form and variant
    (frozenset({"decode", "causal", "cross", "gqa", "valid_lens"}), False),  # a decode kernel
    (frozenset({"packed", "causal", "gqa", "softcap", "valid_lens"}), True),  # a whole model
    (frozenset({"paged", "valid_lens", "cross", "alibi"}), False),  # paged by lengths alone
], ids=["numpy", "decode_kernel", "whole_model", "paged_lengths"])
def test_draws_are_valid_and_use_only_declared_features(features, self_attention):
    """Every draw validates, needs no feature the plugin lacks, leaves no row without a key,
    and places ALiBi and the table top-left beside an offset or sequences
    (``Problem.validate`` refuses anything else); each form the plugin allows is drawn."""
    seen = set()

    @QUICK
    @given(inference_problems(features, self_attention))
    def check(p):
        p.validate()
        assert p.features() <= features, p.features() - features
        assert p.mask.dense_allowed(p.B, p.H, p.L, p.S).any(axis=-1).all()
        if self_attention:
            assert p.query is p.key is p.value
        seen.add(form_of(p))

    check()
    assert seen == set(inference_forms(features, self_attention))


def test_a_plugin_declaring_no_variant_draws_none():
    with pytest.raises(hypothesis.errors.NoSuchExample):
        find(inference_problems(EVERY - VARIANT_FEATURES), lambda p: p.has_variants(),
             settings=QUICK)


def test_a_plugin_without_a_form_is_refused_with_the_reason():
    assert no_inference_form(EVERY) is None
    assert inference_forms(EVERY) == ["decode", "packed", "paged"]
    assert "needs one of the inference forms" in no_inference_form(
        EVERY - {"decode", "packed", "paged"})
    assert no_inference_form(frozenset({"causal", "decode", "valid_lens"}), True).startswith(
        "needs packed")
    assert inference_forms(frozenset({"decode"})) == []  # decode aligns causality: needs it


@pytest.mark.parametrize("plugin", [decode_planted.DecodeDropsCap, decode_planted.AlibiAtZero,
                                    decode_planted.DecodesIgnoringLengths,
                                    packed_planted.PackedDropsCap,
                                    packed_planted.BoundaryOneLate,
                                    paged_planted.VariantsDroppedWhenPaged,
                                    paged_planted.ReadsWholePages,
                                    score_mod_planted.DecodeDropsScoreMod,
                                    score_mod_planted.PackedDropsScoreMod,
                                    score_mod_planted.ScoreModAtRowIndices])
def test_the_draws_alone_reach_a_planted_bug_the_reference_passes(plugin):
    """Without the examples run first, some draw fails each planted plugin (wrong in one
    form, right in prefill) where numpy passes the same problem."""
    def outcome(impl, p):
        return run_problem(impl, Outcome(impl.name, "cpu", "float32", "hypothesis",
                                         "random_inference", 0, "pass"), p).outcome

    bug = plugin()
    p = find(inference_problems(frozenset(bug.features)),
             lambda p: outcome(bug, p) == "fail", settings=QUICK)
    assert outcome(NumpyMHA(), p) == "pass"


def test_the_examples_run_first_carry_the_position_variants_at_offsets():
    (p,) = inference_examples(EVERY)
    assert p.alibi.convention == "distance" and p.rel_bias is not None
    assert (p.mask.query_offset > 0).all()
    assert inference_examples(EVERY - {"alibi", "rel_bias"}) == []
    assert inference_examples(EVERY - {"decode"}) == []


def test_the_catalogue_and_the_known_failures_know_the_case():
    assert catalog.from_test("test_random_inference", None) == ("hypothesis", "random_inference")
    assert catalog.from_test("test_random_shapes", None) == ("hypothesis", "random_shapes")
    assert ("test_random_inference", None) in catalogue_tests()


def test_a_planted_inference_bug_fails_random_inference(tmp_path, cli):
    """The whole case through the command line: plugins right in prefill and wrong at a
    decode step (the cap dropped, ALiBi measured from row 0) or on the packed path (the cap
    dropped) fail it, naming the drawn form; numpy passes; a plugin declaring no form is
    unsupported, saying so."""
    out = tmp_path / "c.json"
    proc = cli("check", "--workers", "0", "--plugin", str(PLUGINS / "decode_planted.py"),
               "--plugin", str(PLUGINS / "packed_planted.py"),
               "--plugin", str(PLUGINS / "inference_planted.py"),
               "--impl", "bug.decode_drops_cap", "--impl", "bug.alibi_at_zero",
               "--impl", "bug.packed_drops_cap", "--impl", "numpy",
               "--impl", "numpy.no_forms", "--dtype", "float32", "-k", "random_inference",
               "--json", str(out))
    records = {r["impl"]: r for r in json.loads(out.read_text())["results"]}
    said = proc.stdout[-2000:]
    for name, form in (("bug.decode_drops_cap", "offsets="), ("bug.alibi_at_zero", "offsets="),
                       ("bug.packed_drops_cap", "sequences=")):
        rec = records[name]
        assert rec["case"] == "random_inference" and rec["family"] == "hypothesis", rec
        assert rec["outcome"] == "fail" and form in rec["reason"], (rec, said)
    assert records["numpy"]["outcome"] == "pass", (records["numpy"], said)
    assert records["numpy.no_forms"]["outcome"] == "unsupported"
    assert "inference forms" in records["numpy.no_forms"]["reason"]
