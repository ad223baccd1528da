"""Float64 gradients of the spec: d sum(out * g) / d(inputs, weights), by hand.

``naive_grads(p, dtype)`` is the same backward pass with every intermediate
rounded to dtype, the baseline of the gradient agreement rule (k = 3).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np

from suite.oracle import round_to
from suite.problem import Problem, cotangent


def grads(p: Problem, rnd: Optional[Callable[[np.ndarray], np.ndarray]] = None
          ) -> Dict[str, np.ndarray]:
    r = rnd or (lambda a: a)
    B, L, S, H, K, D, G = p.B, p.L, p.S, p.H, p.K, p.D, p.H // p.K
    w = {k: (None if v is None else r(v)) for k, v in p.weights.as_dict().items()}
    query, key, value = r(p.query), r(p.key), r(p.value)
    g = r(cotangent(p))  # (B, L, E)

    def project(x, wm, b):
        y = r(x @ wm)
        return y if b is None else r(y + b)

    # Forward, keeping what the backward needs.
    q = project(query, w["w_q"], w["b_q"]).reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
    k = project(key, w["w_k"], w["b_k"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
    v = project(value, w["w_v"], w["b_v"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
    k = np.repeat(k, G, axis=1)  # (B, H, S, D)
    v = np.repeat(v, G, axis=1)  # (B, H, S, D)
    allowed = p.mask.dense_allowed(B, H, L, S)  # (B, H, L, S)
    scale = p.effective_scale
    logits = r(r(q @ k.transpose(0, 1, 3, 2)) * scale)  # (B, H, L, S)
    if p.mask.bias is not None:
        logits = r(logits + p.mask.bias)
    logits = np.where(allowed, logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = r(np.exp(logits - row_max))
    total = r(e.sum(axis=-1, keepdims=True))
    P = np.where(total > 0, r(e / np.where(total > 0, total, 1.0)), 0.0)  # (B, H, L, S)
    used = allowed.any(axis=2)[..., None]  # (B, H, S, 1): keys some query may attend
    v = np.where(used, v, 0.0)
    heads = r(P @ v)  # (B, H, L, D)
    concat = heads.transpose(0, 2, 1, 3).reshape(B, L, H * D)  # (B, L, H*D)

    # Backward.
    out: Dict[str, np.ndarray] = {}
    out["w_o"] = r(np.einsum("blh,ble->he", concat, g))  # (H*D, E)
    if w["b_o"] is not None:
        out["b_o"] = r(g.sum(axis=(0, 1)))
    d_heads = r(g @ w["w_o"].T).reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
    d_P = r(d_heads @ v.transpose(0, 1, 3, 2))  # (B, H, L, S)
    d_v = np.where(used, r(P.transpose(0, 1, 3, 2) @ d_heads), 0.0)  # (B, H, S, D)
    # Softmax backward: dlogits = P * (dP - sum(dP * P)); masked entries have P = 0.
    d_logits = r(P * r(d_P - r((d_P * P).sum(axis=-1, keepdims=True))))  # (B, H, L, S)
    d_q = r(r(d_logits @ k) * scale)  # (B, H, L, D)
    d_k = r(r(d_logits.transpose(0, 1, 3, 2) @ q) * scale)  # (B, H, S, D)
    # GQA: the G query heads sharing a kv head add their gradients.
    d_k = r(d_k.reshape(B, K, G, S, D).sum(axis=2))  # (B, K, S, D)
    d_v = r(d_v.reshape(B, K, G, S, D).sum(axis=2))  # (B, K, S, D)

    for name, x, dx, n, length in (("q", query, d_q, H, L), ("k", key, d_k, K, S),
                                    ("v", value, d_v, K, S)):
        d_proj = dx.transpose(0, 2, 1, 3).reshape(B, length, n * D)  # (B, length, n*D)
        out[f"w_{name}"] = r(np.einsum("ble,blh->eh", x, d_proj))  # (E, n*D)
        if w[f"b_{name}"] is not None:
            out[f"b_{name}"] = r(d_proj.sum(axis=(0, 1)))
        out[{"q": "query", "k": "key", "v": "value"}[name]] = r(d_proj @ w[f"w_{name}"].T)
    return out


def naive_grads(p: Problem, dtype: str) -> Dict[str, np.ndarray]:
    return grads(p, None if dtype == "float64" else (lambda a: round_to(a, dtype)))
