"""The variants family: each score variant (``suite.spec.variants``) with the masks it meets.

Soft-capping, ALiBi (each convention, both alignments), sinks, a relative position table
(T5's bucketing both ways, a clipped distance), a score modifier (the suite's examples and
the plugin's own ``score_mods``) and value heads of their own width, each with key padding,
causal masks in both alignments and rows with no key to attend; large logits and an
infinite score under a cap. Each case needs the features its variants name, so a plugin
that lacks one reports it unsupported. The spec of a row with no key: a zero head output,
with a sink too (the row attends only to the sink, which takes no value).

``suite.conformance.cases`` registers ``BUILDERS`` into its ``CASES`` (this module does not import it):
judged by the agreement rule like every family there, their inputs seeded from the case's
name.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from suite.conformance.families.declare import family
from suite.conformance.judge import Outcome, run_problem
from suite.plugins.interface import Implementation, declared
from suite.spec.problem import Mask, Problem, make_problem
from suite.spec.variants import SCORE_MODS, Alibi, RelBias, alibi_slopes

FAMILY = "variants"
# B, Lq, Lk, E, H as the masking family: D = 4; Lq < Lk (cross-attention) unless said.
VB, VL, VS, VE, VH = 3, 11, 13, 16, 4
# A cross-attention case with ``square=n`` has a self-attention form (Lq = Lk = n, one input
# for query, key and value, a bottom-right mask top-left: the same mask when square), the
# problem a self-attention layer (``kv_source="self"``) is given, as the dropout family's
# cases have: a soft-capping or latent-attention layer meets a cap and a value width beside
# key padding and rows with no key, not only the decoder forms below.
BUILDERS, case = family(FAMILY)  # (name, seed -> problem, Case keywords), in order




def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed + 1)  # as suite.conformance.cases draws a case's extra arrays


def _problem(seed: int, L: int = VL, S: int = VS, E: int = VE, H: int = VH,
             K: Optional[int] = None, square: Optional[int] = None, **kw) -> Problem:
    """The case's problem; ``square=n``: its self-attention form, Lq = Lk = n, one input,
    its mask top-left (with Lq = Lk both alignments are one mask)."""
    if square is None:
        return make_problem(seed, VB, L, S, E, H, K, **kw)
    mask = kw.pop("mask", None)
    if mask is not None and mask.causal_align == "bottom_right":
        mask = dataclasses.replace(mask, causal_align="top_left")
    return make_problem(seed, VB, square, square, E, H, K, self_attention=True, mask=mask, **kw)


def _table(seed: int, H: int, n: int) -> np.ndarray:
    """A relative position table (H, n), entries ~ N(0, 1.5^2): biases that move weights."""
    return 1.5 * _rng(seed).standard_normal((H, n))


def _sinks(seed: int, H: int) -> np.ndarray:
    """Sinks (H,) ~ N(0, 2^2): some take most of a row, some little."""
    return 2.0 * np.random.default_rng(seed + 2).standard_normal(H)


# --- all at once ------------------------------------------------------------------------------
@case("combined", square=13)
def _combined(seed, square=None):
    """Every variant but score_mod at once: cap 5, ALiBi (distance, bottom-right), a T5
    table (16 buckets, max_distance 10), sinks, value heads of width 8 (D = 4), GQA (K = 2),
    key padding (13, 0, 9: batch 1 sees no key) and bottom-right causal (Lq = 11 < Lk = 13).
    Self-attention form: Lq = Lk = 13, the positions top-left aligned."""
    align = "bottom_right" if square is None else "top_left"
    p = _problem(seed, K=2, value_head_dim=8, mask=Mask(
        valid_lens=np.array([13, 0, 9]), causal=True, causal_align="bottom_right"),
        input_scale=2.0, square=square)
    return dataclasses.replace(
        p, softcap=5.0, alibi=Alibi(alibi_slopes(VH), "distance", align),
        rel_bias=RelBias(_table(seed, VH, 16), "t5", True, 10, align),
        sinks=_sinks(seed, VH))


# --- soft-capping -----------------------------------------------------------------------------
@case("softcap_valid_lens", square=13)
def _softcap_valid_lens(seed, square=None):
    """Cap 4 on logits up to ~10 (inputs x3), key padding (13, 5, 1): tanh's bend is in play.
    Self-attention form: Lq = Lk = 13, not causal (an encoder's or a bidirectional layer's)."""
    p = _problem(seed, mask=Mask(valid_lens=np.array([13, 5, 1])), input_scale=3.0,
                 square=square)
    return dataclasses.replace(p, softcap=4.0)


@case("softcap_causal_bottom_right_long_query", square=12)
def _softcap_br(seed, square=None):
    """Cap 3, bottom-right causal with Lq = 12 > Lk = 7: the first 5 rows see no key.
    Self-attention form: Lq = Lk = 12, causal, key padding (12, 0, 7): batch 1's rows see no
    key (a zero head output), batch 2's rows past 7 only the first 7."""
    if square is None:
        p = _problem(seed, 12, 7, mask=Mask(causal=True, causal_align="bottom_right"),
                     input_scale=2.0)
    else:
        p = _problem(seed, mask=Mask(valid_lens=np.array([12, 0, 7]), causal=True),
                     input_scale=2.0, square=square)
    return dataclasses.replace(p, softcap=3.0)


@case("softcap_large_logits")
def _softcap_large(seed):
    """Inputs x30 (logits in the thousands) under Gemma 2's cap of 50: most logits saturate
    near +-50, and the row's softmax must not overflow or tie them wrongly."""
    p = make_problem(seed, 2, 16, 16, 32, 2, input_scale=30.0)
    return dataclasses.replace(p, softcap=50.0)


@case("softcap_inf_score", finite=False)
def _softcap_inf(seed):
    """+inf in query row (b=0, i=3) with one-wide heads (D = 1): that row's scores are +-inf,
    which the cap of 20 turns into +-20, so the row is finite (not NaN: tanh saturates;
    a cap computed through exp gives inf / inf). No self-attention form: with one input the
    inf is in that position's key and value too, so every row that reads it is NaN by the
    spec and no capped infinite score is left to judge."""
    p = make_problem(seed, 2, 7, 9, 4, 4)
    query = p.query.copy()
    query[0, 3, 1] = np.inf
    return dataclasses.replace(p, query=query, softcap=20.0)


@case("softcap_self_causal_padding")
def _softcap_self(seed):
    """A whole model's form (one input is query, key and value; causal top-left; key padding
    (11, 6, 2)): cap 4 on logits up to ~10 (inputs x3), as a decoder that soft-caps runs it."""
    p = make_problem(seed, VB, VL, VL, VE, VH, self_attention=True, input_scale=3.0,
                     mask=Mask(valid_lens=np.array([11, 6, 2]), causal=True))
    return dataclasses.replace(p, softcap=4.0)


# --- ALiBi ------------------------------------------------------------------------------------
@case("alibi_key_causal")
def _alibi_key(seed):
    """BLOOM's ALiBi (slope * j, the key position alone), causal, Lq = Lk = 13."""
    p = _problem(seed, VS, VS, mask=Mask(causal=True))
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(VH), "key"))


@case("alibi_distance_bottom_right")
def _alibi_distance_br(seed):
    """FlashAttention's ALiBi (-slope |i + Lk - Lq - j|), bottom-right causal, Lq = 7 <
    Lk = 12: measured from the top-left it is off by 5 keys (and not a row constant)."""
    p = _problem(seed, 7, 12, mask=Mask(causal=True, causal_align="bottom_right"))
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(VH), "distance", "bottom_right"))


@case("alibi_signed_long_query")
def _alibi_signed_long(seed):
    """ALiBi slope * (j - i - Lk + Lq), bottom-right causal with Lq = 12 > Lk = 7: the first
    5 rows see no key."""
    p = _problem(seed, 12, 7, mask=Mask(causal=True, causal_align="bottom_right"))
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(VH), "signed", "bottom_right"))


@case("alibi_distance_six_heads")
def _alibi_six(seed):
    """ALiBi -slope |i - j| over H = 6 heads (BLOOM's slopes for a head count that is not a
    power of two), key padding (13, 5, 1), no causal mask: keys on both sides."""
    p = _problem(seed, E=24, H=6, mask=Mask(valid_lens=np.array([13, 5, 1])))
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(6), "distance"))


@case("alibi_key_self_causal_padding")
def _alibi_key_self(seed):
    """BLOOM's form: one input is query, key and value, causal top-left, key padding
    (11, 6, 2), ALiBi slope * j with the paper's slopes for H = 4 (a model computes its own
    from the head count)."""
    p = make_problem(seed, VB, VL, VL, VE, VH, self_attention=True,
                     mask=Mask(valid_lens=np.array([11, 6, 2]), causal=True))
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(VH), "key"))


# --- sinks ------------------------------------------------------------------------------------
@case("sinks_fully_masked")
def _sinks_fully_masked(seed):
    """Sinks with rows that see no key (batch 1 by key padding; a boolean mask empties
    (b=0, i=3) in every head and (b=2, h=1, i=5)): those rows attend only to the sink, so
    their head output is zero; every other row's weights sum to less than 1."""
    allowed = _rng(seed).random((VB, VH, VL, VS)) < 0.7
    allowed[..., 0] = True
    allowed[0, :, 3] = False
    allowed[2, 1, 5] = False
    p = _problem(seed, mask=Mask(valid_lens=np.array([13, 0, 6]), allowed=allowed))
    return dataclasses.replace(p, sinks=_sinks(seed, VH))


@case("sinks_self_causal_padding")
def _sinks_self(seed):
    """A whole model's form (one input is query, key and value; causal top-left; key
    padding (11, 6, 0): batch 2 sees no key at all) with sinks, as gpt-oss runs them: the
    rows with no key attend only to their sink (a zero head output), the rest sum to less
    than 1."""
    p = make_problem(seed, VB, VL, VL, VE, VH, self_attention=True, input_scale=2.0,
                     mask=Mask(valid_lens=np.array([11, 6, 0]), causal=True))
    return dataclasses.replace(p, sinks=_sinks(seed, VH))


@case("sinks_causal_bottom_right_long_query")
def _sinks_br(seed):
    """Sinks, bottom-right causal with Lq = 12 > Lk = 7: the first 5 rows see no key."""
    p = _problem(seed, 12, 7, mask=Mask(causal=True, causal_align="bottom_right"))
    return dataclasses.replace(p, sinks=_sinks(seed, VH))


@case("sinks_large_logits")
def _sinks_large(seed):
    """Inputs x30 (logits in the thousands), each head's sink at the median of its rows'
    largest logit: half the rows' max is the sink's, so a max that leaves it out overflows."""
    p = make_problem(seed, 2, 16, 16, 32, 2, input_scale=30.0)
    w = p.weights
    q = (p.query @ w.w_q + w.b_q).reshape(2, 16, 2, 16).transpose(0, 2, 1, 3)  # (B, H, L, D)
    k = (p.key @ w.w_k + w.b_k).reshape(2, 16, 2, 16).transpose(0, 2, 1, 3)  # (B, H, S, D)
    row_max = (q @ k.transpose(0, 1, 3, 2)).max(-1) * p.effective_scale  # (B, H, L)
    return dataclasses.replace(p, sinks=np.median(row_max, axis=(0, 2)))


# --- relative position bias -------------------------------------------------------------------
@case("rel_t5_bidirectional")
def _rel_t5_bi(seed):
    """T5's encoder table: bidirectional, 16 buckets, max_distance 24, Lq = Lk = 40 (exact,
    log-spaced and clamped distances on both sides), key padding (40, 17, 3)."""
    p = _problem(seed, 40, 40, mask=Mask(valid_lens=np.array([40, 17, 3])))
    return dataclasses.replace(p, rel_bias=RelBias(_table(seed, VH, 16), "t5", True, 24))


@case("rel_t5_causal_decoder")
def _rel_t5_uni(seed):
    """T5's decoder table: one direction, 16 buckets, max_distance 24, causal, Lq = Lk = 40."""
    p = _problem(seed, 40, 40, mask=Mask(causal=True))
    return dataclasses.replace(p, rel_bias=RelBias(_table(seed, VH, 16), "t5", False, 24))


@case("rel_clip_bottom_right")
def _rel_clip_br(seed):
    """A clipped distance table (max_distance 4: 9 buckets), bottom-right aligned under a
    bottom-right causal mask, Lq = 7 < Lk = 12."""
    p = _problem(seed, 7, 12, mask=Mask(causal=True, causal_align="bottom_right"))
    return dataclasses.replace(p, rel_bias=RelBias(_table(seed, VH, 9), "clip", True, 4,
                                                   "bottom_right"))


# --- score modifiers --------------------------------------------------------------------------
@case("score_mod_distance_wave")
def _mod_wave(seed):
    """The suite's distance_wave modifier (every index in play), causal top-left, Lq = 11 <
    Lk = 13, key padding (13, 6, 2)."""
    p = _problem(seed, mask=Mask(valid_lens=np.array([13, 6, 2]), causal=True))
    return dataclasses.replace(p, score_mod=SCORE_MODS["distance_wave"])


@case("score_mod_tanh_gate")
def _mod_gate(seed):
    """The suite's tanh_gate modifier (multiplicative), a boolean mask."""
    allowed = _rng(seed).random((VB, 1, VL, VS)) < 0.6
    allowed[..., 1] = True
    p = _problem(seed, mask=Mask(allowed=allowed))
    return dataclasses.replace(p, score_mod=SCORE_MODS["tanh_gate"])


def _judge_own_mods(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
    """Each score modifier the plugin declares (``score_mods``) on problem ``p``; the first
    that does not pass decides the outcome."""
    mods = tuple(declared(impl, "score_mods"))
    if not mods:
        return out.classify("unsupported", "declares no score_mods of its own")
    for mod in mods:
        one = run_problem(impl, dataclasses.replace(out, comparisons=[]),
                          dataclasses.replace(p, score_mod=mod))
        if one.outcome != "pass":
            return one.classify(one.outcome, f"score_mod {mod.name}: {one.reason}")
        out.comparisons += one.comparisons
    return out


@case("own_score_mods", judge=_judge_own_mods)
def _own_mods(seed):
    """The plugin's own score modifiers (``score_mods``), each on this problem: key padding
    (13, 5, 1) and bottom-right causal, Lq = 11 < Lk = 13; unsupported when it declares none."""
    return _problem(seed, mask=Mask(valid_lens=np.array([13, 5, 1]), causal=True,
                                    causal_align="bottom_right"))


# --- value heads of their own width -----------------------------------------------------------
@case("value_width_wide_gqa")
def _value_wide(seed):
    """Value heads of width 8 over query/key heads of width 4, GQA (H = 4, K = 2), causal."""
    return _problem(seed, VS, VS, K=2, value_head_dim=8, mask=Mask(causal=True))


@case("value_width_narrow", square=13)
def _value_narrow(seed, square=None):
    """Value heads of width 4 over query/key heads of width 8 (E = 32, H = 4), key padding
    (13, 5, 1). Self-attention form: Lq = Lk = 13 (a latent-attention layer's)."""
    return _problem(seed, E=32, value_head_dim=4, mask=Mask(valid_lens=np.array([13, 5, 1])),
                    square=square)
