"""A blocked online-softmax kernel in NumPy (FlashAttention's loop over key blocks), the base
of the planted tile bugs; ``Blocked`` itself is right (its tests pass the tiles family)."""

from __future__ import annotations

import numpy as np

from implementations.numpy.mha import NumpyCore
from suite.plugins.declarations import Deviation


class Blocked(NumpyCore):
    name = "bug.blocked_reference"
    block = 64  # keys per block
    deviations = {"nan_padding": Deviation("confined", "0 * NaN in p @ v for a NaN value masked "
                                                       "for some rows of its block")}

    def blocks(self, S: int) -> range:
        """Start of every key block."""
        return range(0, S, self.block)

    def block_max(self, s: np.ndarray, m: np.ndarray) -> np.ndarray:
        """The running row max after block scores ``s``; a fully masked block keeps -inf rows
        at a usable 0 so exp(s - m) stays exp(-inf) = 0."""
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        return np.where(np.isneginf(m_new), 0.0, m_new)

    def attend(self, q, k, v, mask, scale, need_weights):
        B, H, L, D = q.shape
        S = k.shape[2]
        bias = None if mask.bias is None else np.broadcast_to(mask.bias, (B, H, L, S))
        m = np.full((B, H, L, 1), -np.inf, q.dtype)  # running max
        denom = np.zeros((B, H, L, 1), q.dtype)  # running sum of exp
        acc = np.zeros((B, H, L, D), q.dtype)  # running weights @ v
        for j0 in self.blocks(S):
            j1 = min(j0 + self.block, S)
            s = (q @ k[:, :, j0:j1].transpose(0, 1, 3, 2)) * scale  # (B, H, L, block)
            if bias is not None:
                s = np.where(np.isneginf(bias[..., j0:j1]), -np.inf, s + bias[..., j0:j1])
            m_new = self.block_max(s, m)
            p = np.exp(s - m_new)  # (B, H, L, block)
            vb = v[:, :, j0:j1]
            if bias is not None:  # values no row may attend (padding) never enter the sum
                vb = np.where(np.isneginf(bias[..., j0:j1]).all(axis=-2)[..., None], 0, vb)
            shrink = np.where(np.isneginf(m), 0.0, np.exp(m - m_new))  # (B, H, L, 1)
            acc = acc * shrink + p @ vb
            denom = denom * shrink + p.sum(axis=-1, keepdims=True)
            m = m_new
        # No key at all: zero; a NaN sum (a NaN or +inf logit) stays NaN.
        heads = np.where(denom == 0, 0.0, acc / np.where(denom == 0, 1, denom))  # (B, H, L, D)
        return heads.astype(q.dtype), None
