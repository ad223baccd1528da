"""torch.nn: ``torch.nn.MultiheadAttention`` with the canonical weights copied in.

Layouts: its ``in_proj_weight`` is (3E, E) and ``out_proj.weight`` (E, E), both
left-multiply (y = x W^T), so the canonical right-multiply weights go in transposed.
Its boolean masks have the inverted polarity: True = NOT allowed.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import torch

from implementations.torch_common import TORCH_DTYPES, TorchCore, _np
from suite.plugin import Result
from suite.problem import GRAD_NAMES, Problem, cotangent


class TorchNN(TorchCore):
    name = "torch.nn"
    # No GQA (one head count for q, k and v); no explicit scale (always 1/sqrt(D)).
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "weights", "grad"})
    deviations = {
        "fully_masked_rows": "a query row with no key to attend gives NaN, not a zero head "
                             f"output (measured, torch {torch.__version__})",
        "nan_padding": "NaN in a padded key position gives NaN rows: the mask is added to "
                       f"q.k^T and NaN + -inf is NaN (measured, torch {torch.__version__})",
    }

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
        p, dev, t = problem, torch.device(device), TORCH_DTYPES[dtype]
        w = p.weights
        has_bias = w.b_q is not None
        mha = torch.nn.MultiheadAttention(p.E, p.H, bias=has_bias, batch_first=True,
                                          device=dev, dtype=t)
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.as_tensor(
                np.concatenate([w.w_q.T, w.w_k.T, w.w_v.T])))  # (3E, E)
            mha.out_proj.weight.copy_(torch.as_tensor(w.w_o.T))  # (E, E)
            if has_bias:
                mha.in_proj_bias.copy_(torch.as_tensor(np.concatenate([w.b_q, w.b_k, w.b_v])))
                mha.out_proj.bias.copy_(torch.as_tensor(w.b_o))
        mha.eval()

        def put(a):
            x = torch.as_tensor(np.ascontiguousarray(a), device=dev).to(t)
            return x.requires_grad_(True) if grad else x

        inputs = {"query": put(p.query), "key": put(p.key), "value": put(p.value)}
        return {"p": p, "device": dev, "mha": mha, "inputs": inputs, "grad": grad,
                "need_weights": need_weights, "mask": _attn_mask(p, dev, t),
                "cotangent": torch.as_tensor(cotangent(p), device=dev).to(t) if grad else None,
                "compile_s": None}

    def run(self, s: Dict[str, Any]):
        x, mha = s["inputs"], s["mha"]
        if s["grad"]:
            mha.zero_grad(set_to_none=True)
            for v in x.values():
                v.grad = None
            out, weights = mha(x["query"], x["key"], x["value"], attn_mask=s["mask"],
                               need_weights=s["need_weights"], average_attn_weights=False)
            out.backward(s["cotangent"])
            return out.detach(), weights
        with torch.inference_mode():
            return mha(x["query"], x["key"], x["value"], attn_mask=s["mask"],
                       need_weights=s["need_weights"], average_attn_weights=False)

    def fetch(self, s: Dict[str, Any], handle) -> Result:
        out, weights = handle
        grads = None
        if s["grad"]:
            E, mha = s["p"].E, s["mha"]
            grads = {n: _np(t.grad) for n, t in s["inputs"].items()}
            g_in = _np(mha.in_proj_weight.grad)  # (3E, E), left-multiply
            grads.update(w_q=g_in[:E].T, w_k=g_in[E:2 * E].T, w_v=g_in[2 * E:].T,
                         w_o=_np(mha.out_proj.weight.grad).T)
            if mha.in_proj_bias is not None:
                g_b = _np(mha.in_proj_bias.grad)
                grads.update(b_q=g_b[:E], b_k=g_b[E:2 * E], b_v=g_b[2 * E:],
                             b_o=_np(mha.out_proj.bias.grad))
            grads = {n: g for n, g in grads.items() if n in GRAD_NAMES}
        return Result(_np(out), None if weights is None else _np(weights), grads)


def _attn_mask(p: Problem, dev: torch.device, t: torch.dtype):
    """The canonical mask as MultiheadAttention's float attn_mask (B*H, L, S), or None.

    A float mask is added to the logits, so it carries the bias and -inf where masked;
    (a bool one would need True = NOT allowed, the inverse of the canonical polarity).
    """
    if p.mask.is_empty():
        return None
    bias = p.mask.dense_bias(p.B, p.H, p.L, p.S)  # (B, H, L, S), -inf where masked
    return torch.as_tensor(bias.reshape(p.B * p.H, p.L, p.S), device=dev).to(t)
