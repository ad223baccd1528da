"""Reproducer: JAX's Pallas TPU FlashAttention (jax.experimental.pallas.ops.tpu.flash_attention,
jax 0.10.2) with an additive mask ``ab`` that is -inf over a row's whole first key block (128
keys) while later blocks keep keys: the row comes out NaN. The kernel's running max over the
first block stays -inf, and its rescale exp(m_prev - m_new) = exp(-inf - -inf) is NaN. The
same row with -1e9 instead of -inf (a finite mask value) gives the right answer.

Run: python repro.py   (CPU, TPU interpret mode; no TPU needed)
"""
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as fa

rng = np.random.default_rng(0)
B, H, L, S, D = 1, 1, 8, 256, 16
q, k, v = (rng.standard_normal((B, H, n, D)).astype(np.float32) for n in (L, S, S))
blocks = fa.BlockSizes(block_q=L, block_k_major=128, block_k=128, block_b=1)
for fill in (-1e9, -np.inf):
    ab = np.zeros((B, H, L, S), np.float32)
    ab[:, :, 0, :128] = fill  # row 0 may attend only keys 128..255: its first block is masked
    with pltpu.force_tpu_interpret_mode():
        out = np.asarray(fa.flash_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                            jnp.asarray(ab), None, sm_scale=0.25,
                                            block_sizes=blocks))
    w = np.exp(0.25 * (q[0, 0, 0] @ k[0, 0, 128:].T))
    ref = (w / w.sum()) @ v[0, 0, 128:]
    print(f"first block masked with {fill}: row 0 NaN: {bool(np.isnan(out[0, 0, 0]).any())}, "
          f"max error vs reference {np.nanmax(np.abs(out[0, 0, 0] - ref)):.2e}")
