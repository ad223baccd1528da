"""Planted packed-batch bugs on the NumPy reference: the packed family must fail each, and
the reference pass."""

import dataclasses

import numpy as np

from implementations.numpy.mha import NumpyMHA


def _opened(mask, where):
    """``mask.bias`` with the (B, 1, L, L) entries ``where`` allowed (0 added)."""
    return mask.replace(bias=np.where(where, np.zeros((), mask.bias.dtype), mask.bias))


class IgnoresSequences(NumpyMHA):
    """Packs the tokens and forgets the boundaries: every token sees every token of its row
    (earlier ones only, where causal)."""

    name = "bug.packed_ignores_sequences"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.segments is not None:
            L = q.shape[2]
            earlier = np.tril(np.ones((L, L), bool)) if "causal" in mask.kinds else True
            mask = _opened(mask, earlier & np.ones((1, 1, L, L), bool))
        return super().attend(q, k, v, mask, scale, need_weights)


class BoundaryOneLate(NumpyMHA):
    """Each sequence starts one token late: its first token also sees the previous
    sequence's last (cumulative lengths read one off)."""

    name = "bug.packed_boundary_one_late"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.segments is not None:
            seg = mask.segments
            starts = np.zeros(seg.shape + (seg.shape[1],), bool)  # (B, L, L)
            b, i = np.nonzero(np.diff(seg, axis=1, prepend=seg[:, :1]) > 0)
            starts[b, i, i - 1] = True
            mask = _opened(mask, starts[:, None])
        return super().attend(q, k, v, mask, scale, need_weights)


class PackedDropsCap(NumpyMHA):
    """Soft-capping kept on padded batches and dropped on the packed path (a varlen kernel
    called without the cap)."""

    name = "bug.packed_drops_cap"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.segments is not None and mask.variants is not None:
            mask = mask.replace(variants=dataclasses.replace(mask.variants, softcap=None))
        return super().attend(q, k, v, mask, scale, need_weights)
