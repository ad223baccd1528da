"""Score variants in the inference forms (issue 50): the decode, paged and packed cases that
carry a cap, sinks, ALiBi, a relative table or a value width; planted plugins right in prefill
and wrong in one form for one variant fail exactly the new cases of that form and pass the
old ones (the variants family's prefill cases and the form's cases without the variant),
on NumPy and on torch."""

from __future__ import annotations

import sys

import pytest

from suite.conformance import catalog
from suite.conformance.judge import FAILED, Outcome
from tests.conftest import PLUGINS

sys.path.insert(0, str(PLUGINS))
import decode_planted  # noqa: E402  (tests/plugins, as --plugin loads it)
import packed_planted  # noqa: E402

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
                     "rel_clip_bottom_right", "rel_t5_causal_decoder"]}

NUMPY = {  # plugin: (the variant's prefill cases, {family: the cases it must fail})
    decode_planted.DecodeDropsCap: ("softcap", {
        "decode": {"softcap_one_row", "softcap_window"}, "paged": {"softcap_one_row"}}),
    decode_planted.DecodeDropsSink: ("sinks", {
        "decode": {"sinks_window"}, "paged": {"sinks_gqa", "sinks_window"}}),
    decode_planted.AlibiAtZero: ("alibi", {
        "decode": {"alibi_few_rows", "rel_t5_one_row"}, "paged": {"alibi_rows_at_offsets"}}),
    packed_planted.PackedDropsCap: ("softcap", {
        "packed": {"softcap_causal_docs", "softcap_agrees_with_padded"}}),
}


def test_the_reference_passes_every_new_case():
    for family in ("decode", "paged", "packed"):
        outcomes = {n: _run(NumpyMHA(), family, n) for n in _names(family)}
        assert {o.outcome for o in outcomes.values()} == {"pass"}, \
            {n: o.reason for n, o in outcomes.items() if o.outcome != "pass"}


def _fails_only(plugin, variant, expected, families=("decode", "paged", "packed")):
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
    _fails_only(plugin, variant, expected)


def test_torch_planted_decoders_fail_the_new_decode_cases_only():
    pytest.importorskip("torch")
    import variants_planted_torch as torch_planted

    _fails_only(torch_planted.TorchDecodeDropsCap, "softcap",
                {"decode": {"softcap_one_row", "softcap_window"}}, ("decode",))
    _fails_only(torch_planted.TorchAlibiAtZero, "alibi",
                {"decode": {"alibi_few_rows", "rel_t5_one_row"}}, ("decode",))


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
                        lambda variants, L, S, mask=None: right(variants, L, S, None))
    out = _run(tc.TorchFlexEager(), "decode", "alibi_few_rows")
    assert out.outcome == "fail", out.reason
    assert _run(tc.TorchFlexEager(), "decode", "softcap_one_row").outcome == "pass"
