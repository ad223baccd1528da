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

from implementations.torch.common import SDPA_FULLY_MASKED_NAN, TorchModuleCore, _np, tensor_copy
from implementations.torch.nn import TORCH_NN_FORMS, form_masks, refusing_causal_alone
from suite.plugins import adapters
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Unsupported
from suite.spec.problem import Problem

_NAN_PADDING = Deviation(
    "confined", "NaN in a padded key or value position gives NaN rows: the mask is added to "
                "q.k^T (NaN + -inf is NaN) and 0 * NaN is NaN in weights @ v "
                f"(measured, torch {torch.__version__})")


class TorchFMHA(TorchModuleCore):
    name = "torch.F_mha"
    contracts = (Contract("agrees_with_weights_path", "agrees", {"need_weights": True},
                          "the fused path (need_weights=False) computes what the explicit "
                          "need_weights=True path does"),)
    # No GQA (one head count) and no explicit scale (always 1/sqrt(D)).
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "grad"})
    deviations = {"nan_padding": _NAN_PADDING, "fully_masked_rows": SDPA_FULLY_MASKED_NAN}
    need_weights = False
    mask_forms = TORCH_NN_FORMS  # the module's masks are this function's

    layers = {}  # packed parameters: load_weights/weight_grads below
    batch_first = False  # sequence first, (L, B, E): transposed in prepare, untimed

    def build(self, p: Problem) -> torch.nn.Module:
        if p.K != p.H:
            raise Unsupported(f"multi_head_attention_forward has one head count for q, k and v "
                              f"(H={p.H}, H_kv={p.K})")
        return _PackedParams(p.E, p.H, p.weights.b_q is not None)

    def load_weights(self, module: torch.nn.Module, p: Problem) -> None:
        # in_proj_weight (3E, E), in_proj_bias (3E,), out_proj_weight (E, E), out_proj_bias
        for n, a in adapters.to_packed(p.weights).items():
            if a is not None:
                getattr(module, n).copy_(torch.as_tensor(a))

    def weight_grads(self, module: torch.nn.Module) -> Dict[str, np.ndarray]:
        return adapters.grads_from_packed({n: None if t is None else _np(t.grad)
                                           for n, t in module.named_parameters()})

    def after_prepare(self, state: Dict[str, Any]) -> None:
        if not state["grad"]:
            # Plain tensors, as a caller of the function passes them: with weights that
            # require grad, torch multiplies the bias-free projections through another
            # path (outputs differ by 3.6e-7 in float32, measured, torch 2.13 CPU).
            state["module"].requires_grad_(False)

    def module_mask(self, p: Problem, dev: torch.device, t: torch.dtype) -> Dict[str, Any]:
        return form_masks(p, dev, t) if adapters.requested_form(p) else fmha_masks(p, dev, t)

    def call(self, w, query, key, value, mask, need_weights):
        return refusing_causal_alone(lambda: F.multi_head_attention_forward(
            query, key, value, w.embed_dim, w.num_heads,
            w.in_proj_weight, w.in_proj_bias, None, None, False, 0.0,
            w.out_proj_weight, w.out_proj_bias, training=False,
            key_padding_mask=mask["key_padding_mask"], need_weights=self.need_weights,
            attn_mask=mask["attn_mask"], average_attn_weights=False,  # weights (B, H, L, S)
            is_causal=mask["is_causal"]), mask)  # out (L, B, E)


class _PackedParams(torch.nn.Module):
    """The function's parameters as leaves of a module: in_proj_weight (3E, E), in_proj_bias
    (3E,), out_proj_weight (E, E), out_proj_bias (E,) (the biases absent without bias)."""

    def __init__(self, E: int, H: int, bias: bool):
        super().__init__()
        self.embed_dim, self.num_heads = E, H
        self.in_proj_weight = torch.nn.Parameter(torch.empty(3 * E, E))
        self.out_proj_weight = torch.nn.Parameter(torch.empty(E, E))
        self.in_proj_bias = torch.nn.Parameter(torch.empty(3 * E)) if bias else None
        self.out_proj_bias = torch.nn.Parameter(torch.empty(E)) if bias else None


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
        attn_mask = tensor_copy(attn_mask, dev)
        attn_mask = attn_mask.to(t) if attn_mask.is_floating_point() else attn_mask
    kpm = None
    if parts.key_padding is not None:
        kpm = tensor_copy(parts.key_padding, dev)  # (B, S), True = masked
        if attn_mask is not None and attn_mask.is_floating_point():
            kpm = torch.zeros(kpm.shape, device=dev, dtype=t).masked_fill(kpm, float("-inf"))
    return {"attn_mask": attn_mask, "key_padding_mask": kpm,
            "is_causal": p.mask.kinds == {"causal"} and p.mask.causal_align == "top_left"}


class TorchFMHAWeights(TorchFMHA):
    name = "torch.F_mha+weights"
    features = TorchFMHA.features | {"weights"}
    contracts = ()
    deviations = {
        "fully_masked_rows": Deviation(
            "nan", "a query row with no key to attend gives NaN with need_weights=True (the "
                   "explicit softmax of a row of -inf); the fused path (torch.F_mha) gives "
                   f"zeros (measured, torch {torch.__version__})"),
        "nan_padding": _NAN_PADDING,
    }
    need_weights = True
