"""A user's JAX attention module, as many Flax projects have one: four ``nn.Dense``
projections around ``jax.nn.dot_product_attention``."""

import flax.linen as nn
import jax


class MyJaxAttention(nn.Module):
    num_heads: int
    bias: bool = True

    @nn.compact
    def __call__(self, query, key, value, mask=None):
        """query (B, L, E), key/value (B, S, E); mask bool (B, 1|H, L, S), True = attend."""
        E = query.shape[-1]

        def heads(name, x):  # (B, T, E) -> (B, T, H, D), the layout jax.nn takes
            return nn.Dense(E, use_bias=self.bias, name=name)(x).reshape(
                *x.shape[:2], self.num_heads, -1)

        q, k, v = heads("q_proj", query), heads("k_proj", key), heads("v_proj", value)
        out = jax.nn.dot_product_attention(q, k, v, mask=mask)  # (B, L, H, D)
        return nn.Dense(E, use_bias=self.bias, name="out_proj")(out.reshape(query.shape))
