"""NumPy FlashAttention: tiled attention with an online softmax, memory linear in length.

The attention core never holds a (B, H, L, S) array: it walks query tiles, and
for each one makes a single pass over key tiles, keeping a running row max, a
running row sum and an unnormalised output accumulator (Dao et al., 2022).
Key tiles that the mask hides entirely (above the causal diagonal, past the
longest valid length) are skipped, which is where causal attention gets its 2x.

The mask stays in its canonical parts (``TileMask``); each tile's part is built
on the fly from valid_lens, the causal offset and tile-sized slices of the
user's broadcastable ``allowed`` / ``bias`` arrays.

Work units (batch item, head group, query tile) run on a small thread pool with
BLAS held to one thread, so the softmax's elementwise passes, which NumPy runs
on one core, are spread over the cores as well as the matmuls.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from implementations.numpy_mha import NP_DTYPES, NumpyCore
from suite.problem import Problem

# Tile sizes measured on a 2-core AVX-512 machine (2 MiB L2 per core): a (heads, 256, 512)
# float32 score tile per worker stays in L2 across the softmax passes.
BLOCK_Q = 256
BLOCK_K = 512
HEADS_PER_UNIT = 4
# Lazy max: a tile exponentiated against a stale row max is kept while its row sums stay
# in [_LO, _HI], far from float32 overflow and underflow (2^+-32 of 2^+-126).
_HI = 2.0**32
_LO = 2.0**-32


@dataclasses.dataclass(frozen=True)
class TileMask:
    """The canonical mask kept in parts; ``None`` parts are absent.

    key_end: (B,) keys j >= key_end[b] are never read (padding by valid_lens; may hold NaN).
    row_lens: (B, L) per-query valid lengths, when valid_lens is (B, L).
    causal_offset: query i sees keys j <= i + causal_offset (None: not causal).
    allowed: bool view broadcast to (B, H, L, S), True = may attend (zero strides, no copy).
    bias: float view broadcast to (B, H, L, S), in the compute dtype (zero strides, no copy).
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
    bias = None if m.bias is None else np.broadcast_to(
        np.asarray(m.bias, dtype=dtype), (B, H, L, S))  # cast at the user's shape, then a view
    return TileMask(key_end, row_lens, offset, allowed, bias)


class _Buffers:
    """One worker's preallocated tile buffers, reused across tiles and calls."""

    def __init__(self, hc: int, bq: int, bk: int, d: int, dtype: type):
        self.shape = (hc, bq, bk, d, np.dtype(dtype))
        self.q = np.empty((hc, bq, d + 1), dtype)  # (h, Tq, D+1)
        self.scores = np.empty((hc, bq, bk), dtype)  # (h, Tq, Tk)
        self.forbid = np.empty((hc, bq, bk), bool)  # (h, Tq, Tk)
        self.acc = np.empty((hc, bq, d + 1), dtype)  # (h, Tq, D+1)
        self.pv = np.empty((hc, bq, d + 1), dtype)  # (h, Tq, D+1)
        self.shift = np.empty((hc, bq, 1), dtype)  # (h, Tq, 1)
        self.alpha = np.empty((hc, bq, 1), dtype)  # (h, Tq, 1)


class NumpyFlashMHA(NumpyCore):
    """FlashAttention's tiled online softmax in NumPy: O(L) memory, masked tiles skipped.

    ``block_q`` / ``block_k`` are the query / key tile lengths, ``num_threads`` the
    worker count (default: the CPU count); all three may be set per instance (tests
    use small tiles).
    """

    name = "numpy.flash"
    # No "weights": returning (B, H, L, S) would undo the point of the algorithm.
    features = NumpyCore.features

    def __init__(self, block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
                 num_threads: Optional[int] = None, heads_per_unit: int = HEADS_PER_UNIT):
        for arg, val in (("block_q", block_q), ("block_k", block_k),
                         ("heads_per_unit", heads_per_unit)):
            if not isinstance(val, (int, np.integer)) or val < 1:
                raise ValueError(f"{arg}: expected a positive int, got {val!r}")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads: expected a positive int or None, got {num_threads!r}")
        self.block_q = int(block_q)
        self.block_k = int(block_k)
        self.heads_per_unit = int(heads_per_unit)
        self.num_threads = num_threads or os.cpu_count() or 1
        self._pool: Optional[ThreadPoolExecutor] = None
        self._local = threading.local()
        self._blas = None

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if need_weights:
            raise ValueError("need_weights: numpy.flash does not return attention weights "
                             "(feature 'weights' not declared), got True")
        # The parent builds a dense (B, H, L, S) bias for a masked problem: prepare it
        # unmasked and keep the mask in its parts instead.
        bare = dataclasses.replace(problem, mask=dataclasses.replace(problem.mask, **{
            "valid_lens": None, "causal": False, "allowed": None, "bias": None}))
        state = super().prepare(bare, device, dtype, need_weights=False, grad=grad)
        state["p"] = problem
        state["bias"] = tile_mask(problem, _compute_dtype(NP_DTYPES[dtype]))
        return state

    # --- the attention core -----------------------------------------------------------------
    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: Optional[TileMask],
               scale: float, need_weights: bool) -> Tuple[np.ndarray, None]:
        """q (B, H, L, D), k/v (B, H, S, D), ``bias`` a TileMask -> (heads (B, H, L, D), None)."""
        B, H, L, D = q.shape
        S = k.shape[2]
        mask = bias if bias is not None else TileMask(np.full(B, S, dtype=np.int64))
        t = _compute_dtype(q.dtype)
        # Augmented operands, so the matmuls also do the row-offset subtraction and row sum:
        # [q*scale, -m] @ [k, 1]^T = q.k*scale - m, and p @ [v, 1] = [p @ v, sum(p)].
        qs = np.empty((B, H, L, D), t)  # (B, H, L, D)
        np.multiply(q, t(scale), out=qs, casting="same_kind")  # scale folded into q once
        ka = np.empty((B, H, S, D + 1), t)  # (B, H, S, D+1); BLAS reads it transposed
        np.copyto(ka[..., :D], k, casting="same_kind")
        ka[..., D] = 1
        va = np.empty((B, H, S, D + 1), t)  # (B, H, S, D+1)
        np.copyto(va[..., :D], v, casting="same_kind")
        va[..., D] = 1
        out = np.empty((B, H, L, D), t)  # (B, H, L, D)
        units = self._units(B, H, L, mask)
        with self._one_blas_thread():
            if len(units) > 1 and self.num_threads > 1:
                pool = self._executor()
                list(pool.map(lambda u: self._unit(u, qs, ka, va, out, mask), units))
            else:
                for u in units:
                    self._unit(u, qs, ka, va, out, mask)
        return out.astype(q.dtype, copy=False), None

    def _units(self, B: int, H: int, L: int, mask: TileMask) -> List[Tuple[int, int, int, int]]:
        """(b, h0, h1, i0) work units, heaviest first so the pool ends evenly."""
        hc = max(1, min(H, self.heads_per_unit))
        units = [(b, h0, min(h0 + hc, H), i0) for b in range(B) for h0 in range(0, H, hc)
                 for i0 in range(0, L, self.block_q)]
        if mask.causal_offset is not None:
            units.sort(key=lambda u: -u[3])  # causal: later query tiles see more keys
        return units

    def _unit(self, unit: Tuple[int, int, int, int], qs: np.ndarray, ka: np.ndarray,
              va: np.ndarray, out: np.ndarray, mask: TileMask) -> None:
        """One query tile of one head group: a single pass over its visible key tiles.

        The running row max m is kept lazily: a tile is first exponentiated against the
        current m (no max, subtract or rescale passes); only when a row's tile sum leaves
        [LO, HI] (a logit far above m, or no mass yet) is the tile redone the standard way.
        """
        b, h0, h1, i0 = unit
        L, D = qs.shape[2], qs.shape[3]
        i1 = min(i0 + self.block_q, L)
        hc, tq = h1 - h0, i1 - i0
        buf = self._buffers(hc, D, qs.dtype)
        qa = buf.q[:hc, :tq]  # (h, Tq, D+1): [q*scale, -m]
        acc, pv = buf.acc[:hc, :tq], buf.pv[:hc, :tq]  # (h, Tq, D+1): [sum p v, sum p]
        row_sum, tile_sum = acc[..., D:], pv[..., D:]  # (h, Tq, 1) views
        shift, alpha = buf.shift[:hc, :tq], buf.alpha[:hc, :tq]  # (h, Tq, 1)
        qa[..., :D] = qs[b, h0:h1, i0:i1]
        qa[..., D] = 0  # m = 0 until a row's first visible tile sets it
        acc.fill(0)
        key_end = self._key_end(mask, b, i0, i1)
        for j0 in range(0, key_end, self.block_k):
            j1 = min(j0 + self.block_k, key_end)
            forbid = self._forbidden(mask, buf, b, h0, h1, i0, i1, j0, j1)
            if forbid is False:
                continue  # the whole tile is masked: skip its matmuls
            s = buf.scores[:hc, :tq, : j1 - j0]  # (h, Tq, Tk)
            v_tile = va[b, h0:h1, j0:j1]  # (h, Tk, D+1)
            self._logits(s, qa, ka, mask, forbid, b, h0, h1, i0, i1, j0, j1)
            np.exp(s, out=s)  # against the current m: no max/subtract/rescale pass
            np.matmul(s, v_tile, out=pv)  # (h, Tq, D+1)
            # Accept unless a row overflows past HI, or has no mass yet and underflows.
            if (tile_sum <= _HI).all() and not ((tile_sum < _LO) & (row_sum == 0)).any():
                acc += pv
                continue
            self._logits(s, qa, ka, mask, forbid, b, h0, h1, i0, i1, j0, j1)
            # Standard online-softmax step: raise m to the tile's row max where it grew.
            np.max(s, axis=-1, keepdims=True, out=shift)
            grow = np.isfinite(shift) & ((shift > 0) | (row_sum == 0))
            np.copyto(shift, 0, where=~grow)  # rows that keep their m (or see no key)
            s -= shift
            np.exp(s, out=s)  # softmax numerators in the compute dtype
            np.negative(shift, out=alpha)
            np.exp(alpha, out=alpha)  # rescales the old sum and accumulator
            np.copyto(alpha, 1, where=row_sum == 0)  # nothing to rescale (and no 0*inf)
            np.matmul(s, v_tile, out=pv)  # (h, Tq, D+1)
            acc *= alpha
            acc += pv
            qa[..., D:] -= shift
        # A fully masked query row has no key: row sum 0, its head output stays 0.
        np.copyto(row_sum, 1, where=row_sum == 0)
        np.divide(acc[..., :D], row_sum, out=out[b, h0:h1, i0:i1])

    @staticmethod
    def _logits(s: np.ndarray, qa: np.ndarray, ka: np.ndarray, mask: TileMask, forbid: Any,
                b: int, h0: int, h1: int, i0: int, i1: int, j0: int, j1: int) -> None:
        """s = q.k*scale - m (+ bias), masked entries exactly -inf."""
        np.matmul(qa, ka[b, h0:h1, j0:j1].transpose(0, 2, 1), out=s)  # (h, Tq, Tk)
        if mask.bias is not None:
            s += mask.bias[b, h0:h1, i0:i1, j0:j1]
        if forbid is not None:
            # Masked scores are exactly -inf (never NaN from garbage keys): assign, not add.
            np.copyto(s, -np.inf, where=forbid)

    def _key_end(self, mask: TileMask, b: int, i0: int, i1: int) -> int:
        """Keys past this are hidden from every query in [i0, i1): valid_lens and causal."""
        end = int(mask.key_end[b])
        if mask.row_lens is not None:
            end = min(end, int(mask.row_lens[b, i0:i1].max()))
        if mask.causal_offset is not None:
            end = min(end, i1 - 1 + mask.causal_offset + 1)
        return max(end, 0)

    def _forbidden(self, mask: TileMask, buf: _Buffers, b: int, h0: int, h1: int, i0: int,
                   i1: int, j0: int, j1: int):
        """The tile's masked entries: None (none masked), False (all masked) or a bool array."""
        parts = []
        keys = np.arange(j0, j1)  # (Tk,)
        if mask.row_lens is not None:
            lens = mask.row_lens[b, i0:i1]  # (Tq,)
            if j0 >= lens.max():
                return False
            if j1 > lens.min():
                parts.append(keys[None, :] >= lens[:, None])  # (Tq, Tk)
        if mask.causal_offset is not None:
            last = np.arange(i0, i1) + mask.causal_offset  # (Tq,) last visible key per row
            if j0 > last[-1]:
                return False
            if j1 - 1 > last[0]:
                parts.append(keys[None, :] > last[:, None])  # (Tq, Tk)
        if mask.allowed is not None:
            allowed = mask.allowed[b, h0:h1, i0:i1, j0:j1]  # (h, Tq, Tk) view
            if not allowed.any():
                return False
            parts.append(~allowed)
        if not parts:
            return None
        forbid = buf.forbid[: h1 - h0, : i1 - i0, : j1 - j0]  # (h, Tq, Tk)
        np.copyto(forbid, parts[0])
        for part in parts[1:]:
            forbid |= part
        return forbid

    # --- workers ------------------------------------------------------------------------------
    def _buffers(self, hc: int, d: int, dtype: np.dtype) -> _Buffers:
        """This thread's buffers, grown when a call needs larger tiles or another dtype."""
        buf = getattr(self._local, "buf", None)
        want = (hc, self.block_q, self.block_k, d, np.dtype(dtype))
        if buf is None or buf.shape[4] != want[4] or any(
                have < need for have, need in zip(buf.shape[:4], want[:4])) or buf.shape[3] != d:
            buf = self._local.buf = _Buffers(*want)
        return buf

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="numpy-flash")
        return self._pool

    def _one_blas_thread(self):
        """Hold BLAS to one thread while our workers run (each worker is one core)."""
        if self.num_threads <= 1:
            return nullcontext()
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # threadpoolctl is a dependency; without it BLAS threads stay
            return nullcontext()
        if self._blas is None:
            self._blas = ThreadpoolController()
        return self._blas.limit(limits=1, user_api="blas")

    def __getstate__(self) -> Dict[str, Any]:
        return {"block_q": self.block_q, "block_k": self.block_k,
                "num_threads": self.num_threads, "heads_per_unit": self.heads_per_unit}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(**state)


def _compute_dtype(dtype: Any) -> type:
    """float16 tiles run in float32 (NumPy has no fast float16 matmul; sums need the range)."""
    return np.float32 if np.dtype(dtype) == np.float16 else np.dtype(dtype).type
