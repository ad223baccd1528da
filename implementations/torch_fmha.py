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

from implementations.torch_common import TorchCore, _np
from implementations.torch_nn import TORCH_NN_FORMS, form_masks
from suite import adapters
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
    mask_forms = TORCH_NN_FORMS  # the module's masks are this function's

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        p, (dev, t) = problem, self.target(device, dtype)
        if p.K != p.H:
            raise Unsupported(f"multi_head_attention_forward has one head count for q, k and v "
                              f"(H={p.H}, H_kv={p.K})")

        def put(a):
            if a is None:
                return None
            x = torch.as_tensor(np.ascontiguousarray(a), device=dev).to(t)
            return x.requires_grad_(True) if grad else x

        # in_proj_weight (3E, E), in_proj_bias (3E,), out_proj_weight (E, E), out_proj_bias
        params = {n: put(a) for n, a in adapters.to_packed(p.weights).items()}
        # Sequence first: (B, L, E) -> (L, B, E), done here, untimed.
        inputs = {n: put(np.swapaxes(a, 0, 1)) for n, a in
                  (("query", p.query), ("key", p.key), ("value", p.value))}
        return {"p": p, "device": dev, "params": params, "inputs": inputs, "grad": grad,
                **(form_masks(p, dev, t) if adapters.requested_form(p) else fmha_masks(p, dev, t)),
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
            grads = {n: np.swapaxes(_np(t.grad), 0, 1) for n, t in s["inputs"].items()}
            grads.update(adapters.grads_from_packed(
                {n: None if t is None else _np(t.grad) for n, t in s["params"].items()}))
            grads = {n: g for n, g in grads.items() if n in GRAD_NAMES}
        return Result(np.swapaxes(_np(out), 0, 1),
                      None if weights is None else _np(weights), grads)


def fmha_masks(p: Problem, dev: torch.device, t: torch.dtype) -> Dict[str, Any]:
    """The canonical mask as ``multi_head_attention_forward``'s keyword arguments.

    Its polarity: a bool True means NOT allowed; a float is added to the logits. A top-left
    causal mask alone goes in as ``attn_mask`` plus the ``is_causal`` hint (the hint needs
    the mask too); with a bias, padding goes in as a float -inf key_padding_mask (mixed
    bool/float masks are deprecated).
    """
    parts = adapters.split_mask(p, true_means="masked", key_padding=True, native_causal=(),
                                per_head=True)
    attn_mask = None
    if parts.bias is not None:
        attn_mask = parts.additive()  # (B, H|1, L, S), -inf where masked
    elif parts.mask is not None:
        attn_mask = parts.mask  # (B, H|1, L, S), True = masked
    if attn_mask is not None:
        B, H, L, S = parts.shape
        # (L, S) when one mask serves every batch item and head, else (B*H, L, S)
        same = bool((attn_mask == attn_mask[:1, :1]).all())
        attn_mask = attn_mask[0, 0] if same else np.broadcast_to(
            attn_mask, (B, H, L, S)).reshape(B * H, L, S)
        attn_mask = torch.as_tensor(np.ascontiguousarray(attn_mask), device=dev)
        attn_mask = attn_mask.to(t) if attn_mask.is_floating_point() else attn_mask
    kpm = None
    if parts.key_padding is not None:
        kpm = torch.as_tensor(parts.key_padding, device=dev)  # (B, S), True = masked
        if attn_mask is not None and attn_mask.is_floating_point():
            kpm = torch.zeros(kpm.shape, device=dev, dtype=t).masked_fill(kpm, float("-inf"))
    return {"attn_mask": attn_mask, "key_padding_mask": kpm,
            "is_causal": p.mask.kinds == {"causal"} and p.mask.causal_align == "top_left"}


class TorchFMHAWeights(TorchFMHA):
    name = "torch.F_mha+weights"
    features = TorchFMHA.features | {"weights"}
    deviations = {
        "fully_masked_rows": Deviation(
            "nan", "a query row with no key to attend gives NaN with need_weights=True (the "
                   "explicit softmax of a row of -inf); the fused path (torch.F_mha) gives "
                   f"zeros (measured, torch {torch.__version__})"),
        "nan_padding": _NAN_PADDING,
    }
    need_weights = True
