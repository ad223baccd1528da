"""The masking family: each mask kind alone and combined, padding filled with NaN or garbage,
fully masked rows, causal in both alignments."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from suite.conformance.families.declare import family
from suite.conformance.families.declare import rng as seeded_rng
from suite.spec.problem import Mask, Problem, make_problem

FAMILY = "masking"
BUILDERS, case = family(FAMILY)

# --- masking -------------------------------------------------------------------------------
# Lq = 11 queries over Lk = 13 keys; the self-attention form (``kv_source="self"``) of a case
# whose problem is not square is the same mask and padding over Lq = Lk = 13 (SQUARE).
B, L, E, H = 3, 11, 16, 4
SQUARE = 13


def _problem_or_square(seed: int, square: Optional[int], Lq: int = L, Lk: int = 13, **kw) -> Problem:
    """The problem (B, Lq, Lk), or its self-attention form (B, square, square)."""
    if square is not None:
        return make_problem(seed, B, square, square, E, H, self_attention=True, **kw)
    return make_problem(seed, B, Lq, Lk, E, H, **kw)


def _query_len(square: Optional[int]) -> int:
    return L if square is None else square


@case("none", square=SQUARE)
def _none(seed, square=None):
    """No mask at all."""
    return _problem_or_square(seed, square)


@case("valid_lens", square=SQUARE)
def _valid_lens(seed, square=None):
    """Key padding: batch b sees keys j < valid_lens[b]."""
    return _problem_or_square(seed, square, mask=Mask(valid_lens=np.array([13, 5, 1])))


@case("valid_lens_per_query", square=SQUARE)
def _valid_lens_2d(seed, square=None):
    """valid_lens of shape (B, Lq): a length per query row."""
    vl = seeded_rng(seed).integers(1, 14, size=(B, _query_len(square)))
    return _problem_or_square(seed, square, mask=Mask(valid_lens=vl))


@case("causal")
def _causal(seed):
    """Causal self-shaped attention, Lq == Lk."""
    return make_problem(seed, B, L, L, E, H, mask=Mask(causal=True))


@case("causal_top_left_short_query")
def _causal_tl_short(seed):
    """Causal, Lq < Lk, top-left aligned: query i sees keys j <= i."""
    return make_problem(seed, B, 7, 12, E, H, mask=Mask(causal=True))


@case("causal_top_left_long_query")
def _causal_tl_long(seed):
    """Causal, Lq > Lk, top-left aligned."""
    return make_problem(seed, B, 12, 7, E, H, mask=Mask(causal=True))


@case("causal_bottom_right_short_query")
def _causal_br_short(seed):
    """Causal, Lq < Lk, bottom-right aligned: query i sees keys j <= i + Lk - Lq."""
    return make_problem(seed, B, 7, 12, E, H, mask=Mask(causal=True, causal_align="bottom_right"))


@case("causal_bottom_right_long_query")
def _causal_br_long(seed):
    """Causal, Lq > Lk, bottom-right aligned: the first Lq - Lk rows see no key."""
    return make_problem(seed, B, 12, 7, E, H, mask=Mask(causal=True, causal_align="bottom_right"))


@case("bool_mask", square=SQUARE)
def _bool_mask(seed, square=None):
    """A boolean (B, H, Lq, Lk) mask, True = may attend (every row keeps one key)."""
    allowed = seeded_rng(seed).random((B, H, _query_len(square), 13)) < 0.6
    allowed[..., 0] = True
    return _problem_or_square(seed, square, mask=Mask(allowed=allowed))


@case("bool_mask_broadcast", square=SQUARE)
def _bool_mask_bcast(seed, square=None):
    """A boolean (Lq, Lk) mask broadcast over batch and heads."""
    allowed = seeded_rng(seed).random((_query_len(square), 13)) < 0.5
    allowed[:, 3] = True
    return _problem_or_square(seed, square, mask=Mask(allowed=allowed))


@case("bias", square=SQUARE)
def _bias(seed, square=None):
    """An additive float (B, H, Lq, Lk) bias."""
    bias = 2.0 * seeded_rng(seed).standard_normal((B, H, _query_len(square), 13))
    return _problem_or_square(seed, square, mask=Mask(bias=bias))


@case("bias_broadcast", square=SQUARE)
def _bias_bcast(seed, square=None):
    """An additive (1, H, 1, Lk) bias, ALiBi-like, broadcast over batch and queries."""
    bias = -0.5 * np.arange(13)[None, None, None, :] * np.arange(1, H + 1)[None, :, None, None]
    return _problem_or_square(seed, square, mask=Mask(bias=bias))


@case("bias_as_mask", square=SQUARE)
def _bias_as_mask(seed, square=None):
    """A 0/-inf additive bias: must agree with the equivalent boolean mask."""
    allowed = seeded_rng(seed).random((B, 1, _query_len(square), 13)) < 0.6
    allowed[..., 2] = True
    return _problem_or_square(seed, square, mask=Mask(bias=np.where(allowed, 0.0, -np.inf)))


@case("combined")
def _combined(seed):
    """valid_lens AND causal AND a boolean mask, plus a bias."""
    rng = seeded_rng(seed)
    allowed = rng.random((B, 1, L, L)) < 0.7
    allowed[..., 0] = True
    return make_problem(seed, B, L, L, E, H, mask=Mask(
        valid_lens=np.array([L, 6, 2]), causal=True, allowed=allowed,
        bias=rng.standard_normal((1, H, L, L))))


def _padded(seed: int, fill: float, Lq: int = L, Lk: int = 13, lens: tuple = (13, 5, 9),
            square: Optional[int] = None) -> Problem:
    """Key padding by ``lens`` (B,) with ``fill`` in the padded keys and values; in the
    self-attention form (``square``) the one input's padded positions hold it, so the padded
    query rows do too: the spec is what they read (a NaN query row is NaN, a garbage one
    attends the unpadded keys), and no other row may change."""
    p = _problem_or_square(seed, square, Lq, Lk, mask=Mask(valid_lens=np.array(lens)))
    key, value = p.key.copy(), p.value.copy()
    for b, n in enumerate(p.mask.valid_lens):
        key[b, n:] = fill
        value[b, n:] = fill
    if square is not None:  # query = key = value: one array
        return dataclasses.replace(p, query=key, key=key, value=key)
    return dataclasses.replace(p, key=key, value=value)


@case("nan_padding", finite=False, square=SQUARE)
def _nan_padding(seed, square=None):
    """Padded keys and values hold NaN: the unpadded output must not change."""
    return _padded(seed, np.nan, square=square)


@case("garbage_padding", square=SQUARE)
def _garbage_padding(seed, square=None):
    """Padded keys and values hold 1e4 garbage: the unpadded output must not change."""
    return _padded(seed, 1e4, square=square)


@case("nan_padding_one_query")
def _nan_padding_one_query(seed):
    """One query (decoding) over 300 keys, padded keys and values hold NaN: lengths 37, 152
    and 300 (a split-K decode kernel's splits: 37 ends inside one, 152 on a boundary for
    splits of 19 or 38 keys, as pallas.gpu.decode's 16 splits of 300 keys padded to 304)."""
    return _padded(seed, np.nan, Lq=1, Lk=300, lens=(37, 152, 300))


@case("fully_masked_valid_lens", square=SQUARE)
def _fully_masked_vl(seed, square=None):
    """valid_lens 0 for one batch item: its rows attend to nothing, so output = b_o."""
    return _problem_or_square(seed, square, mask=Mask(valid_lens=np.array([13, 0, 4])))


@case("fully_masked_bool_row", square=SQUARE)
def _fully_masked_bool(seed, square=None):
    """A boolean mask with all-False query rows: those rows give a zero head output."""
    allowed = seeded_rng(seed).random((B, H, _query_len(square), 13)) < 0.6
    allowed[..., 0] = True
    allowed[1, :, 3] = False
    allowed[0, 2, 5] = False
    return _problem_or_square(seed, square, mask=Mask(allowed=allowed))


