"""Planted libraries on torch arrays (NumPy inside) that zero a NaN query row: where the known
behaviour torch-sdpa-nan-query-short-keys holds (fewer keys than one vector, no attn_mask) the
case is a checked known failure; at more keys, or with another row also wrong, it fails."""

import numpy as np

from implementations.numpy_mha import NumpyMHA


class _OnTorch(NumpyMHA):
    framework = "torch"  # the known behaviour is a torch library's: it applies to this plugin

    def isa(self, device):
        return "avx2"  # 8 float32 lanes: the behaviour holds below 8 keys

    def framework_version(self) -> str:
        return "planted"


class ZeroNanQueryRows(_OnTorch):
    """Zeroes NaN head-output rows at every key length (the behaviour beyond its condition)."""

    name = "bug.nan_query_zero"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, need_weights)
        bad = ~np.isfinite(heads).all(axis=-1, keepdims=True)
        return np.where(bad, 0.0, heads).astype(heads.dtype), weights


class ZeroAndShift(ZeroNanQueryRows):
    """Zeroes the NaN row and also shifts row 0 of every head: a second bug in the same case."""

    name = "bug.nan_query_zero_and_shift"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, need_weights)
        heads = heads.copy()
        heads[:, :, 0] += 1e-2
        return heads, weights
