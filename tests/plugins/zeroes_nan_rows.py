"""Planted bug: a kernel that zeroes non-finite output rows (nan_to_num on the head output),
hiding NaN that a NaN query, key or value must give."""

import numpy as np

from implementations.numpy.mha import NumpyMHA


class ZeroesNanRows(NumpyMHA):
    name = "bug.zeroes_nan_rows"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, need_weights)
        bad = ~np.isfinite(heads).all(axis=-1, keepdims=True)  # (B, H, L, 1)
        return np.where(bad, 0.0, heads).astype(heads.dtype), weights
