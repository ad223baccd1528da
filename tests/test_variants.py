"""Score variants (suite.spec.variants): the spec in hand-worked examples and a second, loop-by-loop
reading of it; the first-order bound through the cap; validation and features; the
references pass the variants family, planted bugs in each variant fail it, and a plugin
that lacks a variant's feature reports it unsupported."""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import numpy as np
import pytest

from suite.conformance import catalog, repro
from suite.conformance.judge import FAILED, Outcome, run_problem
from suite.plugins.declarations import VARIANT_FEATURES
from suite.plugins.interface import check_interface, grouped_for, query_head_order
from suite.spec import oracle
from suite.spec.oracle_grad import grads
from suite.spec.problem import InputError, Mask, Problem, Weights, make_problem
from suite.spec.variants import (
    SCORE_MODS,
    Alibi,
    RelBias,
    ScoreMod,
    alibi_slopes,
    relative_positions,
    t5_bucket,
)
from tests.conftest import PLUGINS

sys.path.insert(0, str(PLUGINS))
import variants_planted as planted  # noqa: E402  (tests/plugins, as --plugin loads it)

from implementations.numpy.mha import NumpyMHA  # noqa: E402

VARIANTS = catalog.of_family("variants")
NAMES = [c.name for c in VARIANTS]


def _run(impl, name: str, dtype: str = "float32", family: str = "variants") -> Outcome:
    """Case ``family/name`` on ``impl``, judged as ``mha-suite check`` judges it."""
    c = catalog.get(family, name)
    return c.run(impl, Outcome(impl.name, "cpu", dtype, c.family, c.name, c.seed, "pass"))


# --- the spec, by hand ------------------------------------------------------------------------
def _one_head(query, key, value, **variants) -> Problem:
    """E = H = D = 1 with identity weights and no biases: q = query, k = key, v = value."""
    one = np.ones((1, 1))
    arrays = [np.asarray(a, np.float64).reshape(1, -1, 1) for a in (query, key, value)]
    return Problem(*arrays, Weights(one, one, one, one), 1, **variants)


def test_worked_softcap_example():
    # q = 3, keys 2 and -1, scale 1: scores 6, -3; cap 4: 4 tanh(1.5), 4 tanh(-0.75)
    p = _one_head([3.0], [2.0, -1.0], [1.0, 0.0], softcap=4.0)
    a, b = 4 * math.tanh(1.5), 4 * math.tanh(-0.75)
    out, w = oracle.oracle(p)
    assert out[0, 0, 0] == pytest.approx(math.exp(a) / (math.exp(a) + math.exp(b)), rel=1e-14)
    assert w[0, 0, 0, 1] == pytest.approx(math.exp(b) / (math.exp(a) + math.exp(b)), rel=1e-14)


def test_worked_sink_example_and_a_row_with_no_key_attends_only_to_the_sink():
    # logits 1 and 0, sink log(2): weights e/(e+1+2), 1/(e+1+2); the sink takes no value
    p = _one_head([1.0], [1.0, 0.0], [1.0, 0.0], sinks=np.array([math.log(2.0)]))
    out, w = oracle.oracle(p)
    assert w[0, 0, 0].tolist() == pytest.approx([math.e / (math.e + 3), 1 / (math.e + 3)])
    assert out[0, 0, 0] == pytest.approx(math.e / (math.e + 3))
    dead = dataclasses.replace(p, mask=Mask(valid_lens=np.array([0])))
    out, w = oracle.oracle(dead)
    assert out[0, 0, 0] == 0.0 and (w == 0).all()  # zero head output, as the spec's zero rows


def test_alibi_terms_in_every_convention_and_alignment():
    # L = 2 queries over S = 4 keys: bottom-right, query i sits at key i + 2
    br = {c: Alibi(np.ones(1), c, "bottom_right").positions(2, 4) for c in ("key", "distance",
                                                                           "signed")}
    assert br["key"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert br["distance"].tolist() == [[-2, -1, 0, -1], [-3, -2, -1, 0]]
    assert br["signed"].tolist() == [[-2, -1, 0, 1], [-3, -2, -1, 0]]
    assert Alibi(np.ones(1), "distance").positions(2, 4).tolist() == [[0, -1, -2, -3],
                                                                      [-1, 0, -1, -2]]
    assert relative_positions("bottom_right", 2, 4).tolist() == [[-2, -1, 0, 1], [-3, -2, -1, 0]]


def test_alibi_slopes_are_the_papers_and_blooms():
    assert alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]
    # six heads: those of 4 heads, then every other one of 8 heads (BLOOM's build_alibi_tensor)
    assert alibi_slopes(6).tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]


def test_alibi_key_and_signed_agree_under_softmax_and_alignment_moves_only_distance():
    p = catalog.get("variants", "alibi_signed_long_query").problem()
    key = dataclasses.replace(p, alibi=dataclasses.replace(p.alibi, convention="key"))
    top = dataclasses.replace(p, alibi=dataclasses.replace(p.alibi, align="top_left"))
    np.testing.assert_allclose(oracle.oracle(key)[0], oracle.oracle(p)[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(oracle.oracle(top)[0], oracle.oracle(p)[0], rtol=0, atol=1e-12)
    q = catalog.get("variants", "alibi_distance_bottom_right").problem()
    moved = dataclasses.replace(q, alibi=dataclasses.replace(q.alibi, align="top_left"))
    assert np.abs(oracle.oracle(moved)[0] - oracle.oracle(q)[0]).max() > 1e-2


def test_t5_buckets_by_hand():
    rel = np.array([0, -1, 1, -7, -8, -128, 1000])
    assert t5_bucket(rel, True, 32, 128).tolist() == [0, 1, 17, 7, 8, 15, 31]
    rel = np.array([5, 0, -5, -15, -16, -1000])
    assert t5_bucket(rel, False, 32, 128).tolist() == [0, 0, 5, 15, 16, 31]
    clip = RelBias(np.zeros((1, 5)), "clip", True, 2)
    assert clip.buckets(1, 6).tolist() == [[2, 3, 4, 4, 4, 4]]


def test_t5_buckets_are_transformers_own():
    """The suite's bucketing (float64 log) gives T5's buckets (float32 log) on the cases'
    settings and others, both directions."""
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    from implementations.torch.common import t5_bucket as torch_t5_bucket

    rel = np.arange(-400, 400)
    for bidirectional in (True, False):
        for n, dist in ((16, 24), (16, 10), (32, 128), (8, 20), (64, 256)):
            want = t5.T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional,
                                                             n, dist).numpy()
            assert (t5_bucket(rel, bidirectional, n, dist) == want).all(), (n, dist)
            got = torch_t5_bucket(torch.tensor(rel), bidirectional, n, dist).numpy()
            assert (got == want).all(), (n, dist)


def _direct(p: Problem) -> np.ndarray:
    """The spec read loop by loop, per (batch, head, query row), apart from the oracle's
    vectorised code: the sink appended as one more logit and dropped (gpt-oss's sdpa)."""
    B, L, S, H, K, D, V = p.B, p.L, p.S, p.H, p.K, p.D, p.V
    w = p.weights
    q = (p.query @ w.w_q + w.b_q).reshape(B, L, H, D)
    k = (p.key @ w.w_k + w.b_k).reshape(B, S, K, D)
    v = (p.value @ w.w_v + w.b_v).reshape(B, S, K, V)
    allowed = p.mask.dense_allowed(B, H, L, S)
    off, seg = p.mask.query_offset, p.mask.segments

    def qpos(b: int, i: int, align: str) -> int:
        """Row i's absolute position: at its batch's offset, inside its packed sequence."""
        if seg is not None:
            return i - list(seg[b]).index(seg[b][i])
        if off is not None:
            return int(off[b]) + i
        return i + (S - L if align == "bottom_right" else 0)

    def kpos(b: int, j: int) -> int:
        return j - list(seg[b]).index(seg[b][j]) if seg is not None else j

    def bucket(rel: RelBias, d: int) -> int:
        if rel.bucketing == "clip":
            high = rel.max_distance if rel.bidirectional else 0
            return min(max(d, -rel.max_distance), high) + rel.max_distance
        return int(t5_bucket(np.array(d), rel.bidirectional, rel.table.shape[1],
                             rel.max_distance))

    heads = np.zeros((B, L, H, V))
    for b in range(B):
        for h in range(H):
            kv = h // (H // K)
            for i in range(L):
                logits = []
                for j in range(S):
                    s = float(q[b, i, h] @ k[b, j, kv]) * p.effective_scale
                    if p.softcap:
                        s = p.softcap * math.tanh(s / p.softcap)
                    if p.alibi is not None:
                        qi, kj = qpos(b, i, p.alibi.align), kpos(b, j)
                        s += p.alibi.slopes[h] * {"key": kj, "distance": -abs(qi - kj),
                                                  "signed": kj - qi}[p.alibi.convention]
                    if p.rel_bias is not None:
                        d = kpos(b, j) - qpos(b, i, p.rel_bias.align)
                        s += p.rel_bias.table[h, bucket(p.rel_bias, d)]
                    if p.score_mod is not None:  # i, j: at the offset, in a sequence
                        s = float(p.score_mod.fn(s, b, h, qpos(b, i, "top_left"), kpos(b, j),
                                                 math))
                    logits.append(s if allowed[b, h, i, j] else -math.inf)
                if p.sinks is not None:
                    logits.append(p.sinks[h])
                top = max(logits)
                if top == -math.inf:
                    continue  # no key: a zero head output
                e = np.exp(np.array(logits) - top)
                weights = e / e.sum()
                heads[b, i, h] = weights[:S] @ v[b, :, kv]
    return heads.reshape(B, L, H * V) @ w.w_o + w.b_o


@pytest.mark.parametrize("name", [n for n in NAMES if n != "own_score_mods"])
def test_the_oracle_is_the_spec_read_loop_by_loop(name):
    p = catalog.get("variants", name).problem()
    np.testing.assert_allclose(oracle.oracle(p)[0], _direct(p), rtol=0, atol=1e-10)


# The inference forms' cases that carry a score variant (issue 50): decode rows at offsets,
# paged caches, packed sequences whose positions restart.
FORM_VARIANTS = [(c.family, c.name) for fam in ("decode", "paged", "packed")
                 for c in catalog.of_family(fam) if c.problem().has_variants()]


def test_every_inference_form_carries_variants():
    fams = {f for f, _ in FORM_VARIANTS}
    assert fams == {"decode", "paged", "packed"}, FORM_VARIANTS
    feats = set().union(*(catalog.get(f, n).problem().features() for f, n in FORM_VARIANTS))
    assert {"softcap", "sinks", "alibi", "rel_bias", "value_width"} <= feats


@pytest.mark.parametrize("family,name", FORM_VARIANTS)
def test_the_oracle_reads_positions_at_offsets_and_in_sequences(family, name):
    """The oracle of each inference form with a variant is the spec read loop by loop, the
    positions taken directly (offset[b] + i; i minus its sequence's start); and a position
    variant there is not what it is at positions 0..L-1 (a test that could not tell an offset
    from none would pass an ALiBi aligned at 0)."""
    p = catalog.get(family, name).problem()
    np.testing.assert_allclose(oracle.oracle(p)[0], _direct(p), rtol=0, atol=1e-10)
    if p.alibi is None and p.rel_bias is None or p.mask.segments is not None:
        return
    # the same problem with the position variant at row i (offset 0): another answer
    B, L, S, H = p.B, p.L, p.S, p.H
    at_zero = np.zeros((B, H, L, S))
    if p.alibi is not None:
        at_zero += p.alibi.slopes[:, None, None] * -np.abs(
            np.arange(L)[:, None] - np.arange(S)[None, :])
    if p.rel_bias is not None:
        at_zero += p.rel_bias.table[:, p.rel_bias.buckets(L, S)]
    moved = dataclasses.replace(p, alibi=None, rel_bias=None, mask=dataclasses.replace(
        p.mask, bias=at_zero))
    assert np.abs(oracle.oracle(moved)[0] - oracle.oracle(p)[0]).max() > 1e-2


def test_packed_positions_restart_in_each_sequence():
    from suite.spec.variants import segment_positions, token_positions

    seg = np.array([[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 1]])
    assert segment_positions(seg).tolist() == [[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 3, 4]]
    q, k = token_positions("top_left", 2, 8, offsets=np.array([5, 0]))
    assert q.tolist() == [[5, 6], [0, 1]] and k.tolist() == [list(range(8))]
    # the "key" convention reads a packed key's position in its own sequence
    a = Alibi(np.ones(1), "key")
    assert a.term(*token_positions("top_left", 6, 6, segments=seg[:1]))[0, 4].tolist() == \
        [0, 1, 2, 0, 1, 0]


def test_position_variants_beside_the_forms_are_posed_and_checked():
    """ALiBi and a table beside an offset, segments or steps validate (top_left: the form
    places the rows); bottom_right there is refused by name. A score_mod is posed beside
    each: its i and j are the same absolute positions (at the offset, in a sequence, at a
    step's place in the whole sequence)."""
    p = catalog.get("decode", "alibi_few_rows").problem()
    with pytest.raises(InputError, match="alibi.align"):
        dataclasses.replace(p, alibi=dataclasses.replace(p.alibi, align="bottom_right")
                            ).validate()
    dataclasses.replace(p, alibi=None, score_mod=SCORE_MODS["tanh_gate"]).validate()
    q = catalog.get("packed", "alibi_docs").problem()
    dataclasses.replace(q, score_mod=SCORE_MODS["tanh_gate"]).validate()
    g = catalog.get("generation", "alibi_steps").problem()
    dataclasses.replace(g, score_mod=SCORE_MODS["tanh_gate"]).validate()


def test_a_score_mod_at_an_offset_reads_each_row_s_absolute_position_by_hand():
    """score_mod_at at per-batch offsets 5 and 1 of a 7-slot cache: i is offset[b] + row,
    (B, 1, L, 1), j the key's cache slot (1, 1, 1, S); without an offset (a generation
    problem: one causal problem whose chunks are its rows) i and j are the row and key
    indices."""
    p = make_problem(3, 2, 2, 7, 16, 4, mask=Mask(causal=True, query_offset=np.array([5, 1])))
    p = dataclasses.replace(p, score_mod=SCORE_MODS["position_wave"]).validate()
    b, h, i, j = oracle.score_mod_at(p, (2, 4, 2, 7), np.float64)
    assert b.ravel().tolist() == [0, 1] and h.ravel().tolist() == [0, 1, 2, 3]
    assert i.shape == (2, 1, 2, 1) and i[:, 0, :, 0].tolist() == [[5, 6], [1, 2]]
    assert j.shape == (1, 1, 1, 7) and j.ravel().tolist() == list(range(7))
    g = catalog.get("generation", "score_mod_steps").problem()
    _, _, i, j = oracle.score_mod_at(g, (g.B, g.H, g.L, g.S), np.float32)
    assert i.dtype == np.float32 and i.ravel().tolist() == list(range(g.L))
    assert j.ravel().tolist() == list(range(g.S))


def test_a_decode_row_with_a_score_mod_is_that_row_of_the_whole_causal_problem():
    """One decode step of a sequence, with a modifier of positions as they are
    (position_wave), is that sequence's row of the whole causal problem with it (what a
    generating model's cache must reproduce), by the oracle; the modifier handed the row's
    index (0) instead of its position gives another answer, so the check tells them apart."""
    full = make_problem(7, 1, 9, 9, 16, 4, self_attention=True, mask=Mask(causal=True))
    wave = SCORE_MODS["position_wave"]
    full = dataclasses.replace(full, score_mod=wave)
    want = oracle.oracle(full)[0]
    for t in (0, 4, 8):
        step = dataclasses.replace(full, query=full.query[:, t:t + 1], mask=Mask(
            causal=True, query_offset=np.array([t]))).validate()
        np.testing.assert_allclose(oracle.oracle(step)[0], want[:, t:t + 1], rtol=0,
                                   atol=1e-12)
    at_row = dataclasses.replace(step, score_mod=ScoreMod(
        "at_row", lambda s, b, h, i, j, xp: wave.fn(s, b, h, i - 8, j, xp)))
    assert np.abs(oracle.oracle(at_row)[0] - want[:, 8:9]).max() > 1e-2


def test_an_infinite_score_under_a_cap_is_finite():
    p = catalog.get("variants", "softcap_inf_score").problem()
    assert np.isinf(p.query).any()
    out, _ = oracle.oracle(p)
    assert np.isfinite(out).all()  # the cap made the row's +-inf scores +-20
    uncapped, _ = oracle.oracle(dataclasses.replace(p, softcap=None))
    assert np.isnan(uncapped[0, 3]).all() and np.isfinite(np.delete(uncapped[0], 3, 0)).all()


# --- the rounding bound and the baselines ------------------------------------------------------
def test_the_cap_never_grows_an_error_it_is_given():
    """tanh' = 1 - tanh^2 <= 1: through the cap, with no rounding of its own (u = 0), the
    logits' error variance only shrinks (saturated logits forget it)."""
    p = catalog.get("variants", "softcap_large_logits").problem()
    parts = oracle.forward(p)["variants"]
    dl = np.random.default_rng(0).random(parts["scaled"].shape)
    through = oracle._through_variants(p, parts, dl, 0.0)
    assert (through <= dl).all() and (through < 1e-3 * dl).any()


def test_the_baseline_computes_the_variants_in_the_dtype():
    """naive_t in float16 rounds the cap, the slopes and the sink as float16 does: its error
    against the oracle is float16-sized, not float64's."""
    p = catalog.get("variants", "combined").problem()
    ref = oracle.oracle(p)[0]
    err16 = np.abs(oracle.naive(p, "float16")[0] - ref).max()
    err32 = np.abs(oracle.naive(p, "float32")[0] - ref).max()
    assert 1e-4 < err16 < 1e-1 and 1e-8 < err32 < 1e-5


# --- validation and features ------------------------------------------------------------------
def _base() -> Problem:
    return make_problem(0, 2, 5, 6, 16, 4)


@pytest.mark.parametrize("change, needle", [
    ({"softcap": 0.0}, "softcap: expected a finite positive float"),
    ({"softcap": -3.0}, "softcap: expected a finite positive float"),
    ({"alibi": Alibi(np.ones(3))}, r"alibi.slopes: expected a float array of shape \(4,\)"),
    ({"alibi": Alibi(np.ones(4), "relative")}, "alibi.convention: expected one of"),
    ({"alibi": Alibi(np.ones(4), align="center")}, "alibi.align: expected one of"),
    ({"sinks": np.array([0.0, np.nan, 0.0, 0.0])}, "sinks: expected finite values"),
    ({"sinks": np.zeros(2)}, r"sinks: expected a float array of shape \(4,\)"),
    ({"rel_bias": RelBias(np.zeros((4, 8)), "clip", True, 4)},
     "rel_bias.table: expected 9 buckets for clip"),
    ({"rel_bias": RelBias(np.zeros((4, 16)), "t5", True, 4)}, "rel_bias: expected t5 buckets"),
    ({"rel_bias": RelBias(np.zeros((3, 16)))}, "rel_bias.table: expected a float array"),
    ({"score_mod": ScoreMod("", lambda s, *a: s)}, "score_mod: expected a suite.spec.variants"),
    ({"score_mod": ScoreMod("rows", lambda s, b, h, i, j, xp: s.sum(-1))},
     r"score_mod 'rows': expected a score of the input's shape \(2, 4, 5, 6\).*got \(2, 4, 5\)"),
    ({"score_mod": ScoreMod("nan", lambda s, b, h, i, j, xp: s * xp.nan)},
     "score_mod 'nan': expected finite scores, got NaN or inf everywhere"),
    ({"score_mod": ScoreMod("inf", lambda s, b, h, i, j, xp: s * 0 + xp.inf)},
     "score_mod 'inf': expected finite scores"),
    ({"score_mod": ScoreMod("raises", lambda s, b, h, i, j, xp: xp.nope(s))},
     "score_mod 'raises': raised AttributeError on a"),
    ({"value_head_dim": 8}, r"weights.w_v: expected shape \(16, 32\)"),
])
def test_a_bad_variant_is_named_in_one_line(change, needle):
    with pytest.raises(InputError, match=needle) as info:
        dataclasses.replace(_base(), **change).validate()
    assert "\n" not in str(info.value)


def test_each_variant_adds_its_feature_and_none_changes_an_existing_problem():
    base = _base()
    assert not base.features() & VARIANT_FEATURES and not base.has_variants()
    assert make_problem(3, 2, 5, 6, 16, 4).query.tolist() == make_problem(
        3, 2, 5, 6, 16, 4, value_head_dim=None).query.tolist()
    for name in NAMES:
        p = catalog.get("variants", name).problem()
        assert p.features() & VARIANT_FEATURES or name == "own_score_mods", name
    p = catalog.get("variants", "combined").problem()
    assert p.features() >= {"softcap", "alibi", "rel_bias", "sinks", "value_width", "gqa"}


# --- the references pass; planted bugs fail ---------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_numpy_passes_every_variants_case(dtype):
    outcomes = {n: _run(NumpyMHA(), n, dtype) for n in NAMES}
    bad = {n: (o.outcome, o.reason) for n, o in outcomes.items()
           if o.outcome != ("unsupported" if n == "own_score_mods" else "pass")}
    assert not bad, bad


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_eager_passes_every_variants_case(dtype):
    pytest.importorskip("torch")
    from implementations.torch.eager import TorchEager

    outcomes = {n: _run(TorchEager(), n, dtype) for n in NAMES}
    bad = {n: (o.outcome, o.reason) for n, o in outcomes.items()
           if o.outcome != ("unsupported" if n == "own_score_mods" else "pass")}
    assert not bad, bad


# plugin -> the variants cases it must fail (every other one passes or, for own_score_mods,
# is unsupported): the bug shows wherever its variant can show it, and nowhere else.
CAP = {"combined", "softcap_valid_lens", "softcap_causal_bottom_right_long_query",
       "softcap_large_logits", "softcap_inf_score", "softcap_self_causal_padding"}
ALIBI = {"combined", "alibi_key_causal", "alibi_distance_bottom_right",
         "alibi_signed_long_query", "alibi_distance_six_heads", "alibi_key_self_causal_padding"}
SINKS = {"combined", "sinks_fully_masked", "sinks_self_causal_padding",
         "sinks_causal_bottom_right_long_query", "sinks_large_logits"}
REL = {"combined", "rel_t5_bidirectional", "rel_t5_causal_decoder", "rel_clip_bottom_right"}
PLANTED = {
    planted.DropsCap: CAP,
    planted.CapsAfterBias: {"combined"},  # the one case with a cap beside position biases
    planted.SlopesReversed: ALIBI,
    planted.SlopesNegated: ALIBI,
    # measured from the top-left: only the symmetric distance changes under softmax
    planted.AlibiTopLeft: {"combined", "alibi_distance_bottom_right"},
    planted.ForgetsSink: SINKS,
    planted.SinkWithValue: SINKS,
    planted.RelTableTransposed: REL,
    # distance_wave's cos((i - j) / 3) is even: swapping i and j changes nothing there
    planted.ScoreModIndicesSwapped: {"score_mod_tanh_gate"},
    # value_width_narrow: the columns it reads run past the projection (an error)
    planted.KeyWidthValues: {"combined", "value_width_wide_gqa", "value_width_narrow"},
    planted.OwnModifierWrong: {"own_score_mods"},
}


@pytest.mark.parametrize("plugin", list(PLANTED), ids=[p.name for p in PLANTED])
def test_a_planted_variant_bug_fails_its_cases_and_only_those(plugin):
    outcomes = {n: _run(plugin(), n) for n in NAMES}
    failed = {n for n, o in outcomes.items() if o.outcome in FAILED}
    assert failed == PLANTED[plugin], {n: outcomes[n].reason for n in failed ^ PLANTED[plugin]}
    own = "pass" if plugin.score_mods else "unsupported"
    others = {n: o.outcome for n, o in outcomes.items() if n not in failed}
    assert all(v == (own if n == "own_score_mods" else "pass") for n, v in others.items()), \
        others
    worst = max((o for o in outcomes.values() if o.outcome == "fail"), key=lambda o: (
        o.worst().err / o.worst().bound if o.worst() and np.isfinite(o.worst().err) else np.inf))
    assert worst.reason  # the failure says where: err vs bound, or NaN where the spec has none


@pytest.mark.parametrize("plugin, cases", [
    ("TorchDropsCap", CAP), ("TorchSlopesReversed", ALIBI),
    ("TorchAlibiTopLeft", {"combined", "alibi_distance_bottom_right"}),
    # SDPA runs no score variant (combined: unsupported); value_width_narrow's columns run
    # past the projection (an error)
    ("SDPAKeyWidthValues", {"value_width_wide_gqa", "value_width_narrow"}),
    ("TorchForgetsSink", SINKS), ("TorchRelTableHeadsReversed", REL)])
def test_a_planted_variant_bug_on_torch_fails_its_cases(plugin, cases):
    pytest.importorskip("torch")
    import variants_planted_torch

    impl = getattr(variants_planted_torch, plugin)()
    outcomes = {n: _run(impl, n).outcome for n in NAMES}
    assert {n for n, o in outcomes.items() if o in FAILED} == cases, outcomes


@pytest.mark.parametrize("case,bug", [
    ("softcap_valid_lens", "drops the cap"),
    ("alibi_distance_bottom_right", "reverses the slopes"),
])
def test_flex_attention_computes_variants_in_its_score_mod_and_a_wrong_one_fails(case, bug,
                                                                                 monkeypatch):
    """torch.flex's variants go through FlexAttention's score_mod (compiled); the same
    adapter with one step wrong fails the case. (The right one passes these cases in every
    dtype in CI's check; each case here compiles once, seconds.)"""
    pytest.importorskip("torch")
    import dataclasses as dc

    from implementations.torch import compiled as torch_compiled

    def wrong(variants, L, S, mask=None, **kw):
        if bug == "drops the cap":
            variants = dc.replace(variants, softcap=None)
        else:
            variants = dc.replace(variants, alibi=dc.replace(
                variants.alibi, slopes=variants.alibi.slopes.flip(0)))
        return right(variants, L, S, mask, **kw)

    right = torch_compiled._variant_mods
    monkeypatch.setattr(torch_compiled, "_variant_mods", wrong)
    out = _run(torch_compiled.TorchFlex(), case)
    assert out.outcome == "fail", (out.outcome, out.reason)


def test_a_plugins_own_score_mod_runs_without_a_change_to_the_suite():
    assert _run(planted.OwnModifier(), "own_score_mods").outcome == "pass"
    wrong = _run(planted.OwnModifierWrong(), "own_score_mods")
    assert wrong.outcome == "fail" and "later_keys_penalty" in wrong.reason
    with pytest.raises(TypeError, match="not the feature 'score_mod'"):
        check_interface(type("NoFeature", (planted.OwnModifier,), {
            "features": NumpyMHA.features - {"score_mod"}}))
    with pytest.raises(TypeError, match="score_mods: expected a tuple"):
        check_interface(type("Bare", (NumpyMHA,), {"score_mods": (lambda s: s,)}))


# --- a plugin without a variant's feature: unsupported, never failed ---------------------------
def test_a_plugin_lacking_a_variant_feature_reports_those_cases_unsupported():
    class NoSinks(NumpyMHA):
        name = "test.no_sinks"
        features = NumpyMHA.features - {"sinks"}

    outcomes = {n: _run(NoSinks(), n) for n in NAMES}
    for n, o in outcomes.items():
        p = catalog.get("variants", n).problem()
        want = "unsupported" if p.sinks is not None or n == "own_score_mods" else "pass"
        assert o.outcome == want, (n, o.outcome, o.reason)
    assert "needs sinks" in outcomes["sinks_fully_masked"].reason


def test_the_other_builtins_declare_no_variant():
    from implementations.numpy.flash import NumpyFlashMHA

    assert not NumpyFlashMHA.features & VARIANT_FEATURES
    flash = _run(NumpyFlashMHA(), "softcap_valid_lens")
    assert flash.outcome == "unsupported" and "softcap" in flash.reason
    torch = pytest.importorskip("torch")  # noqa: F841
    from implementations.torch.compiled import TorchCompiled
    from implementations.torch.sdpa import TorchSDPA

    assert not TorchCompiled.features & VARIANT_FEATURES
    # SDPA takes value heads of their own width (E_v != E) and no score variant
    assert TorchSDPA.features & VARIANT_FEATURES == {"value_width"}
    sdpa = _run(TorchSDPA(), "softcap_valid_lens")
    assert sdpa.outcome == "unsupported" and "needs softcap" in sdpa.reason
    for name in ("value_width_wide_gqa", "value_width_narrow"):
        out = _run(TorchSDPA(), name)
        assert out.outcome == "pass", (name, out.reason)



# --- self-attention forms (#52 item 3) ---------------------------------------------------------
class SelfNumpy(NumpyMHA):
    """The reference as a self-attention layer: one input for query, key and value."""

    name = "test.self_numpy"
    kv_source = "self"


class SelfDropsCap(planted.DropsCap):
    name = "bug.self_drops_cap"
    kv_source = "self"


# The cross-attention cases with a square self-attention form, and the variant each carries.
SQUARE = {"combined": "softcap", "softcap_valid_lens": "softcap",
          "softcap_causal_bottom_right_long_query": "softcap", "value_width_narrow": "value_width"}


@pytest.mark.parametrize("name", sorted(SQUARE))
def test_a_cross_attention_variant_case_has_a_self_attention_form(name):
    """A self-attention layer (kv_source="self") is given the case's square form (one input,
    Lq = Lk, the variant kept) where it used to be unsupported for Lq != Lk; a plugin with
    separate inputs keeps the case's own problem (its id and known-failure records hold)."""
    case = catalog.get("variants", name)
    own, square = case.problem_for(NumpyMHA()), case.problem_for(SelfNumpy())
    assert own.L != own.S and own.query is not own.key
    assert square.query is square.key is square.value and square.L == square.S
    assert SQUARE[name] in square.features() and "cross" not in square.features()
    assert square.features() - {"cross", "causal_bottom_right"} >= \
        own.features() - {"cross", "causal_bottom_right"}
    out = _run(SelfNumpy(), name)
    assert out.outcome == "pass", out.reason


def test_a_self_attention_layer_meets_a_cap_in_five_of_six_cases_and_a_dropped_cap_fails_them():
    """Every soft-capping case but the infinite score (whose inf, in the one input, is in a
    key and a value too) now runs on a self-attention layer: a layer that drops its cap fails
    each, beside key padding, rows with no key (softcap_causal_bottom_right_long_query's
    batch 1) and no causal mask (softcap_valid_lens); the reference passes each."""
    caps = sorted(CAP)
    ran = {n: _run(SelfDropsCap(), n) for n in caps}
    assert ran["softcap_inf_score"].outcome == "unsupported", ran["softcap_inf_score"].reason
    for n in set(caps) - {"softcap_inf_score"}:
        assert ran[n].outcome == "fail", (n, ran[n].outcome, ran[n].reason)
        assert _run(SelfNumpy(), n).outcome == "pass", n
    p = catalog.get("variants", "softcap_causal_bottom_right_long_query").problem_for(SelfNumpy())
    assert np.asarray(p.mask.valid_lens).min() == 0  # rows with no key, as the cross form has

# --- gradients, grouping, replay --------------------------------------------------------------
def test_the_gradient_oracle_carries_cap_alibi_sinks_table_and_value_width():
    """Against central differences of the float64 forward, on every input and weight."""
    p = catalog.get("gradients", "sinks_rel_value_width").problem()
    p = dataclasses.replace(p, softcap=1.5, alibi=Alibi(alibi_slopes(4), "distance"))
    g = grads(p)
    target = np.random.default_rng([p.B, p.L, p.S, p.E, 7]).standard_normal((p.B, p.L, p.E))

    def loss(q: Problem) -> float:
        return float((oracle.oracle(q)[0] * target).sum())

    rng = np.random.default_rng(1)
    for name in ("query", "key", "value", "w_q", "w_k", "w_v", "w_o", "b_q", "b_v"):
        holder = p if name in ("query", "key", "value") else p.weights
        arr = getattr(holder, name)
        for flat in rng.choice(arr.size, 3, replace=False):
            idx = np.unravel_index(flat, arr.shape)
            moved = []
            for step in (1e-6, -1e-6):
                a = arr.copy()
                a[idx] += step
                q = dataclasses.replace(p, **{name: a}) if holder is p else \
                    dataclasses.replace(p, weights=dataclasses.replace(p.weights, **{name: a}))
                moved.append(loss(q))
            numeric = (moved[0] - moved[1]) / 2e-6
            assert g[name][idx] == pytest.approx(numeric, rel=1e-5, abs=1e-7), (name, idx)


def test_gradients_of_a_score_mod_problem_are_unsupported_not_judged():
    p = dataclasses.replace(catalog.get("gradients", "plain").problem(),
                            score_mod=SCORE_MODS["tanh_gate"])
    with pytest.raises(ValueError, match="does not differentiate a score_mod"):
        grads(p)
    c = catalog.get("gradients", "plain")
    out = c.judge_problem(NumpyMHA(), Outcome("numpy", "cpu", "float32", c.family, c.name,
                                              c.seed, "pass"), p)
    assert out.outcome == "unsupported" and "score_mod" in out.reason


def test_an_interleaved_library_gets_its_per_head_variants_in_its_head_order():
    import kv_grouping

    p = catalog.get("variants", "combined").problem()
    impl = kv_grouping.Interleaved()
    order = query_head_order(impl, p)
    assert order.tolist() == [0, 2, 1, 3]
    given = grouped_for(impl, p)
    assert given.alibi.slopes.tolist() == p.alibi.slopes[order].tolist()
    assert (given.sinks == p.sinks[order]).all()
    assert (given.rel_bias.table == p.rel_bias.table[order]).all()
    assert run_problem(impl, Outcome(impl.name, "cpu", "float64", "variants", "combined", 0,
                                     "pass"), p).outcome == "pass"


def test_a_variant_problem_replays_from_its_saved_arrays(tmp_path):
    for name in ("combined", "score_mod_tanh_gate", "rel_clip_bottom_right"):
        p = catalog.get("variants", name).problem()
        repro.save_problem(tmp_path / "p.npz", p)
        back, _ = repro.load_problem(tmp_path / "p.npz")
        assert oracle.digest(back) == oracle.digest(p), name
    own = dataclasses.replace(p, score_mod=planted.LATER_KEYS)
    repro.save_problem(tmp_path / "own.npz", own)
    with pytest.raises(repro.ReproError, match="later_keys_penalty"):
        repro.load_problem(tmp_path / "own.npz")


# --- the random shapes draw the variants a plugin declares --------------------------------------
def test_random_shapes_draw_each_declared_variant_and_none_undeclared():
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    from suite.conformance.tests.test_hypothesis import problems

    quick = settings(max_examples=200, database=None, suppress_health_check=list(HealthCheck))
    every = NumpyMHA.features
    for field in ("softcap", "alibi", "sinks", "rel_bias"):
        p = find(problems(every), lambda p, f=field: getattr(p, f) is not None, settings=quick)
        assert p.validate() is p
    assert find(problems(every), lambda p: p.V != p.D, settings=quick).V != 0
    bare = every - VARIANT_FEATURES
    with pytest.raises(NoSuchExample):
        find(problems(bare), lambda p: p.has_variants(), settings=quick)
    # one input for query, key and value where the plugin takes only that
    p = find(problems(every, True), lambda p: p.L > 1, settings=quick)
    assert p.query is p.key is p.value


def test_a_planted_variant_bug_fails_the_random_shapes(tmp_path, cli):
    """The drawn variants reach a wrong kernel: the cap dropped fails the hypothesis family."""
    out = tmp_path / "c.json"
    proc = cli("check", "--workers", "1", "--plugin", str(PLUGINS / "variants_planted.py"),
               "--impl", "bug.drops_cap", "--dtype", "float32", "-k", "random_shapes",
               "--json", str(out))
    (rec,) = json.loads(out.read_text())["results"]
    assert rec["outcome"] == "fail" and "B=" in rec["reason"], (rec, proc.stdout[-2000:])
