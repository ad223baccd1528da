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
(they change the problem, not the path), and nested-tensor inputs. Training mode with
dropout (``dropout=p``, ``module.train()``) is the dropout family's (``suite.conformance.families.dropout``,
judged by the draws' mean and spread); ``torch.nn[fast]`` runs in eval mode only.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch

from implementations.torch.common import SDPA_FULLY_MASKED_NAN, TorchModuleCore, _np, tensor_copy
from suite.plugins import adapters
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Unsupported
from suite.spec.problem import Problem

# Mask forms nn.MultiheadAttention takes: attn_mask (L, S) or (B*H, L, S), boolean (True =
# masked) or additive float, key_padding_mask (B, S) boolean or float, mixed kinds (bool
# padding beside a float mask, which it converts with a deprecation warning), the is_causal
# hint given with the causal attn_mask, and is_causal alone or beside key padding (torch 2.13
# refuses it without attn_mask outside the inference fast path: "unsupported", its words).
TORCH_NN_FORMS = frozenset({
    "bool_LS", "float_LS", "bool_BHxLS", "float_BHxLS", "kpm_bool", "kpm_float",
    "kpm_bool+bool_LS", "kpm_bool+bool_BHxLS", "kpm_bool+float_LS", "kpm_float+float_LS",
    "kpm_float+float_BHxLS", "causal_hint+bool_LS", "causal_hint+kpm_bool+bool_LS",
    "causal_flag", "causal_flag+kpm_bool"})


def form_masks(p: Problem, dev: torch.device, t: torch.dtype) -> Dict[str, Any]:
    """The requested mask form as (attn_mask, key_padding_mask, is_causal) keywords, in
    nn.MultiheadAttention's polarity (bool True = NOT allowed) and shapes."""
    form = adapters.form_mask(p, true_means="masked")

    def put(a):
        x = None if a is None else tensor_copy(a, dev)
        return x.to(t) if x is not None and x.is_floating_point() else x

    return {"attn_mask": put(form.attn), "key_padding_mask": put(form.key_padding),
            "is_causal": bool({"causal_hint", "causal_flag"}
                              & set(adapters.form_parts(p.mask_form)))}


def refusing_causal_alone(forward: Callable[[], Any], mask: Dict[str, Any]) -> Any:
    """``forward()``; where torch refuses ``is_causal`` without ``attn_mask`` (a
    RuntimeError, "Need attn_mask if specifying the is_causal hint" in torch 2.13), the case
    is unsupported in torch's own words instead of an error."""
    try:
        return forward()
    except RuntimeError as exc:
        if mask["is_causal"] and mask["attn_mask"] is None:
            raise Unsupported(f"torch refuses is_causal without attn_mask: {exc}") from exc
        raise


class TorchNN(TorchModuleCore):
    name = "torch.nn"
    mask_forms = TORCH_NN_FORMS
    need_weights = True  # the path this name measures (with per-head weights)
    # No GQA (one head count for q, k and v); no explicit scale (always 1/sqrt(D)).
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "weights", "grad", "dropout"})
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

    layers = {}  # one packed in_proj: load_weights/weight_grads below

    def build(self, p: Problem) -> torch.nn.Module:
        if p.K != p.H:
            raise ValueError(f"num_kv_heads: torch.nn.MultiheadAttention has no GQA, expected "
                             f"{p.H}, got {p.K}")
        return torch.nn.MultiheadAttention(p.E, p.H, bias=p.weights.b_q is not None,
                                           batch_first=True, dropout=p.dropout or 0.0)

    def load_weights(self, mha: torch.nn.Module, p: Problem) -> None:
        packed = adapters.to_packed(p.weights)  # in_proj (3E, E), out_proj (E, E): left-multiply
        # torch.tensor copies: a problem's cached arrays are read-only, and torch.as_tensor of
        # one warns (once a process) that writing to it would be undefined.
        mha.in_proj_weight.copy_(torch.tensor(packed["in_proj_weight"]))
        mha.out_proj.weight.copy_(torch.tensor(packed["out_proj_weight"]))
        if packed["in_proj_bias"] is not None:
            mha.in_proj_bias.copy_(torch.tensor(packed["in_proj_bias"]))
            mha.out_proj.bias.copy_(torch.tensor(packed["out_proj_bias"]))

    def weight_grads(self, mha: torch.nn.Module) -> Dict[str, np.ndarray]:
        def g(param):
            return None if param is None else _np(param.grad)

        return adapters.grads_from_packed({
            "in_proj_weight": g(mha.in_proj_weight), "in_proj_bias": g(mha.in_proj_bias),
            "out_proj_weight": g(mha.out_proj.weight), "out_proj_bias": g(mha.out_proj.bias)})

    def shares_input(self, p: Problem, grad: bool) -> bool:
        # One tensor: eligible for MultiheadAttention's fast path.
        return not grad and p.key is p.query and p.value is p.query

    def module_mask(self, p: Problem, dev: torch.device, t: torch.dtype) -> Dict[str, Any]:
        if adapters.requested_form(p):
            return form_masks(p, dev, t)
        attn_mask, key_padding_mask = torch_nn_masks(p, dev, t)
        return {"attn_mask": attn_mask, "key_padding_mask": key_padding_mask, "is_causal": False}

    def call(self, mha, query, key, value, mask, need_weights):
        # need_weights is the name's (the path it measures), whatever the case asks.
        return refusing_causal_alone(lambda: mha(
            query, key, value, **mask, need_weights=self.need_weights,
            average_attn_weights=False), mask)  # weights (B, H, L, S)


class TorchNNSDPA(TorchNN):
    """need_weights=False on separate inputs: the module's mask handling, then SDPA."""

    name = "torch.nn[sdpa]"
    features = TorchNN.features - {"weights"}
    need_weights = False
    deviations = {"nan_padding": TorchNN.deviations["nan_padding"],
                  "fully_masked_rows": SDPA_FULLY_MASKED_NAN}
    # Every fixed case and the gradients; not the random shapes (the base name's shape
    # handling, which need_weights does not change).
    families = frozenset({"masking", "shapes", "numerics", "properties", "gradients",
                          "mask_forms", "tiles", "special_values", "contracts", "dropout"})
    contracts = (Contract("agrees_with_weights_path", "agrees", {"need_weights": True},
                          "need_weights=False (SDPA) computes what the need_weights=True path "
                          "does"),)


class TorchNNFast(TorchNN):
    """The inference fast path: one tensor as query, key and value, need_weights=False,
    eval mode, no gradients (each a condition of ``why_not_fast_path``)."""

    name = "torch.nn[fast]"
    kv_source = "self"
    features = TorchNN.features - {"weights", "grad", "cross", "dropout"}
    need_weights = False
    contracts = (Contract("agrees_with_weights_path", "agrees", {"need_weights": True},
                          "the inference fast path computes what the need_weights=True path "
                          "does"),)

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
        attn_mask = tensor_copy(bias.reshape(B * H, L, S), dev).to(t)
    elif parts.mask is not None:
        blocked = np.broadcast_to(parts.mask, (B, H, L, S))  # True = NOT allowed
        same = (blocked == blocked[:1, :1]).all()
        blocked = blocked[0, 0] if same else blocked.reshape(B * H, L, S)  # (L, S) or (B*H, L, S)
        attn_mask = tensor_copy(blocked, dev)
    key_padding_mask = None
    padded = parts.key_padding  # (B, S), True = padded
    if padded is not None:
        key_padding_mask = tensor_copy(padded, dev)
        if attn_mask is not None and attn_mask.is_floating_point():
            # Mixed bool/float masks are deprecated: pass padding as -inf too.
            key_padding_mask = torch.zeros(B, S, device=dev, dtype=t).masked_fill(
                key_padding_mask, float("-inf"))
    return attn_mask, key_padding_mask
