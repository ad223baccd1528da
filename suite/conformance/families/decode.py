"""The decode family: attention as a generating model runs it, a few query rows against a
key/value cache (``Mask.query_offset``, feature ``decode``).

Each batch's Lq query rows sit at their own absolute positions ``query_offset[b] ..
query_offset[b] + Lq - 1`` of an S-slot cache whose first ``valid_lens[b]`` slots are filled
(per-batch cache lengths: the rows of a batch are at different steps), and the causal part
is aligned at the offset: query i sees keys j <= query_offset[b] + i. The oracle judges each
case as the attention of those rows over the keys they may see; the slots past a cache's
length hold what a static cache leaves there (here: large finite values), which must not
reach any row. Cases: one row per batch (a decode step), a few rows (speculative or chunked
decoding), a static cache longer than every sequence, the offsets alone (a cache holding
later tokens: only causality at the offset hides them), rows past their cache's length
(only the lengths hide its unfilled slots: in every other case with lengths the rows end at
the cache's last filled slot, where causality hides them too), a sliding window whose boundary
falls inside the cache, GQA and MQA caches, and a chunk of prefill at an offset. With a score
variant (issue 50), as the models that decode with one: Gemma 2's cap (alone and beside a
window), gpt-oss's sinks beside a window, latent attention's narrower values over one
key/value head, ALiBi (``distance``) and T5's decoder table read at each row's absolute
position offset[b] + i, and a score modifier whose i is that position too.

``suite.conformance.cases`` registers ``BUILDERS`` into its ``CASES`` (this module does not import it).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from suite.conformance.families.declare import family
from suite.spec.problem import Mask, Problem, make_problem
from suite.spec.variants import SCORE_MODS, Alibi, RelBias, alibi_slopes

FAMILY = "decode"
# B, E, H as the masking family (D = 4); S cache slots.
DB, DE, DH, DS = 3, 16, 4, 16
BUILDERS, case = family(FAMILY)  # (name, seed -> problem, Case keywords), in order
# What a static cache's unfilled slots hold here: finite and large, so a row that reads one
# is far off (NaN there is the special-values family's concern).
GARBAGE = 1e3




def decode_problem(seed: int, L: int, lengths: Optional[Sequence[int]],
                   offsets: Optional[Sequence[int]] = None, S: int = DS,
                   K: Optional[int] = None, window: Optional[int] = None,
                   E: int = DE, input_scale: float = 1.0,
                   value_head_dim: Optional[int] = None, B: int = DB, H: int = DH) -> Problem:
    """Lq = L rows per batch at ``offsets`` (default: the last L filled slots,
    ``lengths[b] - L``) of an S-slot cache filled to ``lengths`` (None: no lengths, every
    slot holds a token); slots past a length hold ``GARBAGE``-sized values. ``window``:
    query i also sees only keys j > its position - window (a sliding window). ``E``: the
    model width (H heads of E // H); B batch items (one offset and length each);
    ``input_scale``, ``value_head_dim``: ``make_problem``'s."""
    if offsets is None:
        offsets = [n - L for n in lengths]
    off = np.asarray(offsets, dtype=np.int64)
    allowed = None
    if window is not None:
        pos = off[:, None] + np.arange(L)[None, :]  # (B, L)
        allowed = (np.arange(S)[None, None, :] > pos[:, :, None] - window)[:, None]
    lens = None if lengths is None else np.asarray(lengths, dtype=np.int64)
    p = make_problem(seed, B, L, S, E, H, K, mask=Mask(
        valid_lens=lens, causal=True, allowed=allowed, query_offset=off),
        input_scale=input_scale, value_head_dim=value_head_dim)
    if lens is None:
        return p
    rng = np.random.default_rng(seed + 1)
    key, value = p.key.copy(), p.value.copy()
    for b, n in enumerate(lens):
        key[b, n:] = GARBAGE * rng.standard_normal(key[b, n:].shape)
        value[b, n:] = GARBAGE * rng.standard_normal(value[b, n:].shape)
    return dataclasses.replace(p, key=key, value=value)


@case("one_row")
def _one_row(seed):
    """A decode step: one row per batch at its cache's last filled slot (lengths 16, 7, 1)."""
    return decode_problem(seed, 1, [16, 7, 1])


@case("wide_heads")
def _wide_heads(seed):
    """A decode step with heads 16 wide (E = 64; lengths 16, 7, 1): GPU decoding kernels
    take widths of 16 and up (FlexAttention's CUDA kernels refuse narrower heads), so this
    is the case they run; a kernel right at one width can be wrong at another."""
    return decode_problem(seed, 1, [16, 7, 1], E=64)


@case("few_rows")
def _few_rows(seed):
    """Three rows per batch (speculative or chunked decoding) at the end of caches filled
    to 16, 9 and 3: row i sees one key more than row i - 1."""
    return decode_problem(seed, 3, [16, 9, 3])


@case("static_cache")
def _static_cache(seed):
    """A static cache of 24 slots longer than every sequence (lengths 10, 4, 17): the slots
    past each length hold large values that must not reach any row."""
    return decode_problem(seed, 1, [10, 4, 17], S=24)


@case("offsets_alone")
def _offsets_alone(seed):
    """No lengths: every slot holds a token and only causality at each batch's offset (15,
    9, 2) hides the later ones; a kernel that aligns at the cache's end, at 0, or one slot
    late reads keys it must not."""
    return decode_problem(seed, 1, None, offsets=[15, 9, 2])


@case("window_in_cache")
def _window_in_cache(seed):
    """Two rows per batch with a sliding window of 6 keys whose boundary falls inside each
    cache (lengths 16, 11, 5): the oldest filled slots are out of the window."""
    return decode_problem(seed, 2, [16, 11, 5], window=6)


@case("gqa")
def _gqa(seed):
    """Two key/value heads for four query heads in the cache (lengths 16, 8, 2)."""
    return decode_problem(seed, 1, [16, 8, 2], K=2)


@case("mqa")
def _mqa(seed):
    """One key/value head for four query heads, two rows (lengths 12, 16, 3)."""
    return decode_problem(seed, 2, [12, 16, 3], K=1)


@case("rows_past_length")
def _rows_past_length(seed):
    """One row per batch at positions 12, 9 and 5, against caches filled only to 8, 4 and 5
    slots (cascade or prefix-cache inference: the row attends a cached prefix that ends
    before it; its own key comes in another pass): causality at the offset hides nothing of
    the garbage between a cache's length and the row, only the lengths do. A kernel that
    derives the filled slots from the offset (``offset + 1``) reads it."""
    return decode_problem(seed, 1, [8, 4, 5], offsets=[12, 9, 5])


@case("prefill_chunk")
def _prefill_chunk(seed):
    """A chunk of five rows of prefill at offsets 0, 4 and 11 (lengths 5, 9, 16): the first
    chunk is ordinary causal attention, the others continue a cache."""
    return decode_problem(seed, 5, [5, 9, 16])


# --- score variants at decode steps (issue 50): each as the models that decode with it --------
@case("softcap_one_row")
def _softcap_one_row(seed):
    """Gemma 2's decode step: soft-capping (cap 4 on logits up to ~10, inputs x3) on one row
    per batch against caches filled to 16, 7 and 1: a decode kernel that drops the cap its
    prefill keeps is far off."""
    p = decode_problem(seed, 1, [16, 7, 1], input_scale=3.0)
    return dataclasses.replace(p, softcap=4.0)


@case("softcap_window")
def _softcap_window(seed):
    """Gemma 2's local layers at decode: the cap (4, inputs x3) beside a sliding window of 6
    keys whose boundary falls inside each cache, two rows per batch (lengths 16, 11, 5)."""
    p = decode_problem(seed, 2, [16, 11, 5], window=6, input_scale=3.0)
    return dataclasses.replace(p, softcap=4.0)


@case("sinks_window")
def _sinks_window(seed):
    """gpt-oss's decode step: sinks (one logit per head in the denominator) beside a sliding
    window of 6 keys inside caches filled to 16, 11 and 5, two rows per batch, GQA (two
    key/value heads): a decode path without the sink sums its weights to 1."""
    p = decode_problem(seed, 2, [16, 11, 5], K=2, window=6, input_scale=2.0)
    return dataclasses.replace(p, sinks=2.0 * np.random.default_rng(seed + 2).standard_normal(DH))


@case("value_width_mqa")
def _value_width_mqa(seed):
    """Latent attention's decode step (DeepSeek's MLA: one shared key/value head, values
    narrower than the keys): value heads of width 4 over query/key heads of width 8 (E = 32),
    one key/value head, two rows per batch against caches filled to 16, 9 and 3."""
    return decode_problem(seed, 2, [16, 9, 3], K=1, E=32, value_head_dim=4)


@case("alibi_few_rows")
def _alibi_few_rows(seed):
    """ALiBi at decode (BLOOM's and MPT's generation; FlashAttention's ``alibi_slopes`` with a
    cache): -slope |pos - j|, three rows per batch at the end of caches filled to 16, 9 and 3,
    each row at its absolute position offset[b] + i. Measured from row 0 (the offset
    forgotten) the distances are off by the offset, and not by a row constant."""
    p = decode_problem(seed, 3, [16, 9, 3])
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(DH), "distance"))


@case("rel_t5_one_row")
def _rel_t5_one_row(seed):
    """T5's decoder at a generation step: its one-directional relative table (16 buckets,
    max_distance 12) read at the distance j - pos of one row per batch, at its offset (lengths
    16, 7, 1, no lengths past them): exact, log-spaced and clamped distances in one row."""
    p = decode_problem(seed, 1, [16, 7, 1])
    table = 1.5 * np.random.default_rng(seed + 2).standard_normal((DH, 16))
    return dataclasses.replace(p, rel_bias=RelBias(table, "t5", False, 12))


@case("score_mod_at_offset")
def _score_mod_at_offset(seed):
    """A score modifier at decode (FlexAttention's decoding with a score_mod): the suite's
    position_wave, which reads positions as they are, on two rows per batch at the end of
    caches filled to 16, 9 and 4 (offsets 14, 7 and 2, inputs x2): its i is each row's
    absolute position offset[b] + row and its j the key's cache slot. A decode path that
    hands it the row's index within the query tensor (the offset forgotten, or one batch's
    offset for all) moves every row's modifier."""
    p = decode_problem(seed, 2, [16, 9, 4], input_scale=2.0)
    return dataclasses.replace(p, score_mod=SCORE_MODS["position_wave"])
