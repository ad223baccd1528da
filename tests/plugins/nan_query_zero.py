"""Planted libraries on torch arrays that zero a NaN query row. The known behaviour
torch-sdpa-nan-query-short-keys is a behaviour of torch's CPU flash SDPA kernel called
without an attn_mask: where its conditions hold (fewer keys than one vector, no mask) and the
plugin's call reaches that kernel so, the case is a checked known failure; at more keys, with
another row also wrong, or on a path that never calls the kernel, it fails."""

import numpy as np

from implementations.numpy.mha import NumpyMHA


class _OnTorch(NumpyMHA):
    framework = "torch"  # the known behaviour is a torch library's: it may apply to this plugin

    def isa(self, device):
        return "avx2"  # 8 float32 lanes: the behaviour holds below 8 keys

    def framework_version(self) -> str:
        return "planted"


class UnfusedZeroNanQueryRows(_OnTorch):
    """Zeroes NaN head-output rows on its own path (NumPy matmuls and a softmax): it never
    calls the SDPA kernel, so the known behaviour is not its excuse."""

    name = "bug.nan_query_zero_unfused"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, need_weights)
        bad = ~np.isfinite(heads).all(axis=-1, keepdims=True)
        return np.where(bad, 0.0, heads).astype(heads.dtype), weights


class ZeroNanQueryRows(UnfusedZeroNanQueryRows):
    """Calls torch's SDPA kernel (no attn_mask when the problem has no mask) and zeroes NaN
    head-output rows at every key length (the behaviour beyond its condition)."""

    name = "bug.nan_query_zero"

    def attend(self, q, k, v, mask, scale, need_weights):
        import torch

        if mask.bias is None:  # the kernel the behaviour belongs to, called as it shows it
            torch.nn.functional.scaled_dot_product_attention(
                *(torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v)), scale=scale)
        return super().attend(q, k, v, mask, scale, need_weights)


class ZeroAndShift(ZeroNanQueryRows):
    """Zeroes the NaN row and also shifts row 0 of every head: a second bug in the same case."""

    name = "bug.nan_query_zero_and_shift"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, need_weights)
        heads = heads.copy()
        heads[:, :, 0] += 1e-2
        return heads, weights
