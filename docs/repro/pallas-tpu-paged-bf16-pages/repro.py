"""Reproducer: JAX's Pallas TPU paged attention
(jax.experimental.pallas.ops.tpu.paged_attention, jax 0.10.2) given float32 key/value pages
reads them at bfloat16 precision: each loaded page goes through
``MultiPageAsyncCopyDescriptor._maybe_dequantize``, whose default dtype is bfloat16 also
when the pages are not quantized. The float32 output matches attention over the pages
rounded to bfloat16 (to float32 rounding), not over the float32 pages it was given.

Run: python repro.py   (CPU, TPU interpret mode; no TPU needed)
"""
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

rng = np.random.default_rng(0)
B, H, K, D, P, N, T = 3, 4, 2, 8, 4, 12, 4  # batch, heads, kv heads, head width, page, pool
q = rng.standard_normal((B, H, D)).astype(np.float32)
k_pages, v_pages = (rng.standard_normal((K, N, P, D)).astype(np.float32) for _ in range(2))
lengths = np.array([13, 5, 1], np.int32)
table = rng.permutation(N)[:B * T].reshape(B, T).astype(np.int32)


def attention(kp, vp):
    """float64 attention of each sequence's one query over its pages, through the table."""
    out = np.zeros((B, H, D))
    for b in range(B):
        k = kp[:, table[b]].reshape(K, T * P, D)[:, :lengths[b]].astype(np.float64)
        v = vp[:, table[b]].reshape(K, T * P, D)[:, :lengths[b]].astype(np.float64)
        for h in range(H):
            s = q[b, h].astype(np.float64) @ k[h // (H // K)].T
            w = np.exp(s - s.max())
            out[b, h] = (w / w.sum()) @ v[h // (H // K)]
    return out


with pltpu.force_tpu_interpret_mode():
    got = np.asarray(paged_attention(jnp.asarray(q), jnp.asarray(k_pages), jnp.asarray(v_pages),
                                     jnp.asarray(lengths), jnp.asarray(table),
                                     pages_per_compute_block=1))
bf16 = [a.astype(ml_dtypes.bfloat16).astype(np.float32) for a in (k_pages, v_pages)]
print(f"float32 pages: max error vs attention over the float32 pages "
      f"{np.abs(got - attention(k_pages, v_pages)).max():.2e}")
print(f"float32 pages: max error vs attention over the pages rounded to bfloat16 "
      f"{np.abs(got - attention(*bf16)).max():.2e}")
