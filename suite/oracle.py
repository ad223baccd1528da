"""The float64 oracle: the spec of MHA written as plainly as NumPy allows.

Also the "naive_t" baseline of the agreement rule: the same plain algorithm with
every intermediate rounded to a lower precision dtype t (float32, float16,
bfloat16), accumulating matmuls in float32 as hardware does.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import numpy as np

from suite.problem import Problem


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to dtype's precision (returned as float64)."""
    if dtype == "float64":
        return np.asarray(x, dtype=np.float64)
    if dtype in ("float32", "float16"):
        return np.asarray(x).astype(dtype).astype(np.float64)
    if dtype == "bfloat16":
        # bfloat16 = the top 16 bits of float32, rounded to nearest even.
        f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
        bits = f.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = bits.astype(np.uint32).view(np.float32).astype(np.float64)
        return np.where(np.isfinite(f), out, f.astype(np.float64))
    raise ValueError(f"dtype: expected one of float64, float32, float16, bfloat16, got {dtype!r}")


def attention(p: Problem, rnd: Optional[Callable[[np.ndarray], np.ndarray]] = None,
              ) -> Tuple[np.ndarray, np.ndarray]:
    """Return (output (B, L, E), attention weights (B, H, L, S)) in float64.

    ``rnd`` rounds every intermediate (identity for the oracle).
    """
    r = rnd or (lambda a: a)
    B, L, S, H, K, D = p.B, p.L, p.S, p.H, p.K, p.D
    w = {k: (None if v is None else r(v)) for k, v in p.weights.as_dict().items()}
    query, key, value = r(p.query), r(p.key), r(p.value)

    def project(x: np.ndarray, wm: np.ndarray, b: Optional[np.ndarray]) -> np.ndarray:
        y = r(x @ wm)
        return y if b is None else r(y + b)

    q = project(query, w["w_q"], w["b_q"]).reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
    k = project(key, w["w_k"], w["b_k"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
    v = project(value, w["w_v"], w["b_v"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
    # GQA: query head h reads kv head h // (H // K).
    k = np.repeat(k, H // K, axis=1)  # (B, H, S, D)
    v = np.repeat(v, H // K, axis=1)  # (B, H, S, D)
    allowed = p.mask.dense_allowed(B, H, L, S)  # (B, H, L, S)
    logits = r(r(q @ k.transpose(0, 1, 3, 2)) * p.effective_scale)  # (B, H, L, S)
    if p.mask.bias is not None:
        logits = r(logits + p.mask.bias)
    # Masked logits are dropped (not merely -inf), so NaN in padded keys cannot leak.
    logits = np.where(allowed, logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True)  # (B, H, L, 1)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # fully masked row: no max
    e = r(np.exp(logits - row_max))  # masked entries: exp(-inf) = 0
    total = r(e.sum(axis=-1, keepdims=True))
    # A fully masked query row has no key to attend: its weights and head output are 0.
    weights = np.where(total > 0, r(e / np.where(total > 0, total, 1.0)), 0.0)  # (B, H, L, S)
    # Keys no query may attend (padding) must not poison the sum: 0 * NaN is NaN.
    v = np.where(allowed.any(axis=2)[..., None], v, 0.0)  # (B, H, S, D)
    heads = r(np.einsum("bhls,bhsd->bhld", weights, v))  # (B, H, L, D)
    concat = heads.transpose(0, 2, 1, 3).reshape(B, L, H * D)  # (B, L, H*D)
    out = project(concat, w["w_o"], w["b_o"])  # (B, L, E)
    return out, weights


def oracle(p: Problem) -> Tuple[np.ndarray, np.ndarray]:
    """Float64 output and attention weights of problem ``p``."""
    return attention(p)


def naive(p: Problem, dtype: str) -> Tuple[np.ndarray, np.ndarray]:
    """The plain algorithm in ``dtype``: every intermediate rounded to it."""
    return attention(p, None if dtype == "float64" else (lambda a: round_to(a, dtype)))
