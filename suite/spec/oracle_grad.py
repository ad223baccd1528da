"""Gradients of the spec, d sum(out * g) / d(inputs, weights), by hand, from the forward's
intermediates (``suite.spec.oracle.forward``).

``grads(p)`` is the float64 oracle; ``naive_grads(p, dtype)`` the same backward pass in
dtype t, in every reduction order, the baselines of the gradient agreement rule (k = 3).

Score variants: the cap is differentiated (tanh' = 1 - tanh^2); ALiBi, the relative table
and the sinks are constants of the problem (no gradient is asked for them: they change the
weights P, and the softmax backward below holds with a sink in the denominator, whose value
is 0); value heads of their own width change only shapes. A score_mod is not
differentiated: ``grads`` refuses it (``differentiable``), so a gradient case on such a
problem is unsupported, never judged against a wrong reference.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from suite.spec.oracle import EXACT, ORDERS, Arithmetic, forward
from suite.spec.problem import Problem, cotangent


def differentiable(p: Problem) -> Optional[str]:
    """Why the gradient oracle cannot differentiate ``p`` (None when it can)."""
    if p.score_mod is not None:
        return (f"the gradient oracle does not differentiate a score_mod "
                f"({p.score_mod.name}): no reference for its gradients")
    return None


def grads(p: Problem, ar: Arithmetic = EXACT) -> Dict[str, np.ndarray]:
    """Gradients of sum(out * cotangent(p)) for every input and weight, in arithmetic ``ar``."""
    why = differentiable(p)
    if why:
        raise ValueError(f"problem: {why}")
    r = ar.rounded
    B, L, S, H, K, D, V, E, G = p.B, p.L, p.S, p.H, p.K, p.D, p.V, p.E, p.H // p.K
    f = forward(p, ar)
    x, w, q, k, v, P = f["x"], f["w"], f["q"], f["k"], f["v"], f["weights"]
    scale = ar.acc(p.effective_scale)
    g = r(cotangent(p))  # (B, L, E)

    out: Dict[str, np.ndarray] = {}
    out["w_o"] = ar.matmul(f["concat"].reshape(B * L, H * V).T, g.reshape(B * L, E))  # (H*V, E)
    if w["b_o"] is not None:
        out["b_o"] = ar.sum(g.reshape(B * L, E), axis=0)[0]  # (E,)
    d_heads = ar.matmul(g, w["w_o"].T).reshape(B, L, H, V).transpose(0, 2, 1, 3)  # (B, H, L, V)
    d_P = ar.matmul(d_heads, v.transpose(0, 1, 3, 2))  # (B, H, L, S)
    d_v = np.where(f["used"], ar.matmul(P.transpose(0, 1, 3, 2), d_heads), 0.0)  # (B, H, S, V)
    # Softmax backward: dlogits = P * (dP - sum(dP * P)); masked entries have P = 0 (a sink
    # adds P_sink * dP_sink = 0 to the sum: it takes no value).
    # In the softmax's own arithmetic (float32 under a float64_softmax policy: the weights
    # were cast back up, so their cotangent comes down first), then back in this one.
    sm = ar.softmax
    d_P, P_sm = sm.rounded(d_P), sm.rounded(P)
    d_logits = r(sm.rounded(P_sm * sm.rounded(d_P - sm.sum(sm.rounded(d_P * P_sm), axis=-1))))
    if p.softcap is not None:  # through cap * tanh(x / cap): d/dx = 1 - tanh^2
        d_logits = r(d_logits * f["variants"]["cap_slope"])  # (B, H, L, S)
    d_q = r(ar.matmul(d_logits, k) * scale)  # (B, H, L, D)
    d_k = r(ar.matmul(d_logits.transpose(0, 1, 3, 2), q) * scale)  # (B, H, S, D)
    # GQA: the G query heads sharing a kv head add their gradients.
    d_k = ar.sum(d_k.reshape(B, K, G, S, D), axis=2)[:, :, 0]  # (B, K, S, D)
    d_v = ar.sum(d_v.reshape(B, K, G, S, V), axis=2)[:, :, 0]  # (B, K, S, V)

    for name, inp, dx, n, length in (("q", "query", d_q, H, L), ("k", "key", d_k, K, S),
                                      ("v", "value", d_v, K, S)):
        width = dx.shape[-1]  # D, or V for the values
        d_proj = dx.transpose(0, 2, 1, 3).reshape(B * length, n * width)  # (B*length, n*width)
        out[f"w_{name}"] = ar.matmul(x[inp].reshape(B * length, E).T, d_proj)  # (E, n*width)
        if w[f"b_{name}"] is not None:
            out[f"b_{name}"] = ar.sum(d_proj, axis=0)[0]  # (n*width,)
        out[inp] = ar.matmul(d_proj, w[f"w_{name}"].T).reshape(B, length, E)  # (B, length, E)
    return {n: np.asarray(a, dtype=np.float64) for n, a in out.items()}


def naive_grads(p: Problem, dtype: str, dots: Optional[str] = None
                ) -> List[Dict[str, np.ndarray]]:
    """The backward pass in ``dtype``, once per reduction order; ``dots``: how float32
    products take their operands (``suite.spec.oracle.DOTS``)."""
    return [grads(p, Arithmetic(dtype, order, dots)) for order in ORDERS]
