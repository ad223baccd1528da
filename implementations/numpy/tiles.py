"""The tiled core of NumPy FlashAttention: an online softmax over key tiles, memory linear
in length.

``TiledAttention`` never holds a (B, H, L, S) array: it walks query tiles, and for each
one makes a single pass over key tiles, keeping a running row max, a running row sum and
an unnormalised output accumulator (Dao et al., 2022). Key tiles that the mask hides
entirely (above the causal diagonal, past the longest valid length) are skipped, which
is where causal attention gets its 2x; the causal diagonal square is cut into row strips
so that only strip-sized triangles above the diagonal are computed.

The mask stays in its canonical parts (``TileMask``); each tile's part is built on the
fly from valid_lens, the causal offset and tile-sized slices of the user's broadcastable
``allowed`` / ``bias`` arrays.

Logits are kept in base 2 (q is scaled by scale * log2(e), the bias by log2(e)), so the
one elementwise pass per tile is ``exp2``, which NumPy runs twice as fast as ``exp``.
Masked weights are set to 0 after ``exp2`` rather than to -inf before it (exp2 takes a
slow path on -inf and underflowing lanes).

Two matmuls per tile do nearly all the work: keys are kept transposed (D, S), so
``q @ k^T`` reads them untransposed, and v is augmented with a ones column, so
``p @ [v, 1]`` also sums the rows. The row max m is kept lazily at 0 (a tile is kept
unless its sums leave a safe range, then redone the standard way, after which the
unit's logits have m subtracted), so a tile costs two matmuls and one exp2 pass.
Work units (batch item, head group, query tile) run on ``numpy_workers.Workers``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np

from implementations.numpy.workers import Workers
from suite.spec.problem import Problem

# Tile sizes (heads per unit, query tile, key tile) measured with 2 workers on a 2-core
# AVX-512 machine (2 MiB L2 per core, OpenBLAS) at L = 1024-4096, whole forward. Unmasked:
# one head per unit with (512, 512) float32 score tiles (1 MiB), ~70% of a core's matmul
# peak per tile. Causal: 4 heads per unit with (256, 256) tiles, 3-6% ahead of the
# unmasked choice there (a quarter as many diagonal-strip calls, so less time waiting for
# the GIL between them). Diagonal strips are 128 query rows.
TILES = (1, 512, 512)
CAUSAL_TILES = (4, 256, 256)
BLOCK_DIAG = 128
# Lazy max: a tile exponentiated against a stale row max is kept while its row sums stay
# in [_LO, _HI], far from float32 overflow and underflow (2^+-32 of 2^+-126).
_HI = 2.0**32
_LO = 2.0**-32
_LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))


@dataclasses.dataclass(frozen=True)
class TileMask:
    """The canonical mask kept in parts; ``None`` parts are absent.

    key_end: (B,) keys j >= key_end[b] are never read (padding by valid_lens; may hold NaN).
    row_lens: (B, L) per-query valid lengths, when valid_lens is (B, L).
    causal_offset: query i sees keys j <= i + causal_offset (None: not causal).
    allowed: bool view broadcast to (B, H, L, S), True = may attend (zero strides, no copy).
    bias: float view broadcast to (B, H, L, S), times log2(e) (base-2 logits), in the
          compute dtype (zero strides over the user's shape).
    """

    key_end: np.ndarray
    row_lens: Optional[np.ndarray] = None
    causal_offset: Optional[int] = None
    allowed: Optional[np.ndarray] = None
    bias: Optional[np.ndarray] = None


def tile_mask(p: Problem, dtype: type) -> TileMask:
    """Translate the canonical mask of ``p`` into parts; nothing of size L*S is allocated."""
    B, H, L, S = p.B, p.H, p.L, p.S
    m = p.mask
    key_end = np.full(B, S, dtype=np.int64)
    row_lens = None
    if m.valid_lens is not None:
        vl = np.asarray(m.valid_lens, dtype=np.int64)
        key_end = vl if vl.ndim == 1 else vl.max(axis=1)  # (B,)
        row_lens = vl if vl.ndim == 2 else None  # (B, L)
    offset = None
    if m.causal:
        offset = 0 if m.causal_align == "top_left" else S - L
    allowed = None if m.allowed is None else np.broadcast_to(
        np.asarray(m.allowed, dtype=bool), (B, H, L, S))
    # Base-2 logits (exp2 is twice as fast as exp): the bias is scaled by log2(e) at the
    # user's shape, in float64 before the cast, then viewed at (B, H, L, S).
    bias = None if m.bias is None else np.broadcast_to(
        (np.asarray(m.bias, dtype=np.float64) * _LOG2E).astype(dtype), (B, H, L, S))
    return TileMask(key_end, row_lens, offset, allowed, bias)


class _Buffers:
    """One worker's preallocated tile buffers, reused across tiles and calls."""

    def __init__(self, hc: int, bq: int, bk: int, d: int, dtype: type):
        self.shape = (hc, bq, bk, d, np.dtype(dtype))
        self.q = np.empty((hc, bq, d), dtype)  # (h, Tq, D)
        self.m = np.empty((hc, bq, 1), dtype)  # (h, Tq, 1)
        self.shifted = False  # whether any row of the current unit has m != 0
        self.scores = np.empty((hc, bq, bk), dtype)  # (h, Tq, Tk)
        self.acc = np.empty((hc, bq, d + 1), dtype)  # (h, Tq, D+1)
        self.pv = np.empty((hc, bq, d + 1), dtype)  # (h, Tq, D+1)
        self.shift = np.empty((hc, bq, 1), dtype)  # (h, Tq, 1)
        self.alpha = np.empty((hc, bq, 1), dtype)  # (h, Tq, 1)


class TiledAttention:
    """The tiled online-softmax core on ``workers``: ``heads_per_unit``, ``block_q`` and
    ``block_k`` are the heads one batched matmul covers and the query / key tile lengths
    (None: ``TILES``, or ``CAUSAL_TILES`` for a causal mask), ``block_diag`` the query
    rows of a causal diagonal strip."""

    def __init__(self, workers: Workers, block_q: Optional[int] = None,
                 block_k: Optional[int] = None, heads_per_unit: Optional[int] = None,
                 block_diag: int = BLOCK_DIAG):
        self.workers = workers
        self.block_q, self.block_k = block_q, block_k
        self.heads_per_unit, self.block_diag = heads_per_unit, block_diag

    def __call__(self, q: np.ndarray, kt: np.ndarray, va: np.ndarray, mask: Optional[TileMask],
                 scale: float, heads: Optional[np.ndarray] = None) -> np.ndarray:
        """The tiled core on staged operands: keys transposed, values augmented with a ones
        column so that p @ [v, 1] = [p @ v, sum(p)] also sums the rows. q (B, H, L, D),
        kt (B, K, D, S), va (B, K, S, D+1) -> heads (B, H, L, D) over a (B, L, H, D) buffer
        (``heads`` when given, else a new one)."""
        B, H, L, D = q.shape
        K, S = va.shape[1], va.shape[2]
        if H % K:
            raise ValueError(f"k: expected a number of kv heads dividing H={H}, got {K}")
        mask = mask if mask is not None else TileMask(np.full(B, S, dtype=np.int64))
        t = kt.dtype.type
        if heads is None:
            heads = np.empty((B, L, H, D), t)
        out = heads.transpose(0, 2, 1, 3)  # (B, H, L, D) view
        tiles = self.tiling(mask)
        self.workers.map(lambda u: self._unit(u, q, t(float(scale) * _LOG2E), kt, va, out, mask,
                                              H // K, tiles),
                         self.units(B, H, L, H // K, mask, tiles))
        return out.astype(q.dtype, copy=False)

    def tiling(self, mask: TileMask) -> Tuple[int, int, int]:
        """(heads per unit, query tile, key tile): the instance's, else the tuned defaults."""
        hc, bq, bk = CAUSAL_TILES if mask.causal_offset is not None else TILES
        return (self.heads_per_unit or hc, self.block_q or bq, self.block_k or bk)

    def units(self, B: int, H: int, L: int, G: int, mask: TileMask,
              tiles: Tuple[int, int, int]) -> List[Tuple[int, int, int, int, int]]:
        """(b, h0, h1, i0, i1) work units, heaviest first so the pool ends evenly.

        With GQA (G query heads per kv head) a head group stays inside one kv head, so
        its kv tile is one array broadcast over the group.
        """
        hc = max(1, min(H, tiles[0]))
        if G > 1:
            hc = max(c for c in range(1, min(hc, G) + 1) if G % c == 0)
        bq = tiles[1]
        units = [(b, h0, min(h0 + hc, H), i0, min(i0 + bq, L)) for b in range(B)
                 for h0 in range(0, H, hc) for i0 in range(0, L, bq)]
        if mask.causal_offset is not None:
            units.sort(key=lambda u: -u[3])  # causal: later query tiles see more keys
        return units

    def _unit(self, unit: Tuple[int, int, int, int, int], q: np.ndarray, scale: Any,
              kt: np.ndarray, va: np.ndarray, out: np.ndarray, mask: TileMask,
              G: int, tiles: Tuple[int, int, int]) -> None:
        """One query tile of one head group: a single pass over its visible key tiles.

        The running row max m is kept lazily: a tile is first exponentiated against the
        current m (no max, subtract or rescale passes); only when a row's tile sum leaves
        [LO, HI] (a logit far above m, or no mass yet) is the tile redone the standard way.
        """
        b, h0, h1, i0, i1 = unit
        D = q.shape[3]
        hc, tq = h1 - h0, i1 - i0
        # This thread's buffers for these tile sizes, head width and dtype (the last 4 kept).
        key = (*tiles, D, np.dtype(out.dtype))
        buf = self.workers.cached(key, lambda: _Buffers(*key))
        acc = buf.acc[:hc, :tq]  # (h, Tq, D+1): [sum p v, sum p]
        np.multiply(q[b, h0:h1, i0:i1], scale, out=buf.q[:hc, :tq], casting="same_kind")
        buf.m[:hc, :tq] = 0  # m = 0 until a tile's sums leave [LO, HI]
        buf.shifted = False  # ... so the logits need no subtraction until then
        acc.fill(0)
        kv = slice(h0, h1) if G == 1 else slice(h0 // G, h0 // G + 1)  # broadcast over GQA
        with np.errstate(over="ignore", invalid="ignore"):  # overflow: the tile is redone
            for r0, r1, j0, j1 in self._tiles(mask, b, i0, i1, tiles[2]):
                forbid = self._forbidden(mask, b, h0, h1, r0, r1, j0, j1)
                if forbid is not False:  # False: the whole tile is masked, skip its matmuls
                    self._tile(buf, slice(r0 - i0, r1 - i0), kt[b, kv, :, j0:j1], va[b, kv, j0:j1],
                               mask, forbid, b, h0, h1, r0, r1, j0, j1)
        # A fully masked query row has no key: row sum 0, its head output stays 0.
        row_sum = acc[..., D:]  # (h, Tq, 1)
        np.copyto(row_sum, 1, where=row_sum == 0)
        np.divide(acc[..., :D], row_sum, out=out[b, h0:h1, i0:i1])

    def _tiles(self, mask: TileMask, b: int, i0: int, i1: int,
               bk: int) -> Iterator[Tuple[int, int, int, int]]:
        """(r0, r1, j0, j1): the query rows and keys of each tile of query tile [i0, i1).

        Keys every row may see come in full-height tiles of ``bk`` keys; with a causal mask
        the diagonal square after them is cut into row strips of ``block_diag``, each ending
        at its own last visible key, so only strip-sized triangles above the diagonal are
        computed and masked.
        """
        key_end = self._key_end(mask, b, i0, i1)
        full_end = key_end
        if mask.causal_offset is not None:
            full_end = min(key_end, max(i0 + mask.causal_offset, 0))  # seen by row i0 on
        for j0 in range(0, full_end, bk):
            yield i0, i1, j0, min(j0 + bk, full_end)
        if full_end < key_end:
            for r0 in range(i0, i1, self.block_diag):
                r1 = min(r0 + self.block_diag, i1)
                end = min(key_end, r1 + mask.causal_offset)  # row r1 - 1's last key + 1
                for j0 in range(full_end, end, bk):
                    yield r0, r1, j0, min(j0 + bk, end)

    def _tile(self, buf: _Buffers, rows: slice, k_tile: np.ndarray, v_tile: np.ndarray,
              mask: TileMask, forbid: Any, b: int, h0: int, h1: int, r0: int, r1: int,
              j0: int, j1: int) -> None:
        """Fold keys [j0, j1) into rows [r0, r1) of the unit's accumulator (``rows`` the same
        rows relative to the unit); k_tile (h or 1, D, Tk), v_tile (h or 1, Tk, D+1)."""
        hc, D = h1 - h0, v_tile.shape[-1] - 1
        qs = buf.q[:hc, rows]  # (h, Tr, D)
        m = buf.m[:hc, rows] if buf.shifted else None  # (h, Tr, 1)
        acc, pv = buf.acc[:hc, rows], buf.pv[:hc, rows]  # (h, Tr, D+1)
        row_sum, tile_sum = acc[..., D:], pv[..., D:]  # (h, Tr, 1) views
        s = buf.scores[:hc, : r1 - r0, : j1 - j0]  # (h, Tr, Tk)
        self._logits(s, qs, k_tile, m, mask, b, h0, h1, r0, r1, j0, j1)
        np.exp2(s, out=s)  # against the current m: no max/subtract/rescale pass
        if forbid is not None:
            # Masked weights are exactly 0, set after exp2 (whose -inf and underflow lanes take
            # a slow path), so garbage keys' NaN/inf never reach the sums.
            np.copyto(s[..., forbid[0]:], 0, where=forbid[1])
        np.matmul(s, v_tile, out=pv)  # (h, Tr, D+1)
        # Accept unless a row overflows past HI (or is NaN), or has no mass yet and underflows.
        if tile_sum.max() <= _HI and (tile_sum.min() >= _LO
                                      or not ((tile_sum < _LO) & (row_sum == 0)).any()):
            acc += pv
            return
        shift, alpha = buf.shift[:hc, rows], buf.alpha[:hc, rows]  # (h, Tr, 1)
        m = buf.m[:hc, rows]  # (h, Tr, 1)
        self._logits(s, qs, k_tile, m, mask, b, h0, h1, r0, r1, j0, j1)
        if forbid is not None:  # assign, not add: garbage keys may be NaN
            np.copyto(s[..., forbid[0]:], -np.inf, where=forbid[1])
        # Standard online-softmax step: raise m to the tile's row max where it grew.
        np.max(s, axis=-1, keepdims=True, out=shift)
        grow = np.isfinite(shift) & ((shift > 0) | (row_sum == 0))
        np.copyto(shift, 0, where=~grow)  # rows that keep their m (or see no key)
        s -= shift
        np.exp2(s, out=s)  # softmax numerators (base 2) in the compute dtype
        np.negative(shift, out=alpha)
        np.exp2(alpha, out=alpha)  # rescales the old sum and accumulator; inf if row_sum == 0
        np.copyto(alpha, 1, where=row_sum == 0)  # nothing to rescale (and no 0*inf)
        np.matmul(s, v_tile, out=pv)  # (h, Tr, D+1)
        acc *= alpha
        acc += pv
        m += shift
        buf.shifted = True

    @staticmethod
    def _logits(s: np.ndarray, qs: np.ndarray, k_tile: np.ndarray, m: Optional[np.ndarray],
                mask: TileMask, b: int, h0: int, h1: int, i0: int, i1: int, j0: int,
                j1: int) -> None:
        """s = (q.k*scale + bias) * log2(e) - m (m None: all 0), masks not applied;
        qs (h, Tq, D) holds q*scale*log2(e), k_tile (h or 1, D, Tk), m (h, Tq, 1)."""
        np.matmul(qs, k_tile, out=s)  # (h, Tq, Tk)
        if m is not None:
            s -= m
        if mask.bias is not None:
            s += mask.bias[b, h0:h1, i0:i1, j0:j1]

    def _key_end(self, mask: TileMask, b: int, i0: int, i1: int) -> int:
        """Keys past this are hidden from every query in [i0, i1): valid_lens and causal."""
        end = int(mask.key_end[b])
        if mask.row_lens is not None:
            end = min(end, int(mask.row_lens[b, i0:i1].max()))
        if mask.causal_offset is not None:
            end = min(end, i1 - 1 + mask.causal_offset + 1)
        return max(end, 0)

    def _forbidden(self, mask: TileMask, b: int, h0: int, h1: int, i0: int, i1: int, j0: int,
                   j1: int):
        """The tile's masked entries: None (none masked), False (all masked) or (c0, forbid)
        with forbid a bool array broadcastable to (h, Tq, Tk - c0) over the tile's columns
        from c0 on (head-free parts stay 2-D; a causal strip's c0 skips the columns every
        row sees, so only its own diagonal square is masked)."""
        forbid = None
        if mask.row_lens is not None:
            lens = mask.row_lens[b, i0:i1]  # (Tq,)
            if j0 >= lens.max():
                return False
            if j1 > lens.min():
                forbid = np.arange(j0, j1)[None, :] >= lens[:, None]  # (Tq, Tk)
        if mask.causal_offset is not None:
            last = mask.causal_offset + i0  # row i0's last visible key; row i0 + x's is last + x
            if j0 > last + (i1 - i0 - 1):
                return False
            if j1 - 1 > last:
                c0 = max(0, last + 1 - j0)  # the columns before c0 are seen by every row
                part = _above_diagonal(i1 - i0, j1 - j0 - c0, last - j0 - c0)  # shared
                if forbid is None and mask.allowed is None:
                    return c0, part
                if forbid is None:
                    forbid = np.zeros((i1 - i0, j1 - j0), bool)  # (Tq, Tk)
                np.logical_or(forbid[:, c0:], part, out=forbid[:, c0:])
        if mask.allowed is not None:
            heads = slice(h0, h1) if mask.allowed.strides[1] else slice(h0, h0 + 1)
            allowed = mask.allowed[b, heads, i0:i1, j0:j1]  # (h or 1, Tq, Tk) view
            if not allowed.any():
                return False
            forbid = ~allowed if forbid is None else np.logical_or(forbid, ~allowed)
        return None if forbid is None else (0, forbid)


def stage(x: np.ndarray, into: np.ndarray, name: str, b: int, r0: int) -> None:
    """Copy keys or values x (Tr, K, D) for rows [r0, r0 + Tr) of batch item b into
    their layouts: kt (B, K, D, S), or va (B, K, S, D+1) with its ones column."""
    r1 = r0 + x.shape[0]
    D = x.shape[2]
    if name == "k":
        np.copyto(into[b, :, :, r0:r1], x.transpose(1, 2, 0), casting="same_kind")
    else:
        np.copyto(into[b, :, r0:r1, :D], x.transpose(1, 0, 2), casting="same_kind")
        into[b, :, r0:r1, D] = 1


@functools.lru_cache(maxsize=64)
def _above_diagonal(rows: int, cols: int, shift: int) -> np.ndarray:
    """Read-only (rows, cols) bool, True where col > row + shift (a causal tile's masked part);
    cached, since aligned tiles repeat a handful of shapes and shifts."""
    tri = np.arange(cols)[None, :] > np.arange(shift, rows + shift)[:, None]  # (Tq, Tk)
    tri.setflags(write=False)
    return tri


def compute_dtype(dtype: Any) -> type:
    """float16 tiles run in float32 (NumPy has no fast float16 matmul; sums need the range)."""
    return np.float32 if np.dtype(dtype) == np.float16 else np.dtype(dtype).type
