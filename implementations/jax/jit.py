"""jax.jit: the plain algorithm in jnp under jax.jit."""

from __future__ import annotations

import jax.numpy as jnp

from implementations.jax.common import JaxCore, masked_softmax, tf32_on_gpu, zero_dead_values
from suite.plugins.declarations import Deviation


class JaxJit(JaxCore):
    name = "jax.jit"
    compile_path = "XLA"  # its kernels are XLA's code, as jax.jit's, jax.nn's and Flax's
    deviations = {"nan_padding": Deviation(
        "confined", "a NaN or inf value at a key masked for some rows but not all reaches those "
                    "rows: their weight there is 0 and 0 * NaN is NaN in weights @ v (values "
                    "masked for every row are zeroed first; measured, special_values cases)"),
        "float32_dots": tf32_on_gpu()}

    def attend(self, q, k, v, mask, scale, need_weights):
        s = (q @ k.swapaxes(-1, -2)) * scale  # (B, H, L, S)
        if mask.bias is not None:
            # Masked logits exactly -inf, even where padded keys hold NaN.
            s = jnp.where(mask.allowed, s + mask.bias, -jnp.inf)
        w = masked_softmax(s).astype(v.dtype)  # softmax in float32; fully masked row -> 0
        return w @ zero_dead_values(v, mask.dead_keys), None  # (B, H, L, D)
