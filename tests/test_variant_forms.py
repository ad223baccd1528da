"""Score variants in the inference forms (issue 50): the decode, paged, packed and generation
cases that carry a cap, sinks, ALiBi, a relative table, a score modifier or a value width;
planted plugins right in prefill and wrong in one form for one variant fail exactly the new
cases of that form and pass the old ones (the variants family's prefill cases and the form's
cases without the variant), on NumPy and on torch."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from suite.conformance import catalog
from suite.conformance.judge import FAILED, Outcome, run_problem
from tests.conftest import PLUGINS

sys.path.insert(0, str(PLUGINS))
import decode_planted  # noqa: E402  (tests/plugins, as --plugin loads it)
import packed_planted  # noqa: E402
import score_mod_planted  # noqa: E402

from implementations.numpy.mha import NumpyMHA  # noqa: E402


def _run(impl, family: str, name: str, dtype: str = "float32") -> Outcome:
    c = catalog.get(family, name)
    return c.run(impl, Outcome(impl.name, "cpu", dtype, c.family, c.name, c.seed, "pass"))


def _names(family: str):
    return [c.name for c in catalog.of_family(family)]


# The prefill cases of each variant (the variants family): a plugin wrong only in an
# inference form passes them.
PREFILL = {"softcap": ["softcap_valid_lens", "softcap_self_causal_padding", "combined"],
           "sinks": ["sinks_self_causal_padding", "sinks_fully_masked"],
           "alibi": ["alibi_distance_bottom_right", "alibi_key_self_causal_padding",
                     "rel_clip_bottom_right", "rel_t5_causal_decoder"],
           "score_mod": ["score_mod_distance_wave", "score_mod_tanh_gate"]}

NUMPY = {  # plugin: (the variant's prefill cases, {family: the cases it must fail})
    decode_planted.DecodeDropsCap: ("softcap", {
        "decode": {"softcap_one_row", "softcap_window"}, "paged": {"softcap_one_row"}}),
    decode_planted.DecodeDropsSink: ("sinks", {
        "decode": {"sinks_window"}, "paged": {"sinks_gqa", "sinks_window"}}),
    # (the score modifier's i is the same position: from row 0 too)
    decode_planted.AlibiAtZero: ("alibi", {
        "decode": {"alibi_few_rows", "rel_t5_one_row", "score_mod_at_offset"},
        "paged": {"alibi_rows_at_offsets", "score_mod_rows_at_offsets"}}),
    score_mod_planted.PagedScoreModAtPoolSlots: ("score_mod", {
        "paged": {"score_mod_rows_at_offsets"}}),
    packed_planted.PackedDropsCap: ("softcap", {
        "packed": {"softcap_causal_docs", "softcap_agrees_with_padded"}}),
    score_mod_planted.ScoreModAtRowIndices: ("score_mod", {
        "decode": {"score_mod_at_offset"}, "paged": {"score_mod_rows_at_offsets"},
        "generation": {"score_mod_steps", "score_mod_agrees_with_prefill"}}),
    score_mod_planted.DecodeDropsScoreMod: ("score_mod", {
        "decode": {"score_mod_at_offset"}, "paged": {"score_mod_rows_at_offsets"},
        "generation": {"score_mod_steps", "score_mod_agrees_with_prefill"}}),
}
# The families each planted plugin runs: generation where a score modifier is at stake.
FORMS = ("decode", "paged", "packed")
SCORE_MOD_FORMS = FORMS + ("generation",)


def test_the_reference_passes_every_new_case():
    for family in SCORE_MOD_FORMS:
        outcomes = {n: _run(NumpyMHA(), family, n) for n in _names(family)}
        assert {o.outcome for o in outcomes.values()} == {"pass"}, \
            {n: o.reason for n, o in outcomes.items() if o.outcome != "pass"}


def _fails_only(plugin, variant, expected, families=FORMS):
    for name in PREFILL[variant]:  # right in prefill
        out = _run(plugin(), "variants", name)
        assert out.outcome == "pass", (name, out.reason)
    for family in families:
        outcomes = {n: _run(plugin(), family, n) for n in _names(family)}
        failed = {n for n, o in outcomes.items() if o.outcome in FAILED}
        want = expected.get(family, set())
        assert failed == want, (family, {n: outcomes[n].reason for n in failed ^ want})
        assert all(o.outcome == "pass" for n, o in outcomes.items() if n not in failed)


@pytest.mark.parametrize("plugin", NUMPY, ids=lambda c: c.name)
def test_a_plugin_wrong_in_one_form_fails_the_new_cases_and_passes_the_old(plugin):
    """Before these cases every one of them passed every case of the suite."""
    variant, expected = NUMPY[plugin]
    _fails_only(plugin, variant, expected, SCORE_MOD_FORMS if variant == "score_mod" else FORMS)


def test_torch_planted_decoders_fail_the_new_decode_cases_only():
    pytest.importorskip("torch")
    import variants_planted_torch as torch_planted

    _fails_only(torch_planted.TorchDecodeDropsCap, "softcap",
                {"decode": {"softcap_one_row", "softcap_window"}}, ("decode",))
    _fails_only(torch_planted.TorchAlibiAtZero, "alibi",
                {"decode": {"alibi_few_rows", "rel_t5_one_row", "score_mod_at_offset"}},
                ("decode",))
    _fails_only(torch_planted.TorchScoreModAtRowIndices, "score_mod",
                {"decode": {"score_mod_at_offset"},
                 "generation": {"score_mod_steps", "score_mod_agrees_with_prefill"}},
                ("decode", "generation"))


def test_a_packed_path_without_the_cap_disagrees_with_its_own_padded_path():
    out = _run(packed_planted.PackedDropsCap(), "packed", "softcap_agrees_with_padded")
    assert out.outcome == "fail" and out.reason.startswith("packed vs padded"), out.reason


def test_torch_flex_reads_each_batch_s_offset_in_its_score_mod(monkeypatch):
    """torch.flex runs ALiBi at decode natively: its score_mod adds the bias at each row's
    absolute position (the batch's offset, as its decode block mask reads it); the same
    adapter with the positions taken from row 0 fails the case, and the cap, which reads no
    position, still passes its decode case that way. One compile per case (seconds): the
    adapter with the positions changed runs as torch.flex[eager], the same translation
    (_variant_mods) called without torch.compile, so only the first case compiles."""
    pytest.importorskip("torch")
    from implementations.torch import compiled as tc

    assert _run(tc.TorchFlex(), "decode", "alibi_few_rows").outcome == "pass"
    assert _run(tc.TorchFlexEager(), "decode", "alibi_few_rows").outcome == "pass"
    right = tc._variant_mods
    monkeypatch.setattr(tc, "_variant_mods",
                        lambda variants, L, S, mask=None, **kw: right(variants, L, S, None, **kw))
    out = _run(tc.TorchFlexEager(), "decode", "alibi_few_rows")
    assert out.outcome == "fail", out.reason
    assert _run(tc.TorchFlexEager(), "decode", "softcap_one_row").outcome == "pass"


def test_a_score_mod_at_an_offset_or_a_step_fails_where_it_reads_the_row_index():
    """The planted modifier at the rows' indices (the offset forgotten) fails the decode
    case at its offsets and the generation case from its first step after the prefill (the
    prefill's rows are at their positions); each disagreement names where."""
    bug = score_mod_planted.ScoreModAtRowIndices()
    out = _run(bug, "decode", "score_mod_at_offset")
    assert out.outcome == "fail", out.reason
    out = _run(bug, "generation", "score_mod_steps")
    assert out.outcome == "fail" and "first wrong at step 2 of 5" in out.reason, out.reason
    out = _run(bug, "generation", "score_mod_agrees_with_prefill")
    assert out.outcome == "fail" and out.reason.startswith(
        "decode steps vs the module's own prefill"), out.reason


def test_a_packed_path_at_the_row_s_indices_disagrees_with_its_padded_path():
    """score_mod_agrees_with_padded: a packed path that hands the modifier the packed row's
    indices (a padded row's start at 0) disagrees with its own padded path; numpy passes."""
    class RowIndices(NumpyMHA):
        name = "planted.score_mod_packed_row_indices"

        def modify(self, scores, mod, mask=None):
            return super().modify(scores, mod)  # the segments never reach it

    assert _run(NumpyMHA(), "packed", "score_mod_agrees_with_padded").outcome == "pass"
    out = _run(RowIndices(), "packed", "score_mod_agrees_with_padded")
    assert out.outcome == "fail" and out.reason.startswith("packed vs padded"), out.reason


def test_torch_flex_maps_its_q_idx_through_the_offsets_for_a_score_mod(monkeypatch):
    """torch.flex's score_mod reads q_idx, the row within the query tensor: at a decode
    offset and at a generation step it maps it through the rows' absolute positions (as for
    a packed batch); the same translation given no positions (q_idx as it comes) fails the
    decode case. torch.eager and the uncompiled FlexAttention pass the decode and generation
    cases; compiled FlexAttention the decode one (one compile)."""
    pytest.importorskip("torch")
    from implementations.torch import compiled as tc
    from implementations.torch.eager import TorchEager

    assert _run(tc.TorchFlex(), "decode", "score_mod_at_offset").outcome == "pass"
    for impl in (TorchEager(), tc.TorchFlexEager()):
        for family, name in (("decode", "score_mod_at_offset"), ("generation", "score_mod_steps"),
                             ("generation", "score_mod_agrees_with_prefill"),
                             ("packed", "score_mod_agrees_with_padded")):
            out = _run(impl, family, name)
            assert out.outcome == "pass", (impl.name, name, out.reason)
    right = tc._variant_mods
    monkeypatch.setattr(tc, "_variant_mods",
                        lambda variants, L, S, mask=None, **kw: right(variants, L, S, None, **kw))
    out = _run(tc.TorchFlexEager(), "decode", "score_mod_at_offset")
    assert out.outcome == "fail", out.reason


def test_torch_flex_maps_kv_idx_through_the_sequences_of_a_one_row_packed_batch():
    """A packed batch of one row (sequences 5+7) with position_wave: FlexAttention's kv_idx
    is mapped to the key's position within its own sequence whatever the batch size (a
    table chosen by the positions' batch dimension left kv_idx as the packed slot at B = 1);
    uncompiled, so nothing compiles."""
    pytest.importorskip("torch")
    from implementations.torch import compiled as tc
    from suite.conformance.families.packed import packed_problem
    from suite.spec.variants import SCORE_MODS

    p = dataclasses.replace(packed_problem(3, [[5, 7]], causal=True, input_scale=2.0),
                            score_mod=SCORE_MODS["position_wave"]).validate()
    for impl in (NumpyMHA(), tc.TorchFlexEager()):
        out = run_problem(impl, Outcome(impl.name, "cpu", "float32", "packed", "one_row", 3,
                                        "pass"), p)
        assert out.outcome == "pass", (impl.name, out.reason)
