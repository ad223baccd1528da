"""Reproducer: flax.nnx dot_product_attention_weights with is_causal=True and a mask that
broadcasts over the query axis (flax 0.12.8, jax 0.10.2). Needs only NumPy, jax and flax.

The mask (B, 1, 1, S) (key padding, the shape flax's docstring allows: broadcastable to
(batch, heads, q_length, kv_length)) is accepted by nnx.dot_product_attention's fused
path (jax.nn.dot_product_attention) but the explicit path, taken by
nnx.MultiHeadAttention(sow_weights=True) or whenever dropout or a module is given,
broadcasts the (T, S) causal mask to the *mask's* shape instead of the logits' shape:
``jnp.broadcast_to(causal_mask, mask.shape)`` (flax/nnx/nn/attention.py), which fails.
"""
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn.attention import dot_product_attention_weights

B, L, S, H, D = 2, 9, 67, 4, 4
rng = np.random.default_rng(0)
q = jnp.asarray(rng.standard_normal((B, L, H, D)), jnp.float32)  # (batch, q_len, heads, D)
k = jnp.asarray(rng.standard_normal((B, S, H, D)), jnp.float32)
padding = jnp.asarray(np.arange(S)[None, None, None, :] < np.array([36, 50])[:, None, None,
                                                                            None])  # (B, 1, 1, S)

fused = nnx.dot_product_attention(q, k, k, mask=padding, is_causal=True)
print("fused path (jax.nn):", fused.shape)
try:
    w = dot_product_attention_weights(q, k, mask=padding, is_causal=True)
    print("explicit path:", w.shape)
except ValueError as exc:
    print("explicit path raises:", str(exc).splitlines()[0])
