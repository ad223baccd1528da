"""A user's Flax linen attention module with ``nn.DenseGeneral`` projections (per-head
kernels (E, H, D) and an output kernel (H, D, E), as linen's own attention and many linen
models have them) around ``jax.nn.dot_product_attention``."""

import flax.linen as nn
import jax


class MyLinenAttention(nn.Module):
    num_heads: int
    bias: bool = True

    @nn.compact
    def __call__(self, query, key, value, mask=None):
        """query (B, L, E), key/value (B, S, E); mask bool (B, 1|H, L, S), True = attend."""
        E = query.shape[-1]
        D = E // self.num_heads

        def heads(name, x):  # (B, T, E) -> (B, T, H, D)
            return nn.DenseGeneral((self.num_heads, D), use_bias=self.bias, name=name)(x)

        q, k, v = heads("query", query), heads("key", key), heads("value", value)
        out = jax.nn.dot_product_attention(q, k, v, mask=mask)  # (B, L, H, D)
        return nn.DenseGeneral(E, axis=(-2, -1), use_bias=self.bias, name="out")(out)
