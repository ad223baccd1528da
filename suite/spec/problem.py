"""The canonical MHA problem: shapes, weights, masks, and input validation.

Letters used everywhere in the suite (einsum strings, shape comments):
  B batch, L query length (Lq), S key length (Lk), E model width,
  H query heads, K kv heads (H_kv, GQA/MQA when K < H), D head width = E // H,
  V value head width (D_v: D unless the problem sets ``value_head_dim``).

Weights use the right-multiply layout: ``Q = query @ W_q + b_q`` with
``W_q (E, H*D)``, ``W_k (E, K*D)``, ``W_v (E, K*V)``, ``W_o (H*V, E)``; head i owns
columns ``[i*D, (i+1)*D)``, i.e. the reshape ``(B, L, H, D)`` (values: ``(B, S, K, V)``).
Query head h reads kv head ``h // (H // K)``.

Score variants (soft-capping, ALiBi, sinks, a relative position table, a score modifier)
are optional fields, each declared by a feature: ``suite.spec.variants``.

Nothing here imports a framework: every array is a float64 NumPy array.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Tuple

import numpy as np

from suite.spec.paging import Paging, blocks_used, lengths_of
from suite.spec.variants import (
    ALIBI_CONVENTIONS,
    ALIGNS,
    BUCKETINGS,
    Alibi,
    RelBias,
    ScoreMod,
    score_mod_indices,
    token_positions,
)

DTYPES = ("float64", "float32", "float16", "bfloat16")


class InputError(ValueError):
    """A user-facing problem with the inputs: the message names the argument."""


def _expect(cond: bool, argument: str, expected: str, got: object) -> None:
    if not cond:
        raise InputError(f"{argument}: expected {expected}, got {got}")


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(
        x, (bool, np.bool_))


@dataclasses.dataclass(frozen=True)
class Weights:
    """Projection weights in the right-multiply layout (float64)."""

    w_q: np.ndarray  # (E, H*D)
    w_k: np.ndarray  # (E, K*D)
    w_v: np.ndarray  # (E, K*V)
    w_o: np.ndarray  # (H*V, E)
    b_q: Optional[np.ndarray] = None  # (H*D,)
    b_k: Optional[np.ndarray] = None  # (K*D,)
    b_v: Optional[np.ndarray] = None  # (K*V,)
    b_o: Optional[np.ndarray] = None  # (E,)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class Mask:
    """The canonical mask; every part present is combined with AND.

    valid_lens: (B,) or (B, L) ints in [0, S]: key j is visible iff j < valid_lens.
    causal: query i sees keys j <= i ("top_left", torch/jax ``is_causal``) or
        j <= i + (S - L) ("bottom_right").
    allowed: bool array broadcastable to (B, H, L, S), True = may attend.
    bias: float array broadcastable to (B, H, L, S), added to the logits.
    query_offset: (B,) ints, the decode form: batch b's query rows sit at absolute positions
        query_offset[b] .. query_offset[b] + L - 1 of its key/value cache (S slots, the first
        ``valid_lens[b]`` filled), and the causal part lets query i see keys
        j <= query_offset[b] + i (``causal_align`` stays "top_left": the offset aligns it).
    """

    valid_lens: Optional[np.ndarray] = None
    causal: bool = False
    causal_align: str = "top_left"
    allowed: Optional[np.ndarray] = None
    bias: Optional[np.ndarray] = None
    query_offset: Optional[np.ndarray] = None
    segments: Optional[np.ndarray] = None

    @property
    def kinds(self) -> frozenset:
        """Feature names this mask needs from an implementation."""
        out = set()
        if self.valid_lens is not None:
            out.add("valid_lens")
        if self.causal:
            out.add("causal" if self.causal_align == "top_left" else "causal_bottom_right")
        if self.allowed is not None:
            out.add("bool_mask")
        if self.bias is not None:
            out.add("bias")
        if self.query_offset is not None:
            out.add("decode")
        if self.segments is not None:
            out.add("packed")
        return frozenset(out)

    def is_empty(self) -> bool:
        return not self.kinds

    def dense_allowed(self, B: int, H: int, L: int, S: int) -> np.ndarray:
        """Boolean (B, H, L, S) of every boolean part (not the bias), True = attend."""
        allowed = np.ones((B, H, L, S), dtype=bool)
        if self.valid_lens is not None:
            vl = np.asarray(self.valid_lens)
            vl = vl[:, None] if vl.ndim == 1 else vl  # (B, L) or (B, 1)
            allowed &= (np.arange(S)[None, None, :] < vl[:, :, None])[:, None]  # (B, 1, L, S)
        if self.causal and self.query_offset is not None:  # each batch at its own offset
            pos = np.asarray(self.query_offset)[:, None] + np.arange(L)[None, :]  # (B, L)
            allowed &= (np.arange(S)[None, None, :] <= pos[:, :, None])[:, None]  # (B,1,L,S)
        elif self.causal:
            offset = 0 if self.causal_align == "top_left" else S - L
            allowed &= np.arange(S)[None, :] <= np.arange(L)[:, None] + offset  # (L, S)
        if self.segments is not None:  # packed: a token sees its own sequence only
            seg = np.asarray(self.segments)
            allowed &= (seg[:, :, None] == seg[:, None, :])[:, None]  # (B, 1, L, L)
        if self.allowed is not None:
            allowed &= np.asarray(self.allowed, dtype=bool)
        return allowed

    def dense_bias(self, B: int, H: int, L: int, S: int) -> np.ndarray:
        """Additive float64 (B, H, L, S): the bias plus -inf where not allowed."""
        bias = np.zeros((B, H, L, S))
        if self.bias is not None:
            bias = bias + self.bias
        return np.where(self.dense_allowed(B, H, L, S), bias, -np.inf)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One MHA call: inputs, weights, mask, heads, scale and score variants (all float64)."""

    query: np.ndarray  # (B, L, E)
    key: np.ndarray  # (B, S, E)
    value: np.ndarray  # (B, S, E)
    weights: Weights
    num_heads: int
    num_kv_heads: Optional[int] = None
    mask: Mask = dataclasses.field(default_factory=Mask)
    scale: Optional[float] = None  # None: 1/sqrt(D)
    grad_output: Optional[np.ndarray] = None  # (B, L, E) dL/d(out) for gradients; None: fixed
    # Score variants (suite.spec.variants), in the order the spec applies them; None: absent.
    softcap: Optional[float] = None  # score -> softcap * tanh(score / softcap)
    alibi: Optional[Alibi] = None  # per-head slopes times a position term
    rel_bias: Optional[RelBias] = None  # per-head table at the bucketed distance
    score_mod: Optional[ScoreMod] = None  # fn(score, b, h, i, j, xp), elementwise
    sinks: Optional[np.ndarray] = None  # (H,) logits in the softmax's denominator, no value
    value_head_dim: Optional[int] = None  # V, the value heads' width; None: D
    # How a generating module computes the rows (the generation family): the query rows in
    # these chunks, in order (a prefill, then decode steps), each against the keys and values
    # its own cache holds from the chunks before; None: one call. The answer is the same
    # attention, so the oracle judges every chunk's rows as it judges one call's.
    steps: Optional[Tuple[int, ...]] = None
    cache_len: Optional[int] = None  # a static cache of this many slots (>= L)
    # The key/value cache paged into a pool of blocks read through a block table
    # (``suite.spec.paging``): the same logical problem, which the oracle judges; a plugin that
    # declares feature ``paged`` reads the pool ``suite.spec.paging.paged_cache`` builds.
    paging: Optional[Paging] = None
    # Training mode (the dropout family, suite.conformance.families.dropout): each attention weight dropped
    # with this probability and the kept ones scaled by 1 / (1 - p), drawn by the library;
    # the oracle gives the expectation (the eval-mode answer). None: eval mode.
    dropout: Optional[float] = None

    # Shape facts, derived from the arrays.
    @property
    def B(self) -> int:
        return self.query.shape[0]

    @property
    def L(self) -> int:
        return self.query.shape[1]

    @property
    def S(self) -> int:
        return self.key.shape[1]

    @property
    def E(self) -> int:
        return self.query.shape[2]

    @property
    def H(self) -> int:
        return self.num_heads

    @property
    def K(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def D(self) -> int:
        return self.E // self.H

    @property
    def V(self) -> int:
        """The value heads' width (D unless ``value_head_dim`` sets another)."""
        return self.D if self.value_head_dim is None else self.value_head_dim

    @property
    def effective_scale(self) -> float:
        return 1.0 / math.sqrt(self.D) if self.scale is None else float(self.scale)

    def features(self) -> frozenset:
        """Feature names an implementation must declare to run this problem."""
        out = set(self.mask.kinds)
        if self.K != self.H:
            out.add("gqa")
        if self.L != self.S:
            out.add("cross")
        if self.scale is not None:
            out.add("scale")
        for name in ("softcap", "alibi", "rel_bias", "score_mod", "sinks"):
            if getattr(self, name) is not None:
                out.add(name)
        if self.V != self.D:
            out.add("value_width")
        if self.steps is not None:
            out.add("steps")
        if self.cache_len is not None:
            out.add("static_cache")
        if self.paging is not None:
            out.add("paged")
        if self.dropout is not None:
            out.add("dropout")
        return frozenset(out)

    def has_variants(self) -> bool:
        """Whether any score variant or value width other than D is set."""
        return any(getattr(self, n) is not None for n in VARIANT_FIELDS) or self.V != self.D

    def validate(self, finite: bool = True) -> Problem:
        validate(self, finite)
        return self


VARIANT_FIELDS = ("softcap", "alibi", "rel_bias", "score_mod", "sinks")


def variant_positions(p: Problem, align: str) -> Tuple[np.ndarray, np.ndarray]:
    """The absolute positions (queries (B|1, L), keys (B|1, S)) ALiBi and the relative table
    read in ``p`` (``suite.spec.variants.token_positions``): at each batch's
    ``mask.query_offset`` in the decode form, within each sequence of a packed batch
    (``mask.segments``), else by ``align``."""
    m = p.mask
    return token_positions(align, p.L, p.S, m.query_offset, m.segments)


def _positions_at(p: Problem, argument: str) -> None:
    """Beside ``argument`` (an offset, packed or generation form) ALiBi and the relative
    table read absolute positions (``variant_positions``; a generation problem's chunks are
    rows of one causal problem, at positions 0..L-1): their ``align`` must be top_left (the
    form places the rows). A score_mod's i and j are those positions too
    (``suite.spec.oracle.score_mod_at``): a decode row at its offset, query_offset[b] + i,
    against the keys at their cache slots; a packed token at its position within its own
    sequence; a generation step's rows at their positions in the whole sequence."""
    for name in ("alibi", "rel_bias"):
        v = getattr(p, name)
        _expect(v is None or getattr(v, "align", None) == "top_left", f"{name}.align",
                f"'top_left' beside {argument} (the form places each row at its absolute "
                f"position)", repr(getattr(v, "align", None)))


def _validate_steps(p: Problem) -> None:
    """``steps`` and ``cache_len``: a causal self-attention problem computed in chunks."""
    steps, L = p.steps, p.L
    _expect(steps is not None, "cache_len", "set only beside steps", f"steps={steps!r}")
    _expect(isinstance(steps, tuple) and len(steps) >= 1 and all(
        _is_int(n) and n >= 1 for n in steps) and sum(steps) == L, "steps",
        f"a tuple of positive ints summing to L={L}", repr(steps))
    _expect(p.S == L and p.mask.causal and p.mask.query_offset is None, "steps",
            "a causal self-attention problem (L = S, no query_offset): a generating "
            "module's chunks", f"L={L}, S={p.S}, causal={p.mask.causal}")
    _positions_at(p, "steps")  # a chunk's rows sit at their absolute positions
    if p.cache_len is not None:
        _expect(_is_int(p.cache_len) and p.cache_len >= L, "cache_len",
                f"an int >= L={L} (a static cache holds the whole sequence)", repr(p.cache_len))


def _validate_segments(p: Problem) -> None:
    """``mask.segments``: a packed batch, each row's tokens in contiguous sequences."""
    seg, B, L = np.asarray(p.mask.segments), p.B, p.L
    _expect(seg.shape == (B, L), "mask.segments", f"shape (B, L) = ({B}, {L})", f"{seg.shape}")
    _expect(np.issubdtype(seg.dtype, np.integer), "mask.segments", "integers", seg.dtype)
    _expect(p.S == L, "mask.segments", "a self-attention shape (Lq = Lk: the packed tokens "
            "are the queries and the keys)", f"Lq={L}, Lk={p.S}")
    _expect(bool((seg[:, :1] == 0).all() and (np.diff(seg, axis=1) >= 0).all()
                 and (np.diff(seg, axis=1) <= 1).all()), "mask.segments",
            "sequence ids 0, 1, 2, ... in order along each row (packed back to back)",
            f"row 0: {seg[0].tolist()}")
    _expect(p.mask.query_offset is None and p.steps is None, "mask.segments",
            "no query_offset or steps beside it yet", "decode or steps set")
    _positions_at(p, "mask.segments")  # positions restart in each sequence


def _validate_paging(p: Problem) -> None:
    """``paging``: a block table over a pool that holds each sequence's cache; a block two
    sequences share holds the same token in every slot both fill."""
    pg, B, S = p.paging, p.B, p.S
    _expect(isinstance(pg, Paging), "paging", "a suite.spec.paging.Paging", type(pg).__name__)
    _expect(_is_int(pg.page_size) and pg.page_size >= 1, "paging.page_size", "a positive int",
            repr(pg.page_size))
    _expect(_is_int(pg.num_blocks) and pg.num_blocks >= 1, "paging.num_blocks",
            "a positive int", repr(pg.num_blocks))
    _expect(_is_int(pg.seed), "paging.seed", "an int", repr(pg.seed))
    P, N = pg.page_size, pg.num_blocks
    table = np.asarray(pg.block_table)
    T = -(-S // P)
    _expect(table.shape == (B, T), "paging.block_table",
            f"shape (B, ceil(S / page_size)) = ({B}, {T})", f"{table.shape}")
    _expect(np.issubdtype(table.dtype, np.integer), "paging.block_table", "integers",
            table.dtype)
    _expect(bool(((table >= 0) & (table < N)).all()), "paging.block_table",
            f"block ids in [0, num_blocks) = [0, {N})", f"min {table.min()}, max {table.max()}")
    vl = p.mask.valid_lens
    _expect(vl is None or np.ndim(vl) == 1, "paging", "cache lengths per sequence: "
            "mask.valid_lens of shape (B,) or none", f"valid_lens of shape {np.shape(vl)}")
    _expect(p.mask.segments is None and p.steps is None, "paging",
            "no segments or steps beside it (a paged cache is a decode step's cache)",
            "packed or steps set")
    owner: dict = {}  # block -> (sequence, table position) that filled it first
    for b, (n, used) in enumerate(zip(lengths_of(p), blocks_used(lengths_of(p), P))):
        own = table[b, :used]
        _expect(len(set(own.tolist())) == len(own), "paging.block_table",
                "distinct blocks within one sequence's filled entries",
                f"sequence {b}: {own.tolist()}")
        for t, block in enumerate(own.tolist()):
            if block not in owner:
                owner[block] = (b, t, min(P, int(n) - t * P))
                continue
            b0, t0, n0 = owner[block]
            both = min(n0, int(n) - t * P, P)
            same = all(np.array_equal(a[b0, t0 * P:t0 * P + both], a[b, t * P:t * P + both])
                       for a in (p.key, p.value))
            _expect(same, "paging.block_table", f"block {block}, shared by sequences {b0} "
                    f"and {b}, to hold the same tokens in the slots both fill (a shared "
                    f"block is read-only)", "different keys or values")


def seq_lens(segments: np.ndarray) -> List[List[int]]:
    """Each row's sequence lengths, in order: [[5, 7], [3, 4, 5]]."""
    return [np.bincount(np.asarray(row)).tolist() for row in np.asarray(segments)]


def validate(p: Problem, finite: bool = True) -> None:
    """Raise InputError naming the argument, what was expected and what arrived; ``finite``
    False lets NaN and inf into query, key and value (the special-values cases)."""
    for name in ("query", "key", "value"):
        arr = getattr(p, name)
        _expect(isinstance(arr, np.ndarray) and arr.ndim == 3, name,
                "a 3-d array (B, length, E)", f"shape {np.shape(arr)}")
    B, L, E = p.query.shape
    _expect(p.key.shape[0] == B and p.value.shape[0] == B, "key/value batch",
            f"B={B} as in query", f"key {p.key.shape}, value {p.value.shape}")
    _expect(p.key.shape[2] == E and p.value.shape[2] == E, "key/value width",
            f"E={E} as in query", f"key {p.key.shape}, value {p.value.shape}")
    _expect(p.key.shape[1] == p.value.shape[1], "value length",
            f"Lk={p.key.shape[1]} as in key", f"value {p.value.shape}")
    _expect(L >= 1 and p.key.shape[1] >= 1 and B >= 1, "shapes", "B, Lq, Lk >= 1",
            f"query {p.query.shape}, key {p.key.shape}")
    _expect(_is_int(p.num_heads) and p.num_heads >= 1, "num_heads",
            "a positive int", repr(p.num_heads))
    if E % p.num_heads:
        raise InputError(f"num_heads: model width E={E} is not divisible by H={p.num_heads}")
    H, K, D, S = p.H, p.K, p.D, p.S
    _expect(isinstance(K, (int, np.integer)) and 1 <= K <= H and H % K == 0, "num_kv_heads",
            f"a divisor of num_heads={H}", repr(p.num_kv_heads))
    _expect(p.value_head_dim is None or (_is_int(p.value_head_dim) and p.value_head_dim >= 1),
            "value_head_dim", "None or a positive int", repr(p.value_head_dim))
    V = p.V
    for arr_name in ("query", "key", "value"):
        arr = getattr(p, arr_name)
        _expect(np.issubdtype(arr.dtype, np.floating), arr_name, "a float array", arr.dtype)
    w = p.weights
    shapes = {"w_q": (E, H * D), "w_k": (E, K * D), "w_v": (E, K * V), "w_o": (H * V, E),
              "b_q": (H * D,), "b_k": (K * D,), "b_v": (K * V,), "b_o": (E,)}
    for name, shape in shapes.items():
        arr = getattr(w, name)
        if arr is None:
            _expect(name.startswith("b_"), f"weights.{name}", f"an array of shape {shape}", None)
            continue
        _expect(np.shape(arr) == shape, f"weights.{name}", f"shape {shape}", f"{np.shape(arr)}")
    _expect(p.dropout is None or (_is_real(p.dropout) and 0 <= p.dropout < 1), "dropout",
            "None (eval mode) or a probability in [0, 1)", repr(p.dropout))
    m = p.mask
    if m.valid_lens is not None:
        vl = np.asarray(m.valid_lens)
        _expect(vl.shape in ((B,), (B, L)), "mask.valid_lens", f"shape ({B},) or ({B}, {L})",
                f"{vl.shape}")
        _expect(np.issubdtype(vl.dtype, np.integer), "mask.valid_lens", "integers", vl.dtype)
        _expect(bool(((vl >= 0) & (vl <= S)).all()), "mask.valid_lens", f"values in [0, {S}]",
                f"min {vl.min()}, max {vl.max()}")
    _expect(m.causal_align in ("top_left", "bottom_right"), "mask.causal_align",
            "'top_left' or 'bottom_right'", repr(m.causal_align))
    if m.query_offset is not None:
        off = np.asarray(m.query_offset)
        _expect(off.shape == (B,), "mask.query_offset", f"shape ({B},)", f"{off.shape}")
        _expect(np.issubdtype(off.dtype, np.integer), "mask.query_offset", "integers",
                off.dtype)
        _expect(bool(((off >= 0) & (off + L <= S)).all()), "mask.query_offset",
                f"values in [0, S - Lq] = [0, {S - L}] (the rows sit inside the cache)",
                f"min {off.min()}, max {off.max()}")
        _expect(m.causal and m.causal_align == "top_left", "mask.query_offset",
                "a causal mask (causal=True, causal_align='top_left': the offset aligns it)",
                f"causal={m.causal}, causal_align={m.causal_align!r}")
        # The position variants and a score_mod read each row's absolute position,
        # offset[b] + i.
        _positions_at(p, "mask.query_offset")
    if m.segments is not None:
        _validate_segments(p)
    if p.steps is not None or p.cache_len is not None:
        _validate_steps(p)
    if p.paging is not None:
        _validate_paging(p)
    for name, kind in (("allowed", "bool"), ("bias", "float")):
        arr = getattr(m, name)
        if arr is None:
            continue
        arr = np.asarray(arr)
        if kind == "bool":
            _expect(arr.dtype == np.bool_, "mask.allowed", "a bool array (True = attend)",
                    f"dtype {arr.dtype}")
        else:
            _expect(np.issubdtype(arr.dtype, np.floating), "mask.bias", "a float array",
                    f"dtype {arr.dtype}")
            _expect(not np.isnan(arr).any(), "mask.bias", "no NaN", "NaN values")
        try:
            np.broadcast_shapes(arr.shape, (B, H, L, S))
            ok = arr.ndim <= 4
        except ValueError:
            ok = False
        _expect(ok and np.broadcast_shapes(arr.shape, (B, H, L, S)) == (B, H, L, S),
                f"mask.{name}", f"a shape broadcastable to (B, H, Lq, Lk)=({B}, {H}, {L}, {S})",
                f"{arr.shape}")
    if p.scale is not None:
        _expect(_is_real(p.scale) and math.isfinite(p.scale) and p.scale != 0, "scale",
                "a finite non-zero float", repr(p.scale))
    for name, arr in w.as_dict().items():
        if arr is not None:
            _expect(bool(np.isfinite(arr).all()), f"weights.{name}", "finite values",
                    "NaN or inf")
    _validate_variants(p)
    if finite:
        _check_finite(p)


def _per_head(arr: object, name: str, H: int, width: Optional[int] = None) -> None:
    """``arr`` is a finite float array (H,) or (H, width >= 1)."""
    shape = f"({H},)" if width is None else f"({H}, n_buckets)"
    ok = isinstance(arr, np.ndarray) and np.issubdtype(arr.dtype, np.floating) and (
        arr.shape == (H,) if width is None else (arr.ndim == 2 and arr.shape[0] == H))
    _expect(ok, name, f"a float array of shape {shape}", f"{type(arr).__name__} "
            f"{getattr(arr, 'dtype', '')} of shape {np.shape(arr)}")
    _expect(bool(np.isfinite(arr).all()), name, "finite values", "NaN or inf")


def _validate_variants(p: Problem) -> None:
    """Each score variant, named in one line when it is malformed."""
    H = p.H
    if p.softcap is not None:
        _expect(_is_real(p.softcap) and math.isfinite(p.softcap) and p.softcap > 0, "softcap",
                "a finite positive float", repr(p.softcap))
    if p.alibi is not None:
        a = p.alibi
        _expect(isinstance(a, Alibi), "alibi", "a suite.spec.variants.Alibi", type(a).__name__)
        _per_head(a.slopes, "alibi.slopes", H)
        _expect(a.convention in ALIBI_CONVENTIONS, "alibi.convention",
                f"one of {sorted(ALIBI_CONVENTIONS)}", repr(a.convention))
        _expect(a.align in ALIGNS, "alibi.align", f"one of {list(ALIGNS)}", repr(a.align))
    if p.rel_bias is not None:
        rb = p.rel_bias
        _expect(isinstance(rb, RelBias), "rel_bias", "a suite.spec.variants.RelBias",
                type(rb).__name__)
        _per_head(rb.table, "rel_bias.table", H, width=1)
        n = rb.table.shape[1]
        _expect(rb.bucketing in BUCKETINGS, "rel_bias.bucketing", f"one of {sorted(BUCKETINGS)}",
                repr(rb.bucketing))
        _expect(isinstance(rb.bidirectional, (bool, np.bool_)), "rel_bias.bidirectional",
                "True or False", repr(rb.bidirectional))
        _expect(rb.align in ALIGNS, "rel_bias.align", f"one of {list(ALIGNS)}", repr(rb.align))
        _expect(_is_int(rb.max_distance) and rb.max_distance >= 1, "rel_bias.max_distance",
                "a positive int", repr(rb.max_distance))
        if rb.bucketing == "clip":
            want = 2 * rb.max_distance + 1 if rb.bidirectional else rb.max_distance + 1
            _expect(n == want, "rel_bias.table", f"{want} buckets for clip at max_distance="
                    f"{rb.max_distance}", f"{n}")
        else:  # T5: exact buckets below max_exact, log-spaced ones from there to max_distance
            exact = (n // 2 if rb.bidirectional else n) // 2
            _expect(exact >= 1 and rb.max_distance > exact, "rel_bias",
                    f"t5 buckets with max_distance > {exact} (half the "
                    f"{'per-direction ' if rb.bidirectional else ''}buckets)",
                    f"n_buckets={n}, max_distance={rb.max_distance}")
    if p.score_mod is not None:
        m = p.score_mod
        _expect(isinstance(m, ScoreMod) and isinstance(m.name, str) and m.name
                and callable(m.fn), "score_mod", "a suite.spec.variants.ScoreMod(name, fn)", repr(m))
        _probe_score_mod(m, (p.B, H, p.L, p.S))
    if p.sinks is not None:
        _per_head(p.sinks, "sinks", H)


def _probe_score_mod(mod: ScoreMod, shape: Tuple[int, ...]) -> None:
    """The modifier called once on a float64 score of the problem's shape (values spread over
    [-4, 4]): one line naming it when it raises, returns another shape, or gives no finite
    score at all (the oracle would be NaN too, and every plugin would "pass" against it)."""
    score = np.linspace(-4.0, 4.0, int(np.prod(shape))).reshape(shape)
    try:
        with np.errstate(all="ignore"):
            got = mod.fn(score, *score_mod_indices(shape, np.float64), np)
    except Exception as exc:  # the user's function: anything it raises is named
        said = (str(exc).strip().splitlines() or [""])[0]
        raise InputError(f"score_mod {mod.name!r}: raised {type(exc).__name__} on a "
                         f"{shape} float64 score: {said}") from None
    if np.shape(got) != shape:
        raise InputError(f"score_mod {mod.name!r}: expected a score of the input's shape "
                         f"{shape} (elementwise), got {np.shape(got)}")
    if not np.isfinite(np.asarray(got, dtype=np.float64)).any():
        raise InputError(f"score_mod {mod.name!r}: expected finite scores, got NaN or inf "
                         f"everywhere on a {shape} score")


def _check_finite(p: Problem) -> None:
    """NaN/inf is an error, except in key/value positions that valid_lens pads out."""
    bad = np.flatnonzero(~np.isfinite(p.query).reshape(-1))
    if bad.size:
        raise InputError(f"query: expected finite values, got NaN or inf at flat index {bad[0]}")
    vl = p.mask.valid_lens
    for name in ("key", "value"):
        arr = getattr(p, name)
        finite = np.isfinite(arr).all(axis=-1)  # (B, S)
        if vl is not None:
            vl_max = np.asarray(vl).reshape(p.B, -1).max(axis=1)  # (B,)
            finite |= np.arange(p.S)[None, :] >= vl_max[:, None]
        if not finite.all():
            b, j = np.argwhere(~finite)[0]
            raise InputError(f"{name}: expected finite values, got NaN or inf at batch {b}, "
                             f"position {j} (only positions padded out by valid_lens may be)")


def random_weights(rng: np.random.Generator, E: int, H: int, K: int, bias: bool = True,
                   V: Optional[int] = None) -> Weights:
    """Weights scaled 1/sqrt(fan_in) so logits stay O(1); ``V``: the value heads' width
    (None: D)."""
    D = E // H
    V = D if V is None else V

    def w(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols)) / math.sqrt(rows)

    def b(n: int) -> Optional[np.ndarray]:
        return 0.1 * rng.standard_normal(n) if bias else None

    return Weights(w(E, H * D), w(E, K * D), w(E, K * V), w(H * V, E),
                   b(H * D), b(K * D), b(K * V), b(E))


def make_problem(seed: int, B: int = 2, L: int = 8, S: Optional[int] = None, E: int = 16,
                 H: int = 2, K: Optional[int] = None, *, self_attention: bool = False,
                 mask: Optional[Mask] = None, scale: Optional[float] = None,
                 bias: bool = True, input_scale: float = 1.0,
                 value_head_dim: Optional[int] = None) -> Problem:
    """A seeded random problem; the same arguments always give the same arrays
    (``value_head_dim``: value heads of their own width; None draws what it always drew)."""
    sizes = {"B": B, "L": L, "E": E, "H": H, **({"S": S} if S is not None else {}),
             **({"K": K} if K is not None else {})}
    for name, value in sizes.items():
        _expect(_is_int(value) and value >= 1, name, "a positive int", repr(value))
    if scale is not None:
        _expect(_is_real(scale) and math.isfinite(scale) and scale != 0, "scale",
                "a finite non-zero float", repr(scale))
    _expect(_is_real(input_scale) and math.isfinite(input_scale), "input_scale",
            "a finite float", repr(input_scale))
    rng = np.random.default_rng(seed)
    S = L if S is None else S
    K = H if K is None else K
    query = input_scale * rng.standard_normal((B, L, E))
    if self_attention:
        if S != L:
            raise InputError(f"self_attention: expected Lk == Lq, got Lq={L}, Lk={S}")
        key = value = query
    else:
        key = input_scale * rng.standard_normal((B, S, E))
        value = rng.standard_normal((B, S, E))
    if value_head_dim is not None:
        _expect(_is_int(value_head_dim) and value_head_dim >= 1, "value_head_dim",
                "a positive int", repr(value_head_dim))
    weights = random_weights(rng, E, H, K, bias=bias, V=value_head_dim) if E % H == 0 else \
        random_weights(rng, E, 1, 1, bias=bias)
    return Problem(query, key, value, weights, H, K, mask or Mask(), scale,
                   value_head_dim=value_head_dim)


GRAD_NAMES = ("query", "key", "value", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def cotangent(p: Problem) -> np.ndarray:
    """The fixed upstream gradient dL/d(out) (B, L, E) for gradient checks: L = sum(out * g).

    Seeded by the shapes only, so every implementation differentiates the same scalar;
    a problem may set its own (``grad_output``), e.g. to probe causality through gradients.
    """
    if p.grad_output is not None:
        return p.grad_output
    rng = np.random.default_rng([p.B, p.L, p.S, p.E, 7])
    return rng.standard_normal((p.B, p.L, p.E))
