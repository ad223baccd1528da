"""torch.nn: ``torch.nn.MultiheadAttention(batch_first=True)`` with the canonical weights copied in.

Layouts: its ``in_proj_weight`` is (3E, E) and ``out_proj.weight`` (E, E), both
left-multiply (y = x W^T), so the canonical right-multiply weights go in transposed.
Its boolean masks have the inverted polarity: True = NOT allowed. ``valid_lens`` of
shape (B,) becomes ``key_padding_mask`` (B, S); every other part goes to ``attn_mask``,
boolean (L, S) or (B*H, L, S) when there is no bias, else float (bias, -inf where masked).
Self-attention without gradients passes one tensor as query, key and value, so torch
may take its inference fast path, as it would for a user's model in eval mode.

Code paths of ``nn.MultiheadAttention.forward`` (torch/nn/modules/activation.py and
``F.multi_head_attention_forward``), one name each:

- ``torch.nn``: ``need_weights=True, average_attn_weights=False``: the explicit softmax
  that returns per-head weights (B, H, L, S); its self-attention cases (one tensor, no
  gradients) take the fast path's kernel with ``need_weights=True`` (need_weights is not a
  condition of ``why_not_fast_path`` in torch 2.13);
- ``torch.nn[sdpa]``: ``need_weights=False`` on separate query, key and value: the module
  canonicalises the masks and ``multi_head_attention_forward`` calls SDPA;
- ``torch.nn[fast]``: the inference fast path (``torch._native_multi_head_attention``)
  without weights: eval mode, ``need_weights=False``, one tensor as query, key and value
  (``kv_source="self"``), batch_first, an even head count, boolean masks only (a float mask
  is one of the conditions ``why_not_fast_path`` names, so its float forms run the SDPA
  path), no gradients. Its masks are merged by ``merge_masks`` (mask type 0, 1 or 2).

Not covered: ``average_attn_weights=True`` (it only averages the returned weights over heads;
the output is the ``torch.nn`` path's), ``add_bias_kv``/``add_zero_attn``/``kdim``/``vdim``
(they change the problem, not the path), training with dropout (random numbers: no
reference), and nested-tensor inputs.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from implementations.torch_common import TorchCore, _np
from suite import adapters
from suite.plugin import Deviation, Result, Unsupported
from suite.problem import GRAD_NAMES, Problem, cotangent

# Mask forms nn.MultiheadAttention takes: attn_mask (L, S) or (B*H, L, S), boolean (True =
# masked) or additive float, key_padding_mask (B, S) boolean or float, mixed kinds (bool
# padding beside a float mask, which it converts with a deprecation warning), and the
# is_causal hint given with the causal attn_mask.
TORCH_NN_FORMS = frozenset({
    "bool_LS", "float_LS", "bool_BHxLS", "float_BHxLS", "kpm_bool", "kpm_float",
    "kpm_bool+bool_LS", "kpm_bool+bool_BHxLS", "kpm_bool+float_LS", "kpm_float+float_LS",
    "kpm_float+float_BHxLS", "causal_hint+bool_LS", "causal_hint+kpm_bool+bool_LS"})


def form_masks(p: Problem, dev: torch.device, t: torch.dtype) -> Dict[str, Any]:
    """The requested mask form as (attn_mask, key_padding_mask, is_causal) keywords, in
    nn.MultiheadAttention's polarity (bool True = NOT allowed) and shapes."""
    form = adapters.form_mask(p, true_means="masked")

    def put(a):
        x = None if a is None else torch.as_tensor(np.ascontiguousarray(a), device=dev)
        return x.to(t) if x is not None and x.is_floating_point() else x

    return {"attn_mask": put(form.attn), "key_padding_mask": put(form.key_padding),
            "is_causal": "causal_hint" in adapters.form_parts(p.mask_form)}


class TorchNN(TorchCore):
    name = "torch.nn"
    mask_forms = TORCH_NN_FORMS
    need_weights = True  # the path this name measures (with per-head weights)
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
        if adapters.requested_form(p):
            masks = form_masks(p, dev, t)
        else:
            attn_mask, key_padding_mask = torch_nn_masks(p, dev, t)
            masks = {"attn_mask": attn_mask, "key_padding_mask": key_padding_mask,
                     "is_causal": False}
        return {"p": p, "device": dev, "mha": mha, "inputs": inputs, "grad": grad,
                "need_weights": self.need_weights, **masks,
                "cotangent": torch.as_tensor(cotangent(p), device=dev).to(t) if grad else None,
                "compile_s": None}

    def _call(self, s: Dict[str, Any]):
        x = s["inputs"]
        return s["mha"](x["query"], x["key"], x["value"], attn_mask=s["attn_mask"],
                        key_padding_mask=s["key_padding_mask"], need_weights=s["need_weights"],
                        average_attn_weights=False,  # weights (B, H, L, S)
                        is_causal=s["is_causal"])

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


class TorchNNSDPA(TorchNN):
    """need_weights=False on separate inputs: the module's mask handling, then SDPA."""

    name = "torch.nn[sdpa]"
    features = TorchNN.features - {"weights"}
    need_weights = False
    deviations = {"nan_padding": TorchNN.deviations["nan_padding"]}
    # Every fixed case and the gradients; not the random shapes (the base name's shape
    # handling, which need_weights does not change).
    families = frozenset({"masking", "shapes", "numerics", "properties", "gradients",
                          "mask_forms", "tiles", "special_values"})


class TorchNNFast(TorchNN):
    """The inference fast path: one tensor as query, key and value, need_weights=False,
    eval mode, no gradients (each a condition of ``why_not_fast_path``)."""

    name = "torch.nn[fast]"
    kv_source = "self"
    features = TorchNN.features - {"weights", "grad", "cross"}
    need_weights = False

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if problem.H % 2:  # an odd head count is a condition of why_not_fast_path
            raise Unsupported(f"the fast path needs an even head count, got H={problem.H}")
        return super().prepare(problem, device, dtype, need_weights=False, grad=False)


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
