"""Pallas GPU paged attention compiled for a GPU against its own interpreter and a float64
reference, on the suite's paged shapes: B = 3 sequences, one query each, lengths 16, 7 and 1
through a shuffled block table over a page pool, 4 query heads (1 or 2 per kv head) of width
4, 16 and 64, pages of 4 keys (and of 5: its Triton lowering wants powers of two).

Run on a machine with an NVIDIA GPU and jax[cuda]: python repro.py
(on a CPU it runs the interpreter only). It prints, per shape, the largest error per sequence
of the compiled kernel and of the interpreter against the reference.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.gpu import paged_attention as pa

on_gpu = any(d.platform == "gpu" for d in jax.devices())
print("jax", jax.__version__, jax.devices())


def run(dtype, D, H, K, P, lens=(16, 7, 1), T=4, seed=0):
    rng = np.random.default_rng(seed)
    B, N = len(lens), len(lens) * T + 2
    q = rng.standard_normal((B, H, D))
    k_pages = rng.standard_normal((K, N, P, D))
    v_pages = rng.standard_normal((K, N, P, D))
    table = rng.permutation(N)[:B * T].reshape(B, T).astype(np.int32)
    scale = D ** -0.5
    ref = np.zeros((B, H, D))
    for b, n in enumerate(lens):  # the sequence's keys: its pages in table order, n of them
        kk = k_pages[:, table[b]].reshape(K, T * P, D)[:, :n]
        vv = v_pages[:, table[b]].reshape(K, T * P, D)[:, :n]
        for h in range(H):
            s = kk[h // (H // K)] @ q[b, h] * scale
            w = np.exp(s - s.max())
            ref[b, h] = (w / w.sum()) @ vv[h // (H // K)]
    args = [jnp.asarray(a, dtype) for a in ((q * scale), k_pages, v_pages)]
    errs = {}
    for interpret in ([False, True] if on_gpu else [True]):
        try:
            out = pa.paged_attention(args[0], args[1], args[2], jnp.asarray(table),
                                     jnp.asarray(lens, jnp.int32), k_splits=T,
                                     pages_per_compute_block=1, interpret=interpret)
            errs["interpreter" if interpret else "compiled"] = \
                np.abs(np.asarray(out, np.float64) - ref).max(axis=(1, 2)).round(4).tolist()
        except Exception as exc:  # noqa: BLE001 - the library's refusal is the result
            errs["interpreter" if interpret else "compiled"] = \
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    c = errs.get("compiled")
    wrong = isinstance(c, list) and max(c) > 0.1
    print(f"{jnp.dtype(dtype).name:8s} D={D:3d} H={H} K={K} page={P}: "
          + "; ".join(f"{n} {e}" for n, e in errs.items()) + ("  compiled WRONG" if wrong else ""))


for dtype in (jnp.float32, jnp.bfloat16):
    for D in (4, 16, 64):
        run(dtype, D, H=4, K=4, P=4)
        run(dtype, D, H=4, K=2, P=4)
    run(dtype, 16, H=32, K=2, P=4)
    run(dtype, 16, H=4, K=4, P=16)
run(jnp.float32, 16, H=4, K=4, P=5)
