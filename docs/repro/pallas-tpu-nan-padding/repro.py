"""Reproducer: JAX's Pallas TPU FlashAttention (jax.experimental.pallas.ops.tpu.flash_attention,
jax 0.10.2) with key padding through SegmentIds: NaN in the padded values reaches every row of
that batch item, although no query may attend a padded key. The kernel masks scores with a
finite DEFAULT_MASK_VALUE, so a masked key gets weight exp(-huge) = 0, and 0 * NaN = NaN in
p @ v. Values past the length are padding: the spec says they must not change the output.

Run: python repro.py   (CPU, TPU interpret mode; no TPU needed)
"""
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as fa

rng = np.random.default_rng(0)
B, H, L, S, D, valid = 1, 1, 8, 128, 16, 100
q, k, v = (rng.standard_normal((B, H, n, D)).astype(np.float32) for n in (L, S, S))
seg = fa.SegmentIds(q=jnp.zeros((B, L), jnp.int32),
                    kv=jnp.asarray((np.arange(S) >= valid)[None].astype(np.int32)))  # (B, S)
blocks = fa.BlockSizes(block_q=L, block_k_major=128, block_k=128, block_b=1)
for fill in (0.0, np.nan):
    v_padded = v.copy()
    v_padded[:, :, valid:] = fill  # padding no query attends
    with pltpu.force_tpu_interpret_mode():
        out = fa.flash_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v_padded), None,
                                 seg, sm_scale=0.25, block_sizes=blocks)
    print(f"padding filled with {fill}: NaN in {int(np.isnan(np.asarray(out)).any(-1).sum())} "
          f"of {L} rows")
