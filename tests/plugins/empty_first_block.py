"""Planted bug: a blocked kernel that forgets a fully masked key block leaves the running max
at -inf, so exp(-inf - -inf) is NaN; rows with no key at all are zeroed up front, which is
all the short masked cases exercise."""

import numpy as np

from tests.plugins.blocked import Blocked


class EmptyFirstBlock(Blocked):
    name = "bug.empty_first_block"

    def block_max(self, s, m):
        return np.maximum(m, s.max(axis=-1, keepdims=True))  # -inf stays -inf

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, _ = super().attend(q, k, v, mask, scale, need_weights)
        if mask.bias is not None:  # rows with no key to attend: the spec's zero, up front
            dead = np.isneginf(np.broadcast_to(mask.bias, q.shape[:3] + (k.shape[2],))).all(-1)
            heads = np.where(dead[..., None], 0.0, heads)
        with np.errstate(invalid="ignore"):
            return heads.astype(q.dtype), None
