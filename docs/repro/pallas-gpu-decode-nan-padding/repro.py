"""Reproducer: JAX's Pallas GPU decode attention (jax.experimental.pallas.ops.gpu.decode_attention
.gqa, jax 0.10.2) with key lengths through kv_seq_len: NaN in the keys or values past a
sequence's length reaches its output when the length ends inside one of the kernel's key
splits. The kernel adds a finite 0.7 * finfo.min to the scores of keys past the length, so a
NaN key gives a NaN score (NaN + finite), and a NaN value gets weight exp(-huge) = 0 and
0 * NaN = NaN in p @ v. Splits wholly past the length are skipped, so a length on a split
boundary is unaffected. Keys past the length are padding: the spec says they must not change
the output.

Run: python repro.py   (CPU, Pallas interpret mode; no GPU needed)
"""
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.gpu import decode_attention as da

rng = np.random.default_rng(0)
B, H, K, S, D, splits = 3, 4, 2, 304, 16, 16  # 16 splits of 19 keys
lens = np.array([37, 152, 304])  # 37 inside split 1 (19..37); 152 = 8 x 19, a boundary; none
q = rng.standard_normal((B, H, D)).astype(np.float32)
k, v = (rng.standard_normal((B, S, K, D)).astype(np.float32) for _ in range(2))
for where in ("none", "keys", "values"):
    kp, vp = k.copy(), v.copy()
    for b, n in enumerate(lens):
        if where == "keys":
            kp[b, n:] = np.nan  # padding no query attends
        if where == "values":
            vp[b, n:] = np.nan
    out = da.gqa(jnp.asarray(q), jnp.asarray(kp), jnp.asarray(vp), kv_seq_len=jnp.asarray(lens),
                 sm_scale=D ** -0.5, k_splits=splits, interpret=True)  # (B, H, D)
    nan = np.isnan(np.asarray(out)).any(axis=(1, 2))
    print(f"NaN in the padded {where:6}: output NaN per sequence (lengths {lens.tolist()}): "
          f"{nan.tolist()}")
