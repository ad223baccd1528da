"""torch.F_mha: ``torch.nn.functional.multi_head_attention_forward`` called directly.

This is the functional path under ``torch.nn.MultiheadAttention`` (without the module's
inference fast path). Layout: sequence first, (L, B, E); the canonical right-multiply
weights go in as its packed left-multiply ``in_proj_weight`` (3E, E) and ``out_proj_weight``
(E, E) (one model width E for query, key and value, so the packed form is the natural one).
Masks use its polarity, True = NOT allowed: ``valid_lens`` (B,) becomes ``key_padding_mask``
(B, S), the rest ``attn_mask`` (L, S) or (B*H, L, S); a top-left causal mask alone also sets
the ``is_causal`` hint. Always called with ``dropout_p=0`` and ``training=False``.

Two code paths, two names: ``torch.F_mha`` (``need_weights=False``: the fused SDPA call)
and ``torch.F_mha+weights`` (``need_weights=True, average_attn_weights=False``: an explicit
softmax that returns the per-head weights (B, H, L, S)).
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import torch
import torch.nn.functional as F

from implementations.torch_common import TORCH_DTYPES, TorchCore, _np
from implementations.torch_nn import torch_nn_masks
from suite.plugin import Deviation, Result, Unsupported
from suite.problem import GRAD_NAMES, Problem, cotangent

_NAN_PADDING = Deviation(
    "confined", "NaN in a padded key or value position gives NaN rows: the mask is added to "
                "q.k^T (NaN + -inf is NaN) and 0 * NaN is NaN in weights @ v "
                f"(measured, torch {torch.__version__})")


class TorchFMHA(TorchCore):
    name = "torch.F_mha"
    # No GQA (one head count) and no explicit scale (always 1/sqrt(D)).
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "grad"})
    deviations = {"nan_padding": _NAN_PADDING}
    need_weights = False

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
        if device not in self.devices():
            raise ValueError(f"device: expected one of {self.devices()}, got {device!r}")
        p, dev, t = problem, torch.device(device), TORCH_DTYPES[dtype]
        if p.K != p.H:
            raise Unsupported(f"multi_head_attention_forward has one head count for q, k and v "
                              f"(H={p.H}, H_kv={p.K})")
        w = p.weights

        def put(a):
            x = torch.as_tensor(np.ascontiguousarray(a), device=dev).to(t)
            return x.requires_grad_(True) if grad else x

        params = {
            "in_proj_weight": put(np.concatenate([w.w_q.T, w.w_k.T, w.w_v.T])),  # (3E, E)
            "in_proj_bias": None if w.b_q is None else put(np.concatenate([w.b_q, w.b_k, w.b_v])),
            "out_proj_weight": put(w.w_o.T),  # (E, E)
            "out_proj_bias": None if w.b_o is None else put(w.b_o),
        }
        # Sequence first: (B, L, E) -> (L, B, E), done here, untimed.
        inputs = {n: put(np.swapaxes(a, 0, 1)) for n, a in
                  (("query", p.query), ("key", p.key), ("value", p.value))}
        attn_mask, key_padding_mask = torch_nn_masks(p, dev, t)
        return {"p": p, "device": dev, "params": params, "inputs": inputs, "grad": grad,
                "attn_mask": attn_mask, "key_padding_mask": key_padding_mask,
                "is_causal": p.mask.kinds == {"causal"},
                "cotangent": torch.as_tensor(np.swapaxes(cotangent(p), 0, 1),
                                             device=dev).to(t) if grad else None,
                "compile_s": None}

    def _call(self, s: Dict[str, Any]):
        p, x, w = s["p"], s["inputs"], s["params"]
        return F.multi_head_attention_forward(
            x["query"], x["key"], x["value"], p.E, p.H,
            w["in_proj_weight"], w["in_proj_bias"], None, None, False, 0.0,
            w["out_proj_weight"], w["out_proj_bias"], training=False,
            key_padding_mask=s["key_padding_mask"], need_weights=self.need_weights,
            attn_mask=s["attn_mask"], average_attn_weights=False,  # weights (B, H, L, S)
            is_causal=s["is_causal"])  # out (L, B, E)

    def run(self, s: Dict[str, Any]):
        if not s["grad"]:
            with torch.inference_mode():
                return self._call(s)
        for v in [*s["inputs"].values(), *s["params"].values()]:
            if v is not None:
                v.grad = None
        out, weights = self._call(s)
        out.backward(s["cotangent"])
        return out.detach(), None if weights is None else weights.detach()

    def fetch(self, s: Dict[str, Any], handle) -> Result:
        out, weights = handle
        grads = None
        if s["grad"]:
            E, w = s["p"].E, s["params"]
            grads = {n: np.swapaxes(_np(t.grad), 0, 1) for n, t in s["inputs"].items()}
            g_in = _np(w["in_proj_weight"].grad)  # (3E, E), left-multiply
            grads.update(w_q=g_in[:E].T, w_k=g_in[E:2 * E].T, w_v=g_in[2 * E:].T,
                         w_o=_np(w["out_proj_weight"].grad).T)
            if w["in_proj_bias"] is not None:
                g_b = _np(w["in_proj_bias"].grad)
                grads.update(b_q=g_b[:E], b_k=g_b[E:2 * E], b_v=g_b[2 * E:],
                             b_o=_np(w["out_proj_bias"].grad))
            grads = {n: g for n, g in grads.items() if n in GRAD_NAMES}
        return Result(np.swapaxes(_np(out), 0, 1),
                      None if weights is None else _np(weights), grads)


class TorchFMHAWeights(TorchFMHA):
    name = "torch.F_mha+weights"
    features = TorchFMHA.features | {"weights"}
    need_weights = True
