"""The decode form (``Mask.query_offset``, suite.conformance.families.decode): query rows at per-batch offsets
into a key/value cache, the oracle's mask for them, the input checks, and planted decoders
that put the rows at the wrong positions (tests/plugins/decode_planted.py)."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

from suite.conformance import catalog, repro
from suite.conformance.judge import FAILED, Outcome
from suite.spec import oracle
from suite.spec.problem import InputError, Mask, make_problem
from tests.conftest import PLUGINS

sys.path.insert(0, str(PLUGINS))
import decode_planted as planted  # noqa: E402  (tests/plugins, as --plugin loads it)

from implementations.numpy.mha import NumpyMHA  # noqa: E402

NAMES = [c.name for c in catalog.of_family("decode")]


def _run(impl, name: str, dtype: str = "float32") -> Outcome:
    c = catalog.get("decode", name)
    return c.run(impl, Outcome(impl.name, "cpu", dtype, c.family, c.name, c.seed, "pass"))


def test_each_batch_sees_the_keys_up_to_its_own_position():
    """Rows at offsets 3 and 0 of a 6-slot cache, lengths 5 and 2: row i of batch b sees
    keys j <= offset[b] + i and j < length[b]."""
    m = Mask(valid_lens=np.array([5, 2]), causal=True, query_offset=np.array([3, 0]))
    got = m.dense_allowed(2, 1, 2, 6)[:, 0]
    want = np.array([[[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]],
                     [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]]], dtype=bool)
    np.testing.assert_array_equal(got, want)
    assert m.kinds == {"valid_lens", "causal", "decode"}


def test_a_decode_row_is_the_same_row_of_the_whole_causal_problem():
    """One decode step of a sequence is that sequence's row in full causal self-attention
    (what a generating model's cache must reproduce), by the oracle."""
    full = make_problem(7, 1, 9, 9, 16, 4, self_attention=True, mask=Mask(causal=True))
    want = oracle.forward(full)["out"]
    for t in (0, 4, 8):
        step = dataclasses.replace(full, query=full.query[:, t:t + 1], mask=Mask(
            causal=True, query_offset=np.array([t])))
        got = oracle.forward(step.validate())["out"]
        np.testing.assert_allclose(got, want[:, t:t + 1], atol=1e-12)


@pytest.mark.parametrize("mask, said", [
    (Mask(causal=True, query_offset=np.array([0, 9])), "mask.query_offset: expected values in"),
    (Mask(causal=True, query_offset=np.array([1])), "mask.query_offset: expected shape (2,)"),
    (Mask(query_offset=np.array([1, 2])), "mask.query_offset: expected a causal mask"),
    (Mask(causal=True, causal_align="bottom_right", query_offset=np.array([1, 2])),
     "mask.query_offset: expected a causal mask"),
])
def test_a_wrong_offset_is_one_line_naming_it(mask, said):
    with pytest.raises(InputError) as exc:
        make_problem(1, 2, 3, 10, 16, 4, mask=mask).validate()
    assert str(exc.value).startswith(said), str(exc.value)


def test_the_offsets_round_trip_through_a_reproducer(tmp_path):
    p = catalog.get("decode", "few_rows").problem()
    repro.save_problem(tmp_path / "p.npz", p)
    back, _ = repro.load_problem(tmp_path / "p.npz")
    np.testing.assert_array_equal(back.mask.query_offset, p.mask.query_offset)
    np.testing.assert_array_equal(oracle.forward(back)["out"], oracle.forward(p)["out"])


def test_the_reference_passes_every_decode_case():
    outcomes = {n: _run(NumpyMHA(), n).outcome for n in NAMES}
    assert set(outcomes.values()) == {"pass"}, outcomes
    assert len(NAMES) == 17


# Which cases each planted decoder fails (run on float32): a row of one step (lengths bound it,
# lengths = offset + 1) cannot show a late or end-aligned offset; several rows, the offsets
# alone, a window and a chunk do; and so does one row whose ALiBi or relative table reads its
# (moved) position, and so do the rows whose score modifier reads it.
MOVED = {"few_rows", "offsets_alone", "window_in_cache", "mqa", "prefill_chunk",
         "softcap_window", "sinks_window", "value_width_mqa", "alibi_few_rows", "rel_t5_one_row",
         "score_mod_at_offset"}
PLANTED = {
    planted.DecodesAtZero: set(NAMES),
    planted.DecodesOneLate: MOVED,
    planted.DecodesAtCacheEnd: MOVED,
    planted.DecodesAtFirstOffset: MOVED | {"static_cache"},
    # the lengths hide something causality at the offset does not only where the rows sit
    # past their cache's length: before that case every decode case passed it
    planted.DecodesIgnoringLengths: {"rows_past_length"},
}


@pytest.mark.parametrize("plugin", PLANTED, ids=lambda c: c.name)
def test_a_planted_decoder_fails_its_cases_and_only_those(plugin):
    outcomes = {n: _run(plugin(), n) for n in NAMES}
    failed = {n for n, o in outcomes.items() if o.outcome in FAILED}
    assert failed == PLANTED[plugin], {n: outcomes[n].reason for n in failed ^ PLANTED[plugin]}
    assert all(o.outcome == "pass" for n, o in outcomes.items() if n not in failed)


def test_a_plugin_without_the_feature_is_unsupported_not_failed():
    class NoDecode(NumpyMHA):
        name = "numpy.no_decode"
        features = NumpyMHA.features - {"decode"}

    outcomes = {n: _run(NoDecode(), n) for n in NAMES}
    assert {o.outcome for o in outcomes.values()} == {"unsupported"}
    assert all("decode" in o.reason for o in outcomes.values())
