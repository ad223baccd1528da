"""Pallas GPU decode attention compiled for a GPU against its own interpreter and a float64
reference, on the suite's decode/one_row shape: B = 3 sequences, one query each, a 16-slot
cache filled to 16, 7 and 1 keys, 4 query heads of width 4 (and 2 kv heads: the gqa case).

Run on a machine with an NVIDIA GPU and jax[cuda]: python repro.py
It prints, per variant, the largest error of the compiled kernel and of the interpreter
against the reference, and whether the kernel is right sequence by sequence when each is
called alone (B = 1): that separates a per-batch length read wrongly from a kernel that is
wrong at these sizes, and head width 4 from 16.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.gpu import decode_attention as da

on_gpu = any(d.platform == "gpu" for d in jax.devices())
print("jax", jax.__version__, jax.devices())


def reference(q, k, v, lens, scale):  # q (B, H, D); k, v (B, S, K, D); float64
    B, H, D = q.shape
    K = k.shape[2]
    out = np.zeros((B, H, D))
    for b in range(B):
        for h in range(H):
            kk, vv = k[b, :lens[b], h // (H // K)], v[b, :lens[b], h // (H // K)]
            s = kk @ q[b, h] * scale
            w = np.exp(s - s.max())
            out[b, h] = (w / w.sum()) @ vv
    return out


def run(dtype, D, K, lens, S=16, H=4, seed=0):
    rng = np.random.default_rng(seed)
    B = len(lens)
    q = rng.standard_normal((B, H, D))
    k = rng.standard_normal((B, S, K, D))
    v = rng.standard_normal((B, S, K, D))
    scale = D ** -0.5
    ref = reference(q, k, v, lens, scale)
    args = [jnp.asarray(a, dtype) for a in (q, k, v)]
    kv_len = jnp.asarray(lens, jnp.int32)
    errs = {}
    for interpret in ([False, True] if on_gpu else [True]):
        out = da.gqa(*args, kv_seq_len=kv_len, sm_scale=scale, k_splits=S // 16,
                     interpret=interpret)
        errs["interpreter" if interpret else "compiled"] = \
            np.abs(np.asarray(out, np.float64) - ref).max(axis=(1, 2)).round(4).tolist()
    alone = []
    for b in range(B):
        out = da.gqa(*(a[b:b + 1] for a in args), kv_seq_len=kv_len[b:b + 1],
                     sm_scale=scale, k_splits=S // 16, interpret=not on_gpu)
        alone.append(round(float(np.abs(np.asarray(out, np.float64)[0] - ref[b]).max()), 4))
    wrong = max(errs.get("compiled", [0.0])) > 0.1
    print(f"{jnp.dtype(dtype).name:8s} D={D:3d} K={K} lens={lens}: max error per sequence "
          + ", ".join(f"{n} {e}" for n, e in errs.items()) + f"; each sequence alone {alone}"
          + ("  compiled kernel WRONG" if wrong else ""))


for dtype in (jnp.float32, jnp.bfloat16):
    for D in (4, 16, 64):
        run(dtype, D, K=4, lens=[16, 7, 1])
        run(dtype, D, K=2, lens=[16, 8, 2])
