"""Planted bugs in the decode form: NumPy plugins that each place the query rows at the wrong
positions of the key/value cache, as decoding kernels and model ports get it wrong. Each is
numpy's reference with the offsets changed before the mask is built; tests/test_decode.py
runs the decode family on them."""

from __future__ import annotations

import dataclasses

import numpy as np

from implementations.numpy.mha import NumpyMHA


class _MovesRows(NumpyMHA):
    """numpy with ``offsets(offset, L, S)`` in place of the problem's query offsets."""

    def offsets(self, offset: np.ndarray, L: int, S: int) -> np.ndarray:
        raise NotImplementedError

    def attention_mask(self, problem, dtype):
        m = problem.mask
        if m.query_offset is not None:
            off = np.asarray(m.query_offset)
            moved = np.clip(self.offsets(off, problem.L, problem.S), 0, problem.S - problem.L)
            problem = dataclasses.replace(problem, mask=dataclasses.replace(
                m, query_offset=moved.astype(off.dtype)))
        return super().attention_mask(problem, dtype)


class DecodesAtZero(_MovesRows):
    """The offset forgotten: the rows aligned top-left, as if the cache were empty."""

    name = "bug.decode_at_zero"

    def offsets(self, offset, L, S):
        return np.zeros_like(offset)


class DecodesOneLate(_MovesRows):
    """A cache position one past the row's own (the row sees the next slot)."""

    name = "bug.decode_one_late"

    def offsets(self, offset, L, S):
        return offset + 1


class DecodesAtCacheEnd(_MovesRows):
    """Aligned bottom-right at the cache's last slot for every batch (the per-batch
    lengths' offsets replaced by S - Lq)."""

    name = "bug.decode_at_cache_end"

    def offsets(self, offset, L, S):
        return np.full_like(offset, S - L)


class DecodesAtFirstOffset(_MovesRows):
    """Every batch at the first one's offset (one position for the whole batch)."""

    name = "bug.decode_first_offset"

    def offsets(self, offset, L, S):
        return np.full_like(offset, offset[0])


class DecodesIgnoringLengths(NumpyMHA):
    """The per-batch cache lengths dropped at an offset: each row sees every slot up to its
    own position (a kernel that derives the filled slots from the offset, ``offset + 1``,
    as flash-decoding's ``cache_seqlens`` would be if computed from the positions)."""

    name = "bug.decode_ignores_lengths"

    def attention_mask(self, problem, dtype):
        if problem.mask.query_offset is not None:
            problem = dataclasses.replace(problem, mask=dataclasses.replace(
                problem.mask, valid_lens=None))
        return super().attention_mask(problem, dtype)


# --- score variants right in prefill, wrong at a decode step (issue 50) ------------------------
class DecodeDropsCap(NumpyMHA):
    """Soft-capping kept in prefill and dropped on the decode path (rows at an offset into a
    cache): a decode kernel written after the prefill one, without the cap."""

    name = "bug.decode_drops_cap"

    def cap(self, scores, cap):
        return scores if getattr(self, "_decoding", False) else super().cap(scores, cap)

    def attend(self, q, k, v, mask, scale, need_weights):
        self._decoding = mask.query_offset is not None
        return super().attend(q, k, v, mask, scale, need_weights)


class DecodeDropsSink(NumpyMHA):
    """Sinks kept in prefill and left out of the softmax at a decode step."""

    name = "bug.decode_drops_sink"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.query_offset is not None and mask.variants is not None:
            mask = mask.replace(variants=dataclasses.replace(mask.variants, sinks=None))
        return super().attend(q, k, v, mask, scale, need_weights)


class AlibiAtZero(NumpyMHA):
    """ALiBi and the relative table (and a score modifier's i, which reads the same
    positions) at a decode step measured from row 0 (query i at position i), not from the
    row's offset into the cache: a decode path that passes the chunk's row index where the
    absolute position is due. The mask keeps the offset."""

    name = "bug.alibi_at_zero"

    def positions(self, align, L, S, mask):
        return super().positions(align, L, S, None if mask is None
                                 else mask.replace(query_offset=None))
