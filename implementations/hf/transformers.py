"""hf.*: Hugging Face transformers attention modules, each with its eager and sdpa attention.

Modules are built from small configs with random initial weights (no download, no
network), switched to eval mode (their dropout applies only in training), then loaded with
the canonical weights converted to their layout (untimed, in ``prepare``):

- ``hf.bert[eager|sdpa]``: ``BertCrossAttention``, separate ``query``/``key``/``value``
  ``nn.Linear`` (out, in); keys and values both come from ``encoder_hidden_states``, one
  source (``kv_source = "shared"``: the cases give it value = key). BERT keeps the output
  projection in ``BertSelfOutput`` together with a residual and a LayerNorm, so the
  canonical ``W_o`` is applied after the module as a plain linear layer.
- ``hf.gpt2[eager|sdpa]``: ``GPT2Attention``, ``Conv1D`` (in, out) layers: a self-attention
  problem runs the self-attention module (packed q/k/v ``c_attn`` (E, 3E)), every other
  problem its cross-attention form (``q_attn`` (E, E), packed k/v ``c_attn`` (E, 2E) on one
  key/value source); ``c_proj`` (E, E) is the output projection in both.
- ``hf.llama[eager|sdpa]``: ``LlamaAttention``, GQA (``num_key_value_heads``), self-attention
  only (query, key and value the same array; other problems are unsupported). The
  canonical problem has no positional encoding, so the rotary embedding is given identity
  position embeddings (cos = 1, sin = 0): that is translation, not a repair.

Modules are created in float64, loaded, then cast to the run's dtype (one rounding).

Masks: HF modules take the 4-D mask its model would build (``masking_utils``): for
``eager`` an additive float (B, 1|H, L, S) with ``torch.finfo(dtype).min`` where masked;
for ``sdpa`` a boolean (B, 1|H, L, S), True = attend, or none with the top-left causal flag
(``is_causal`` passed through the module to ``sdpa_attention_forward``). A canonical bias
has no separate input: it is folded into a float additive mask (fill ``finfo.min``).

Code paths: ``eager`` always computes and returns the attention weights, so one name each
covers it with weights; ``sdpa`` returns none (no ``weights`` feature).

Training mode (``Problem.dropout``, feature ``dropout``): the config's attention dropout
(BERT's ``attention_probs_dropout_prob``, GPT-2's ``attn_pdrop``, Llama's
``attention_dropout``) is the problem's, GPT-2's ``resid_pdrop`` (after ``c_proj``) stays 0,
and the module is in ``train()`` mode; its eager path drops the softmax's weights with
``F.dropout`` (GPT-2's upcast path with its ``attn_dropout``), sdpa passes ``dropout_p``.
torch's RNG is seeded per call from the problem's digest and the draw's index
(``implementations.hf.model.SeededDropout``). ``hf.llama`` is self-attention only, so the
dropout family's cases (all Lq != Lk) are unsupported there; ``tests/test_dropout.py``
judges its square forms.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
import transformers

from implementations.hf import model as hf_model
from implementations.hf.model import SeededDropout, attention_dropout
from implementations.torch.common import TorchModuleCore, _np
from suite.plugins import adapters
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Unsupported
from suite.spec.problem import Problem

IMPLEMENTATIONS = ("eager", "sdpa")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (a.shape == b.shape and np.array_equal(a, b, equal_nan=True))


def hf_mask(problem: Problem, attn: str, dtype: torch.dtype, device: torch.device
            ) -> Dict[str, Any]:
    """The canonical mask as the keyword arguments an HF attention module takes.

    eager: ``attention_mask`` additive float (B, 1|H, L, S), ``finfo(dtype).min`` where
    masked (as ``masking_utils.eager_mask``); sdpa: boolean (B, 1|H, L, S), True = attend (as
    ``masking_utils.sdpa_mask``), float additive when there is a bias, and ``is_causal``
    True only when the whole mask is top-left causal (SDPA's own flag).
    """
    if adapters.requested_form(problem):  # the mask form asked for, as the module takes it
        form = adapters.form_mask(problem, fill=float(torch.finfo(dtype).min))
        mask = None if form.attn is None else torch.as_tensor(form.attn, device=device)
        return {"attention_mask": mask if mask is None or mask.dtype == torch.bool
                else mask.to(dtype),
                "is_causal": "causal_flag" in adapters.form_parts(problem.mask_form)}
    parts = adapters.split_mask(problem, true_means="attend", key_padding=False,
                                native_causal=("top_left",), per_head=True)
    if attn != "sdpa" or not parts.only_causal:
        # sdpa_attention_forward drops is_causal whenever a mask is given (and eager has no
        # causal flag): fold the causal part into the mask.
        parts = adapters.split_mask(problem, true_means="attend", key_padding=False,
                                    native_causal=(), per_head=True)
    fill = float(torch.finfo(dtype).min)
    if parts.bias is not None or (attn == "eager" and parts.mask is not None):
        mask = torch.as_tensor(parts.additive(fill)).to(device, dtype)  # (B, H|1, L, S)
    elif parts.mask is not None:
        mask = torch.as_tensor(parts.mask, device=device)  # (B, H|1, L, S), True = attend
    else:
        mask = None
    return {"attention_mask": mask, "is_causal": parts.causal is not None}


class HFAttention(SeededDropout, TorchModuleCore):
    """One HF attention module with one attention implementation; subclasses build it."""

    framework = "hf"
    array_library = "torch"
    attn = "eager"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "dropout"})

    def framework_version(self) -> str:
        return transformers.__version__  # shown as "hf 5.x on torch"

    def prepare(self, problem, device, dtype, *, need_weights=False, grad=False):
        if not _same(problem.key, problem.value):
            raise Unsupported("the module takes one key/value source: key and value must be "
                              "the same array")
        state = super().prepare(problem, device, dtype, need_weights=need_weights, grad=grad)
        return self.seed_dropout(state, problem)

    def module_mask(self, problem: Problem, device: torch.device, dtype: torch.dtype
                    ) -> Dict[str, Any]:
        # The 4-D mask the module takes, built once in prepare, untimed (as the model would).
        return hf_mask(problem, self.attn, dtype, device)


def _load(layer: torch.nn.Module, param: adapters.Param) -> None:
    """Copy a weight and its bias (zeros when the problem has none but the layer does)."""
    layer.weight.copy_(torch.as_tensor(param.weight))
    if layer.bias is not None:
        layer.bias.copy_(torch.as_tensor(param.bias) if param.bias is not None
                         else torch.zeros_like(layer.bias))


def _grads(layer: torch.nn.Module, has_bias: bool) -> adapters.Param:
    g = _np(layer.weight.grad)
    return adapters.Param(g, _np(layer.bias.grad) if has_bias else None)


class HFBert(HFAttention):
    kv_source = "shared"  # keys and values both come from encoder_hidden_states
    features = HFAttention.features | {"cross", "grad"}
    layers = {"q": "query", "k": "key", "v": "value", "o": "out_linear"}

    def build(self, p):
        from transformers.models.bert.modeling_bert import BertConfig, BertCrossAttention

        config = BertConfig(hidden_size=p.E, num_attention_heads=p.H,
                            attention_probs_dropout_prob=attention_dropout(p),
                            attn_implementation=self.attn)
        module = BertCrossAttention(config)
        # The canonical output projection (BERT's sits in BertSelfOutput with a residual and
        # a LayerNorm): a plain linear layer after the module.
        module.out_linear = torch.nn.Linear(p.E, p.E, bias=p.weights.b_o is not None)
        return module.double()  # float64 before the canonical weights go in (no rounding)

    def load_weights(self, module, p):
        for role, param in adapters.to_linear(p.weights).items():
            _load(getattr(module, self.layers[role]), param)

    def weight_grads(self, module):
        has_bias = module.out_linear.bias is not None
        return adapters.grads_from_linear({r: _grads(getattr(module, n), has_bias)
                                           for r, n in self.layers.items()})

    def call(self, module, query, key, value, mask, need_weights):
        heads, weights = module(query, encoder_hidden_states=key, **mask)  # (B, L, H*D)
        return module.out_linear(heads), weights  # (B, L, E)


def gpt2_scaling(config: Any, head_dim: int, layer_idx: int) -> float:
    """The factor GPT-2's config asks q.k to be multiplied by: 1/sqrt(head_dim) when
    ``scale_attn_weights``, divided by ``layer_idx + 1`` when
    ``scale_attn_by_inverse_layer_idx``. These config options mean this on every
    transformers 5.x; where the module keeps the product differs by release (a ``scaling``
    attribute from 5.4, computed inside the attention functions before), so the adapter
    reads the config, never the module's attribute. What a release's attention path does
    with the options is the measurement (transformers < 5.4's sdpa path ignores both)."""
    scaling = head_dim ** -0.5 if config.scale_attn_weights else 1.0
    if config.scale_attn_by_inverse_layer_idx:
        scaling /= float(layer_idx + 1)
    return scaling


class HFGPT2(HFAttention):
    """Self-attention problems (query, key and value the same array, no gradients) run the
    self-attention module (packed q/k/v ``c_attn`` (E, 3E)); every other problem runs its
    cross-attention form (``q_attn`` (E, E) and packed k/v ``c_attn`` (E, 2E) on one
    key/value source), which takes the mask as ``encoder_attention_mask``."""

    kv_source = "shared"
    features = HFAttention.features | {"cross", "grad"}
    # GPT2Config options this name sets (the code paths they select) and the layer_idx.
    config_options: Dict[str, Any] = {}
    layer_idx = 0
    # Whether the canonical scale is folded into W_q and b_q (a declared re-layout: the
    # module multiplies q.k by its own ``scaling``, so q goes in times scale / scaling).
    fold_scale = False

    def shares_input(self, problem, grad):
        # Separate leaves are needed for the gradients of query and key.
        return not grad and _same(problem.query, problem.key)

    def config(self, p):
        """The GPT2Config this name builds its module from (no dropout but the attention's
        in training mode)."""
        from transformers.models.gpt2.modeling_gpt2 import GPT2Config

        return GPT2Config(n_embd=p.E, n_head=p.H, attn_pdrop=attention_dropout(p), resid_pdrop=0.0,
                          attn_implementation=self.attn, **self.config_options)

    def build_for(self, p, *, shared_input):
        """The self-attention module for one shared input, else the cross-attention one."""
        from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

        return GPT2Attention(self.config(p), is_cross_attention=not shared_input,
                             layer_idx=self.layer_idx).double()  # float64 before the weights

    def load_weights(self, module, p):
        scaling = gpt2_scaling(self.config(p), p.D, self.layer_idx)
        ratio = p.effective_scale / scaling  # 1 when the module's scale is canonical
        if self.fold_scale:  # q times scale / scaling: the module's q.k * scaling is canonical
            w = p.weights
            p = dataclasses.replace(p, weights=dataclasses.replace(
                w, w_q=w.w_q * ratio, b_q=None if w.b_q is None else w.b_q * ratio))
        elif abs(ratio - 1) > 1e-12:
            raise Unsupported(f"GPT2Attention scales q.k by {scaling:.6g}, the problem "
                              f"by {p.effective_scale:.6g}")
        packed = adapters.to_conv1d_packed(p.weights)  # c_attn (E, 3E), c_proj (E, E)
        _load(module.c_proj, packed["c_proj"])
        if not _is_cross(module):
            _load(module.c_attn, packed["c_attn"])
            return
        conv = adapters.to_conv1d(p.weights)  # role -> (in, out)
        _load(module.q_attn, conv["q"])
        kv_bias = None if conv["k"].bias is None else np.concatenate([conv["k"].bias,
                                                                      conv["v"].bias])
        _load(module.c_attn, adapters.Param(
            np.concatenate([conv["k"].weight, conv["v"].weight], axis=1), kv_bias))  # (E, 2E)

    def weight_grads(self, module):
        has_bias = module.c_proj.bias is not None
        E = module.c_proj.weight.shape[0]  # Conv1D (in, out): the embedding width
        kv = _grads(module.c_attn, has_bias)  # (E, 2E): k then v
        q = _grads(module.q_attn, has_bias)
        split = [None, None] if kv.bias is None else [kv.bias[:E], kv.bias[E:]]
        return adapters.grads_from_conv1d({
            "q": q, "k": adapters.Param(kv.weight[:, :E], split[0]),
            "v": adapters.Param(kv.weight[:, E:], split[1]), "o": _grads(module.c_proj, has_bias)})

    def call(self, module, query, key, value, mask, need_weights):
        if not _is_cross(module):
            return module(query, **mask)
        return module(query, encoder_hidden_states=key, encoder_attention_mask=mask["attention_mask"],
                      is_causal=mask["is_causal"])


def _is_cross(module) -> bool:
    """Whether a GPT2Attention is the cross-attention form: it has the separate query layer
    ``q_attn`` (a weight name, stable as checkpoints are; the module's own test too)."""
    return hasattr(module, "q_attn")


class HFLlama(HFAttention):
    """Self-attention only: one input for query, key and value (``kv_source = "self"``: the
    cases and sweeps give it key = value = query); gradients are not declared."""

    features = HFAttention.features | {"gqa"}
    kv_source = "self"

    def build(self, p):
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaConfig

        w = p.weights
        if p.D % 2:  # LlamaConfig's validate_rope refuses an odd head width
            raise Unsupported(f"LlamaAttention's rotary embedding needs an even head width, "
                              f"got D={p.D}")
        if (w.b_q is not None) != (w.b_o is not None):
            raise Unsupported("Llama's attention_bias switches the q, k, v and o biases together")
        config = LlamaConfig(hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.K,
                             head_dim=p.D, attention_bias=w.b_q is not None,
                             attention_dropout=attention_dropout(p),
                             attn_implementation=self.attn)
        return LlamaAttention(config, layer_idx=0).double()  # float64 before the weights go in

    def load_weights(self, module, p):
        for role, name in zip("qkvo", ("q_proj", "k_proj", "v_proj", "o_proj")):
            _load(getattr(module, name), adapters.to_linear(p.weights)[role])

    def prepare(self, problem, device, dtype, *, need_weights=False, grad=False):
        if not (_same(problem.query, problem.key) and _same(problem.key, problem.value)):
            raise Unsupported("LlamaAttention is self-attention only: query, key and value "
                              "must be the same array")
        return super().prepare(problem, device, dtype, need_weights=need_weights, grad=grad)

    def after_prepare(self, state: Dict[str, Any]) -> None:
        # Identity rotary embedding (cos = 1, sin = 0): the canonical problem has no
        # positional encoding, so none is applied; this translates, it repairs nothing.
        q = state["tensors"]["query"]
        cos = torch.ones(*q.shape[:2], state["p"].D, device=q.device,
                         dtype=q.dtype)  # (B, L, D): the head width the config was given
        state["mask"]["position_embeddings"] = (cos, torch.zeros_like(cos))

    def call(self, module, query, key, value, mask, need_weights):
        return module(query, **mask)  # mask: attention_mask, is_causal, position_embeddings


_MODELS = {"bert": HFBert, "gpt2": HFGPT2, "llama": HFLlama}
_VERSIONS = f"transformers {transformers.__version__}, torch {torch.__version__}"
# Measured behaviour per attention implementation, the same for every module here.
_NAN_PADDING = Deviation(
    "confined", "NaN in a masked key or value position gives NaN rows: the mask is added to "
                f"q.k^T (NaN + finfo.min is NaN) and 0 * NaN is NaN in weights @ v (measured, "
                f"{_VERSIONS})")
DEVIATIONS: Dict[str, Dict[str, Deviation]] = {
    "eager": {
        "fully_masked_rows": Deviation(
            "mean_values", "a query row with no key to attend gives the mean of the values: "
                           "HF's eager mask fills masked logits with finfo(dtype).min, not "
                           "-inf, so such a row's softmax is uniform (measured, "
                           f"{_VERSIONS})"),
        "nan_padding": _NAN_PADDING,
        "bias_masked_rows": Deviation(
            "nan", "a row whose every key a -inf float mask masks gives NaN: the eager path adds "
                   "the float mask to the logits and softmax of a row of -inf is NaN, unlike its "
                   f"boolean masks' finfo.min fill (measured, tiles and special_values cases, "
                   f"{_VERSIONS})"),
    },
    "sdpa": {"nan_padding": _NAN_PADDING},
}


# HF's 4-D masks: eager adds an additive float mask (finfo(dtype).min where masked) of any
# shape broadcastable to (B, H, L, S); sdpa hands a boolean or float one to SDPA, or takes
# is_causal alone.
_SHAPES_4D = ("BHLS", "B1LS", "11LS", "B11S", "BHL1")
MASK_FORMS = {
    "eager": frozenset(f"float_{s}" for s in _SHAPES_4D),
    "sdpa": frozenset({f"{k}_{s}" for k in ("bool", "float") for s in _SHAPES_4D}
                      | {"causal_flag"}),
}


# The sdpa path of a module agrees with its eager path (suite.conformance.families.contracts).
EAGER_PATH = (Contract("agrees_with_eager", "agrees", {"attn": "eager"},
                       "the module's sdpa attention computes what its eager attention does"),)


def variants() -> List[type]:
    """One class per module and attention implementation: ``hf.MODEL[eager|sdpa]``."""
    out = []
    for model, base in _MODELS.items():
        for attn in IMPLEMENTATIONS:
            features = base.features | ({"weights"} if attn == "eager" else set())
            cls = type(f"HF_{model}_{attn}", (base,), {
                "name": f"hf.{model}[{attn}]", "attn": attn, "features": frozenset(features),
                "deviations": hf_model.deviations_of(model, attn, DEVIATIONS, _VERSIONS),
                "mask_forms": MASK_FORMS[attn],
                "contracts": EAGER_PATH if attn == "sdpa" else (), "__module__": __name__})
            out.append(cls)
    return out + gpt2_config_variants() + hf_model.variants()


# GPT2Attention's config options that change the numbers, one name each (eager and sdpa
# where both take the option): the scale-changing ones fold the canonical scale into W_q.
GPT2_OPTIONS = {
    "unscaled": ({"scale_attn_weights": False}, 0, ("eager", "sdpa")),
    "scale_by_layer": ({"scale_attn_by_inverse_layer_idx": True}, 3, ("eager", "sdpa")),
    # reorder_and_upcast_attn is read on the eager path only (_upcast_and_reordered_attn).
    "upcast": ({"reorder_and_upcast_attn": True}, 0, ("eager",)),
}


# The families a config option's path changes: every fixed case; the random shapes of the
# hypothesis family (the most expensive per name) exercise the base name's shape handling,
# which these options do not touch.
PATH_FAMILIES = frozenset({"masking", "shapes", "numerics", "properties", "mask_forms", "tiles",
                           "special_values"})
# The upcast path (_upcast_and_reordered_attn) drops its weights with its own call of the
# module's attn_dropout, so it runs the dropout family too; the scale options change the
# logits before the softmax, not the dropout after it.
DROPOUT_PATH = {"upcast": {"dropout"}}


def gpt2_contracts(option: str, attn: str, layer_idx: int) -> Tuple[Contract, ...]:
    """What each config option must change, against the name without it (the contracts
    family): a scaling switch must change the output, the module then matching the oracle at
    the scale the switch gives (the fold is then a no-op: the module runs as configured);
    the upcast must bring float16 and bfloat16 closer to the oracle."""
    base = f"hf.gpt2[{attn}]"
    if option == "unscaled":
        return (Contract("unscaled", "differs", base, "scale_attn_weights=False: q.k is not "
                         "multiplied by 1/sqrt(head_dim)", scale=lambda p: 1.0),)
    if option == "scale_by_layer":
        return (Contract("scale_by_layer", "differs", base,
                         f"scale_attn_by_inverse_layer_idx=True at layer_idx {layer_idx}: q.k "
                         f"is also divided by layer_idx + 1",
                         scale=lambda p: p.effective_scale / (layer_idx + 1)),)
    if option == "upcast":
        return (Contract("upcast", "closer_to_oracle", base, "reorder_and_upcast_attn=True: "
                         "the scores and their softmax are computed in float32",
                         dtypes=frozenset({"float16", "bfloat16"})),)
    return ()


def gpt2_config_variants() -> List[type]:
    """``hf.gpt2[ATTN,OPTION]``: GPT2Attention built with one config option of
    ``GPT2_OPTIONS`` (a layer_idx > 0 where the option reads it). The scale is folded into
    W_q (declared ``fold_scale``), so every scale is expressible ("scale"); the fold changes
    W_q's gradient, so these names declare no gradients."""
    out = []
    for option, (config, layer_idx, attns) in GPT2_OPTIONS.items():
        for attn in attns:
            features = (HFGPT2.features - {"grad"}) | {"scale"} | (
                {"weights"} if attn == "eager" else set())
            out.append(type(f"HF_gpt2_{attn}_{option}", (HFGPT2,), {
                "name": f"hf.gpt2[{attn},{option}]", "attn": attn,
                "features": frozenset(features), "deviations": DEVIATIONS[attn],
                "mask_forms": MASK_FORMS[attn], "config_options": config,
                "layer_idx": layer_idx, "fold_scale": True,
                "families": PATH_FAMILIES | {"contracts"} | DROPOUT_PATH.get(option, set()),
                "contracts": gpt2_contracts(option, attn, layer_idx)
                + (EAGER_PATH if attn == "sdpa" else ()), "__module__": __name__}))
    return out
