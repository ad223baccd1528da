"""Only an attention core: the suite's NumPy adapter does projections, heads and masks."""

import numpy as np

from implementations.numpy.mha import NumpyCore


class MyKernel(NumpyCore):
    name = "mine.kernel"

    def attend(self, q, k, v, mask, scale, need_weights):
        # q (B, H, L, D), k and v (B, H, S, D); mask.bias (B, H|1, L, S) with -inf where
        # masked, or None (suite.plugins.adapters.AttendMask).
        bias = mask.bias
        s = q @ k.swapaxes(-1, -2) * scale  # (B, H, L, S)
        if bias is not None:  # masked scores exactly -inf, even where padded keys hold NaN
            s = np.where(np.isneginf(bias), -np.inf, s + bias)
        top = s.max(-1, keepdims=True)
        p = np.exp(s - np.where(np.isfinite(top), top, 0))
        total = p.sum(-1, keepdims=True)
        p = p / np.where(total > 0, total, 1)
        if bias is not None:  # padded value rows may hold NaN: 0 * NaN is NaN
            v = np.where(np.isneginf(bias).all(-2)[..., None], 0, v)
        return p @ v, None
