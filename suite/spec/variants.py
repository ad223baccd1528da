"""Score variants: what the attention computes besides the textbook formula, as data.

A ``Problem`` carries each one in a field of its own (None: absent), and each needs a
feature of the implementation (``Problem.features``), as an explicit scale does:

- ``softcap`` (feature "softcap"): one cap c per problem, score -> c * tanh(score / c)
  (Gemma 2, FlashAttention's ``softcap``);
- ``alibi`` (``Alibi``, "alibi"): a per-head slope times a position term, in one of
  ``ALIBI_CONVENTIONS``, with the query rows aligned top-left or bottom-right;
- ``sinks`` ((H,) logits, "sinks"): one logit per head that joins the softmax's
  denominator and takes no value (gpt-oss's learned sinks);
- ``rel_bias`` (``RelBias``, "rel_bias"): a per-head table read at the bucket of the
  query-key distance, T5's bucketing or a clipped distance;
- ``score_mod`` (``ScoreMod``, "score_mod"): any elementwise function of
  (score, b, h, i, j) a plugin declares for a variant of its own;
- ``value_head_dim`` ("value_width", a field of ``Problem``): value heads of width D_v != D.

The order the spec applies them in (``suite.spec.oracle``): scale q.k, cap, add ALiBi and the
relative table, apply the score_mod, then the mask (its additive bias, then its boolean
parts), then the softmax, whose denominator holds the sink. A row with no key to attend
gives a zero head output with or without a sink: with one, it attends only to the sink,
which takes no value.

Positions: query row i sits at key position i (``top_left``) or i + S - L
(``bottom_right``, as a bottom-right causal mask places it). In the inference forms a
token's position is its absolute position (``token_positions``): a decode row of batch b at
``query_offset[b] + i`` (the keys at their cache slots j), a packed token at its index within
its own sequence (positions restart at each sequence, for queries and keys alike); ALiBi and
the relative table read the distance (key position minus query position) there
(``Alibi.term``, ``RelBias.buckets_at``). A score_mod's i and j are those positions too
(``suite.spec.oracle.score_mod_at``): a decode row's at its offset, a packed token's within
its own sequence (a sequence's rows are those of the sequence alone), a generation step's in
the whole sequence. Nothing here imports a framework; every function is float64 NumPy, the
spec.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

ALIGNS = ("top_left", "bottom_right")
# The position term an ALiBi slope multiplies, for query i (at position q = i or
# i + S - L) and key j. Under softmax a term that is the same along a row cancels, so
# "key" equals "signed" (the two differ by slope * q), and alignment changes only
# "distance"; "key" and "signed" still differ in the logits a library may return.
ALIBI_CONVENTIONS: Dict[str, str] = {
    "key": "slope * j: from the key position only (BLOOM)",
    "distance": "-slope * |q - j|: the symmetric distance (FlashAttention's alibi_slopes)",
    "signed": "slope * (j - q): minus the causal distance (the ALiBi paper, MPT)",
}
# How a relative position bias turns the distance j - q into a table column.
BUCKETINGS: Dict[str, str] = {
    "t5": "T5's _relative_position_bucket(j - q, bidirectional, num_buckets=n_buckets, "
          "max_distance): exact small distances, log-spaced ones up to max_distance, one "
          "bucket beyond (a sign bit first when bidirectional)",
    "clip": "j - q clipped to [-max_distance, max_distance] ([-max_distance, 0] when not "
            "bidirectional), plus max_distance (Shaw et al.; n_buckets = 2 max_distance + 1, "
            "or max_distance + 1)",
}


def query_offset(align: str, L: int, S: int) -> int:
    """The key position of query row 0: 0 (top_left) or S - L (bottom_right)."""
    if align not in ALIGNS:
        raise ValueError(f"align: expected one of {ALIGNS}, got {align!r}")
    return 0 if align == "top_left" else S - L


def relative_positions(align: str, L: int, S: int) -> np.ndarray:
    """(L, S) ints j - q: key position minus the query row's position."""
    q = np.arange(L)[:, None] + query_offset(align, L, S)
    return np.arange(S)[None, :] - q


def segment_positions(segments: np.ndarray) -> np.ndarray:
    """(B, L) ints: each packed token's index within its own sequence (0 at each start)."""
    seg = np.asarray(segments)
    idx = np.arange(seg.shape[1])
    starts = np.concatenate([np.ones((seg.shape[0], 1), bool), np.diff(seg, axis=1) != 0], 1)
    return idx - np.maximum.accumulate(np.where(starts, idx, 0), axis=1)


def token_positions(align: str, L: int, S: int, offsets: Optional[np.ndarray] = None,
                    segments: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The absolute positions the position variants read: (queries (B|1, L), keys (B|1, S))
    ints. ``offsets`` (B,) (the decode form, ``Mask.query_offset``): batch b's row i at
    offsets[b] + i, key j at its slot j. ``segments`` (B, L) (packed, L = S): every token at
    its index within its own sequence. Neither: row i at i + ``query_offset(align, L, S)``,
    key j at j."""
    if segments is not None:
        pos = segment_positions(segments)
        return pos, pos
    keys = np.arange(S)[None, :]
    if offsets is not None:
        return np.asarray(offsets)[:, None] + np.arange(L)[None, :], keys
    return (np.arange(L) + query_offset(align, L, S))[None, :], keys


@dataclasses.dataclass(frozen=True)
class Alibi:
    """ALiBi: head h adds ``slopes[h]`` times the position term of ``convention``."""

    slopes: np.ndarray  # (H,)
    convention: str = "distance"
    align: str = "top_left"

    def positions(self, L: int, S: int) -> np.ndarray:
        """(L, S) float64: the term each slope multiplies (ALIBI_CONVENTIONS)."""
        return self.term(*token_positions(self.align, L, S))[0]

    def term(self, queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """(B|1, L, S) float64: the term at query positions (B|1, L) and key positions
        (B|1, S) (``token_positions``)."""
        q, k = np.asarray(queries)[:, :, None], np.asarray(keys)[:, None, :]
        rel = k - q  # (B|1, L, S) key position minus query position
        if self.convention == "key":
            return np.broadcast_to(k, rel.shape).astype(np.float64)
        if self.convention == "distance":
            return -np.abs(rel).astype(np.float64)
        if self.convention == "signed":
            return rel.astype(np.float64)
        raise ValueError(f"alibi.convention: expected one of {sorted(ALIBI_CONVENTIONS)}, "
                         f"got {self.convention!r}")


def alibi_slopes(H: int) -> np.ndarray:
    """The ALiBi paper's slopes (H,): 2^(-8h/H), h = 1..H, for H a power of two; otherwise
    those of the power of two below H, then every other one of twice that (BLOOM's code)."""
    def powers(n: int) -> np.ndarray:
        return 2.0 ** (-8.0 * np.arange(1, n + 1) / n)

    low = 2 ** int(math.floor(math.log2(H)))
    if low == H:
        return powers(H)
    return np.concatenate([powers(low), powers(2 * low)[0::2][:H - low]])


@dataclasses.dataclass(frozen=True)
class RelBias:
    """A relative position bias: head h adds ``table[h, bucket(j - q)]``."""

    table: np.ndarray  # (H, n_buckets)
    bucketing: str = "t5"
    bidirectional: bool = True
    max_distance: int = 128
    align: str = "top_left"

    def buckets(self, L: int, S: int) -> np.ndarray:
        """(L, S) ints: the table column each (query, key) pair reads (BUCKETINGS)."""
        return self.buckets_at(*token_positions(self.align, L, S))[0]

    def buckets_at(self, queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """(B|1, L, S) ints at query positions (B|1, L) and key positions (B|1, S)."""
        rel = np.asarray(keys)[:, None, :] - np.asarray(queries)[:, :, None]  # j - q
        n = self.table.shape[-1]
        if self.bucketing == "t5":
            return t5_bucket(rel, self.bidirectional, n, self.max_distance)
        if self.bucketing == "clip":
            low = -self.max_distance
            high = self.max_distance if self.bidirectional else 0
            return np.clip(rel, low, high) + self.max_distance
        raise ValueError(f"rel_bias.bucketing: expected one of {sorted(BUCKETINGS)}, "
                         f"got {self.bucketing!r}")


def t5_bucket(rel: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int
              ) -> np.ndarray:
    """T5's ``_relative_position_bucket`` of distances ``rel`` = j - q (ints), step for step.
    T5 takes the log in float32; this one in float64 gives the same buckets on every
    setting the suite's cases use (tests/test_variants.py compares them)."""
    rel = np.asarray(rel, dtype=np.int64)
    bucket = np.zeros_like(rel)
    if bidirectional:  # the upper half of the buckets is for keys after the query
        num_buckets //= 2
        bucket += (rel > 0) * num_buckets
        n = np.abs(rel)
    else:  # keys after the query share bucket 0
        n = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    # log-spaced buckets from max_exact to max_distance, truncated as T5's .to(long)
    log_part = np.log(np.maximum(n, 1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_part * (num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return bucket + np.where(n < max_exact, n, large)


# fn(score, b, h, i, j, xp) -> the new score, elementwise: score (B, H, L, S) in the dtype
# computed in; b (B, 1, 1, 1), h (1, H, 1, 1), i (1, 1, L, 1), j (1, 1, 1, S) the batch,
# head, query row and key indices as floats of the score's dtype (broadcast, not
# materialised); i and j are absolute positions (``suite.spec.oracle.score_mod_at``): at a
# decode offset i (B, 1, L, 1) is query_offset[b] + row and j the key's cache slot, in a
# packed batch i (B, 1, L, 1) and j (B, 1, 1, S) are each token's position within its own
# sequence; xp the array namespace the score comes from (numpy, torch, ...).
ScoreFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class ScoreMod:
    """A named score modifier: ``fn(score, b, h, i, j, xp)`` (``ScoreFn``), elementwise.

    The oracle calls it in float64 with ``xp = numpy``, the same-dtype baselines in the
    dtype (float32 arrays); a plugin calls it with its own array namespace (torch tensors
    and ``xp = torch`` for torch.eager) or, for a variant of its own, recognises ``name``
    and runs its kernel. It acts on the score after the cap and the position biases and
    before the mask; it must not mask (a -inf it returns is IEEE arithmetic, not a mask).
    """

    name: str
    fn: ScoreFn = dataclasses.field(compare=False)
    doc: str = ""


def score_mod_indices(shape: tuple, dtype: Any) -> tuple:
    """(b, h, i, j) index arrays for a (B, H, L, S) score, as floats of ``dtype``."""
    B, H, L, S = shape
    return (np.arange(B, dtype=dtype).reshape(B, 1, 1, 1), np.arange(H, dtype=dtype).reshape(1, H, 1, 1),
            np.arange(L, dtype=dtype).reshape(1, 1, L, 1), np.arange(S, dtype=dtype).reshape(1, 1, 1, S))


def apply_score_mod(mod: ScoreMod, score: np.ndarray) -> np.ndarray:
    """``mod`` on a NumPy (B, H, L, S) score, in the score's dtype."""
    b, h, i, j = score_mod_indices(score.shape, score.dtype)
    return np.asarray(mod.fn(score, b, h, i, j, np), dtype=score.dtype)


def _distance_wave(score, b, h, i, j, xp):
    return score + 0.5 * (h + 1.0) * xp.cos((i - j) / 3.0) - 0.25 * b


def _tanh_gate(score, b, h, i, j, xp):
    return score * (1.0 + 0.5 * xp.tanh((j - i) / 4.0)) + 0.1 * h


def _position_wave(score, b, h, i, j, xp):
    return score + 0.5 * xp.cos(j / 2.0) + 0.05 * i * xp.sin(j / 3.0)


# Example modifiers the suite's cases use (and ``mha-suite repro`` finds by name); a plugin
# declares its own in ``score_mods`` (suite.plugins.interface.Implementation).
SCORE_MODS: Dict[str, ScoreMod] = {m.name: m for m in (
    ScoreMod("distance_wave", _distance_wave,
             "score + 0.5 (h + 1) cos((i - j) / 3) - 0.25 b: every index in play"),
    ScoreMod("tanh_gate", _tanh_gate,
             "score (1 + 0.5 tanh((j - i) / 4)) + 0.1 h: a multiplicative, non-additive "
             "modifier"),
    ScoreMod("position_wave", _position_wave,
             "score + 0.5 cos(j / 2) + 0.05 i sin(j / 3): positions read as they are, not as a "
             "distance (a packed sequence's must restart at 0)"),
)}


def named_score_mod(name: str) -> Optional[ScoreMod]:
    """The suite's example modifier called ``name``, or None."""
    return SCORE_MODS.get(name)
