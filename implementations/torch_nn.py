"""torch.nn: ``torch.nn.MultiheadAttention(batch_first=True)`` with the canonical weights copied in.

Layouts: its ``in_proj_weight`` is (3E, E) and ``out_proj.weight`` (E, E), both
left-multiply (y = x W^T), so the canonical right-multiply weights go in transposed.
Its boolean masks have the inverted polarity: True = NOT allowed. ``valid_lens`` of
shape (B,) becomes ``key_padding_mask`` (B, S); every other part goes to ``attn_mask``,
boolean (L, S) or (B*H, L, S) when there is no bias, else float (bias, -inf where masked).
Self-attention without gradients passes one tensor as query, key and value, so torch
may take its inference fast path, as it would for a user's model in eval mode.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from implementations.torch_common import TorchCore, _np
from suite import adapters
from suite.plugin import Deviation, Result
from suite.problem import GRAD_NAMES, Problem, cotangent


class TorchNN(TorchCore):
    name = "torch.nn"
    # No GQA (one head count for q, k and v); no explicit scale (always 1/sqrt(D)).
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "weights", "grad"})
    deviations = {
        "fully_masked_rows": Deviation(
            "nan", "a query row with no key to attend gives NaN, not a zero head output, with "
                   "need_weights=True (explicit softmax) and on the self-attention inference "
                   f"fast path; the SDPA path gives zeros (measured, torch {torch.__version__})"),
        "nan_padding": Deviation(
            "confined", "NaN in a padded key or value position gives NaN rows: masking adds "
                        "-inf to q.k^T (NaN + -inf is NaN) and 0 * NaN is NaN in weights @ v "
                        f"(measured, torch {torch.__version__})"),
    }

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        dev, t = self.target(device, dtype)
        if problem.K != problem.H:
            raise ValueError(f"num_kv_heads: torch.nn.MultiheadAttention has no GQA, expected "
                             f"{problem.H}, got {problem.K}")
        p = problem
        w = p.weights
        has_bias = w.b_q is not None
        mha = torch.nn.MultiheadAttention(p.E, p.H, bias=has_bias, batch_first=True,
                                          device=dev, dtype=t)
        packed = adapters.to_packed(w)  # in_proj (3E, E), out_proj (E, E): left-multiply
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.as_tensor(packed["in_proj_weight"]))
            mha.out_proj.weight.copy_(torch.as_tensor(packed["out_proj_weight"]))
            if has_bias:
                mha.in_proj_bias.copy_(torch.as_tensor(packed["in_proj_bias"]))
                mha.out_proj.bias.copy_(torch.as_tensor(packed["out_proj_bias"]))
        mha.eval()

        def put(a):
            x = torch.as_tensor(np.ascontiguousarray(a), device=dev).to(t)
            return x.requires_grad_(True) if grad else x

        if not grad and p.key is p.query and p.value is p.query:
            x = put(p.query)  # one tensor: eligible for MultiheadAttention's fast path
            inputs = {"query": x, "key": x, "value": x}
        else:  # separate leaves, so each gets its own gradient
            inputs = {"query": put(p.query), "key": put(p.key), "value": put(p.value)}
        attn_mask, key_padding_mask = torch_nn_masks(p, dev, t)
        return {"p": p, "device": dev, "mha": mha, "inputs": inputs, "grad": grad,
                "need_weights": need_weights, "attn_mask": attn_mask,
                "key_padding_mask": key_padding_mask,
                "cotangent": torch.as_tensor(cotangent(p), device=dev).to(t) if grad else None,
                "compile_s": None}

    def _call(self, s: Dict[str, Any]):
        x = s["inputs"]
        return s["mha"](x["query"], x["key"], x["value"], attn_mask=s["attn_mask"],
                        key_padding_mask=s["key_padding_mask"], need_weights=s["need_weights"],
                        average_attn_weights=False)  # weights (B, H, L, S)

    def run(self, s: Dict[str, Any]):
        if not s["grad"]:
            with torch.inference_mode():
                return self._call(s)
        s["mha"].zero_grad(set_to_none=True)
        for v in s["inputs"].values():
            v.grad = None
        out, weights = self._call(s)
        out.backward(s["cotangent"])
        return out.detach(), None if weights is None else weights.detach()

    def fetch(self, s: Dict[str, Any], handle) -> Result:
        out, weights = handle
        grads = None
        if s["grad"]:
            mha = s["mha"]
            grads = {n: _np(t.grad) for n, t in s["inputs"].items()}

            def g(param):
                return None if param is None else _np(param.grad)

            grads.update(adapters.grads_from_packed({
                "in_proj_weight": g(mha.in_proj_weight), "in_proj_bias": g(mha.in_proj_bias),
                "out_proj_weight": g(mha.out_proj.weight), "out_proj_bias": g(mha.out_proj.bias)}))
            grads = {n: g for n, g in grads.items() if n in GRAD_NAMES}
        return Result(_np(out), None if weights is None else _np(weights), grads)


def torch_nn_masks(p: Problem, dev: torch.device, t: torch.dtype
                   ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The canonical mask as MultiheadAttention's (attn_mask, key_padding_mask).

    Both use its polarity: a bool True means NOT allowed; a float is added to the logits.
    """
    B, H, L, S = p.B, p.H, p.L, p.S
    parts = adapters.split_mask(p, true_means="masked", key_padding=True, native_causal=())
    attn_mask = None
    if parts.bias is not None:
        bias = np.broadcast_to(parts.additive(), (B, H, L, S))  # -inf where masked
        attn_mask = torch.as_tensor(bias.reshape(B * H, L, S), device=dev).to(t)
    elif parts.mask is not None:
        blocked = np.broadcast_to(parts.mask, (B, H, L, S))  # True = NOT allowed
        same = (blocked == blocked[:1, :1]).all()
        blocked = blocked[0, 0] if same else blocked.reshape(B * H, L, S)  # (L, S) or (B*H, L, S)
        attn_mask = torch.as_tensor(np.ascontiguousarray(blocked), device=dev)
    key_padding_mask = None
    padded = parts.key_padding  # (B, S), True = padded
    if padded is not None:
        key_padding_mask = torch.as_tensor(padded, device=dev)
        if attn_mask is not None and attn_mask.is_floating_point():
            # Mixed bool/float masks are deprecated: pass padding as -inf too.
            key_padding_mask = torch.zeros(B, S, device=dev, dtype=t).masked_fill(
                key_padding_mask, float("-inf"))
    return attn_mask, key_padding_mask
