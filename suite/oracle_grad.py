"""Gradients of the spec, d sum(out * g) / d(inputs, weights), by hand, from the forward's
intermediates (``suite.oracle.forward``).

``grads(p)`` is the float64 oracle; ``naive_grads(p, dtype)`` the same backward pass in
dtype t, in every reduction order, the baselines of the gradient agreement rule (k = 3).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from suite.oracle import EXACT, ORDERS, Arithmetic, forward
from suite.problem import Problem, cotangent


def grads(p: Problem, ar: Arithmetic = EXACT) -> Dict[str, np.ndarray]:
    """Gradients of sum(out * cotangent(p)) for every input and weight, in arithmetic ``ar``."""
    r = ar.r
    B, L, S, H, K, D, E, G = p.B, p.L, p.S, p.H, p.K, p.D, p.E, p.H // p.K
    f = forward(p, ar)
    x, w, q, k, v, P = f["x"], f["w"], f["q"], f["k"], f["v"], f["weights"]
    scale = ar.acc(p.effective_scale)
    g = r(cotangent(p))  # (B, L, E)

    out: Dict[str, np.ndarray] = {}
    out["w_o"] = ar.matmul(f["concat"].reshape(B * L, H * D).T, g.reshape(B * L, E))  # (H*D, E)
    if w["b_o"] is not None:
        out["b_o"] = ar.sum(g.reshape(B * L, E), axis=0)[0]  # (E,)
    d_heads = ar.matmul(g, w["w_o"].T).reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
    d_P = ar.matmul(d_heads, v.transpose(0, 1, 3, 2))  # (B, H, L, S)
    d_v = np.where(f["used"], ar.matmul(P.transpose(0, 1, 3, 2), d_heads), 0.0)  # (B, H, S, D)
    # Softmax backward: dlogits = P * (dP - sum(dP * P)); masked entries have P = 0.
    d_logits = r(P * r(d_P - ar.sum(r(d_P * P), axis=-1)))  # (B, H, L, S)
    d_q = r(ar.matmul(d_logits, k) * scale)  # (B, H, L, D)
    d_k = r(ar.matmul(d_logits.transpose(0, 1, 3, 2), q) * scale)  # (B, H, S, D)
    # GQA: the G query heads sharing a kv head add their gradients.
    d_k = ar.sum(d_k.reshape(B, K, G, S, D), axis=2)[:, :, 0]  # (B, K, S, D)
    d_v = ar.sum(d_v.reshape(B, K, G, S, D), axis=2)[:, :, 0]  # (B, K, S, D)

    for name, inp, dx, n, length in (("q", "query", d_q, H, L), ("k", "key", d_k, K, S),
                                      ("v", "value", d_v, K, S)):
        d_proj = dx.transpose(0, 2, 1, 3).reshape(B * length, n * D)  # (B*length, n*D)
        out[f"w_{name}"] = ar.matmul(x[inp].reshape(B * length, E).T, d_proj)  # (E, n*D)
        if w[f"b_{name}"] is not None:
            out[f"b_{name}"] = ar.sum(d_proj, axis=0)[0]  # (n*D,)
        out[inp] = ar.matmul(d_proj, w[f"w_{name}"].T).reshape(B, length, E)  # (B, length, E)
    return {n: np.asarray(a, dtype=np.float64) for n, a in out.items()}


def naive_grads(p: Problem, dtype: str, dots: Optional[str] = None
                ) -> List[Dict[str, np.ndarray]]:
    """The backward pass in ``dtype``, once per reduction order; ``dots``: how float32
    products take their operands (``suite.oracle.DOTS``)."""
    return [grads(p, Arithmetic(dtype, order, dots)) for order in ORDERS]
