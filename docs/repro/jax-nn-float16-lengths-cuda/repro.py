"""jax.nn.dot_product_attention in float16 on a GPU for one query row per head (a decode step)
against a 16-slot cache: plain, with key_value_seq_lengths, with a boolean mask, with the mask
and a float16 bias (the suite's decode call), as many kv heads as query heads or half as many,
head widths 4 and 16, under jax.jit: which calls compile, and how far each is from a float64
reference. Several rows and bfloat16 beside it for comparison.

Run on a machine with an NVIDIA GPU and jax[cuda]: python repro.py
"""
import jax
import jax.numpy as jnp
import numpy as np

print("jax", jax.__version__, jax.devices())


def run(dtype, D, Lq, how, K=4, S=16, H=4, B=3):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, Lq, H, D))
    k = rng.standard_normal((B, S, K, D))
    v = rng.standard_normal((B, S, K, D))
    lens = np.array([16, 7, 1][:B])
    keep = np.arange(S)[None, :] < lens[:, None]  # (B, S)
    bias = np.where(keep, rng.standard_normal((B, S)) * 0.1, 0.0)
    kw = {}
    if how == "lengths":
        kw["key_value_seq_lengths"] = jnp.asarray(lens, jnp.int32)
    if how in ("mask", "mask+bias"):
        kw["mask"] = jnp.asarray(np.broadcast_to(keep[:, None, None], (B, 1, Lq, S)))
    if how == "mask+bias":
        kw["bias"] = jnp.asarray(np.broadcast_to(bias[:, None, None], (B, 1, Lq, S)), dtype)
    try:
        call = jax.jit(lambda a, b, c: jax.nn.dot_product_attention(a, b, c, **kw))
        got = np.asarray(call(*(jnp.asarray(a, dtype) for a in (q, k, v))), np.float64)
        ref = np.zeros_like(got)
        n = lens if how != "plain" else np.full(B, S)
        for b in range(B):
            for h in range(H):
                kh = h // (H // K)
                s = q[b, :, h] @ k[b, :n[b], kh].T / np.sqrt(D)
                if how == "mask+bias":
                    s = s + bias[b, :n[b]]
                w = np.exp(s - s.max(-1, keepdims=True))
                ref[b, :, h] = (w / w.sum(-1, keepdims=True)) @ v[b, :n[b], kh]
        res = f"ok, max error {np.abs(got - ref).max():.4f}"
    except Exception as exc:  # noqa: BLE001 - the library's answer is the result
        res = f"{type(exc).__name__}: {str(exc).splitlines()[0][:110]}"
    print(f"{jnp.dtype(dtype).name:8s} D={D:2d} Lq={Lq} H={H} K={K} {how:9s}: {res}")


for dtype in (jnp.float16, jnp.bfloat16):
    for how in ("plain", "lengths", "mask", "mask+bias"):
        for D in (4, 16):
            run(dtype, D, 1, how)
        run(dtype, 4, 1, how, K=2)
        run(dtype, 4, 4, how)
