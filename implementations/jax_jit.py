"""jax.jit: the plain algorithm in jnp under jax.jit."""

from __future__ import annotations

import jax.numpy as jnp

from implementations.jax_common import JaxCore, masked_softmax, zero_dead_values


class JaxJit(JaxCore):
    name = "jax.jit"

    def attend(self, q, k, v, mask, scale, need_weights):
        s = (q @ k.swapaxes(-1, -2)) * scale  # (B, H, L, S)
        if mask.bias is not None:
            # Masked logits exactly -inf, even where padded keys hold NaN.
            s = jnp.where(mask.allowed, s + mask.bias, -jnp.inf)
        w = masked_softmax(s).astype(v.dtype)  # softmax in float32; fully masked row -> 0
        return w @ zero_dead_values(v, mask.dead_keys), None  # (B, H, L, D)
