"""Reproducer: JAX's Pallas GPU FlashAttention (jax.experimental.pallas.ops.gpu.attention.mha,
jax 0.10.2) with causal=True and more queries than keys (Lq > Lk) reads key blocks past the end
of k and v: its causal loop bound ceil(block_q * (i + 1) / block_k) ignores kv_seq_len. Pallas's
interpreter fills out-of-bounds reads with NaN, so every row comes out NaN; on a GPU the read
is outside the buffer. Lq <= Lk gives the right answer.

Run: python repro.py   (CPU, interpret=True; no GPU needed)
"""
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.gpu import attention


def reference(q, k, v, scale):  # causal, top left: query i sees keys j <= i
    s = np.einsum("blhd,bshd->bhls", q, k) * scale  # (B, H, L, S)
    L, S = s.shape[-2:]
    s = np.where(np.arange(S)[None, :] <= np.arange(L)[:, None], s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhls,bshd->blhd", w / w.sum(-1, keepdims=True), v)  # (B, L, H, D)


rng = np.random.default_rng(0)
for L, S in ((7, 12), (12, 7)):
    q = rng.standard_normal((1, L, 2, 16)).astype(np.float32)  # (B, L, H, D)
    k, v = (rng.standard_normal((1, S, 2, 16)).astype(np.float32) for _ in range(2))
    out = attention.mha(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), None, sm_scale=0.25,
                        causal=True, interpret=True)
    err = np.abs(np.asarray(out) - reference(q, k, v, 0.25)).max()
    print(f"Lq={L} Lk={S}: max error {err:.3g}", "WRONG" if not err < 1e-5 else "ok")
