"""hf.*: Hugging Face transformers attention modules, each with its eager and sdpa attention.

Modules are built from small configs with random initial weights (no download, no
network), switched to eval mode (their dropout applies only in training), then loaded with
the canonical weights converted to their layout (untimed, in ``prepare``):

- ``hf.bert[eager|sdpa]``: ``BertCrossAttention``, separate ``query``/``key``/``value``
  ``nn.Linear`` (out, in); keys and values both come from ``encoder_hidden_states``, one
  source, so it expresses only problems with key == value. BERT keeps the output projection
  in ``BertSelfOutput`` together with a residual and a LayerNorm, so the canonical ``W_o``
  is applied after the module as a plain linear layer (the module has none to load).
- ``hf.gpt2[eager|sdpa]``: ``GPT2Attention``, the packed ``Conv1D`` ``c_attn`` (E, 3E) and
  ``c_proj`` (E, E), (in, out) layout; self-attention only (query == key == value).
- ``hf.llama[eager|sdpa]``: ``LlamaAttention``, GQA (``num_key_value_heads``), self-attention
  only. The canonical problem has no positional encoding, so the rotary embedding is given
  identity position embeddings (cos = 1, sin = 0): that is translation, not a repair.

Masks: HF modules take the 4-D mask its model would build (``masking_utils``): for
``eager`` an additive float (B, 1|H, L, S) with ``torch.finfo(dtype).min`` where masked;
for ``sdpa`` a boolean (B, 1|H, L, S), True = attend, or none with the top-left causal flag
(``is_causal`` passed through the module to ``sdpa_attention_forward``). A canonical bias
has no separate input: it is folded into a float additive mask (fill ``finfo.min``).

Code paths: ``eager`` always computes and returns the attention weights, so one name each
covers it with weights; ``sdpa`` returns none (no ``weights`` feature).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import torch
import transformers

from implementations.torch_common import TORCH_DTYPES, TorchCore, _np
from suite import adapters
from suite.plugin import Deviation, Result, Unsupported
from suite.problem import Problem

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


class HFAttention(TorchCore):
    """One HF attention module with one attention implementation; subclasses build it."""

    attn = "eager"
    source = "self"  # "self": query == key == value; "kv": key == value (one kv source)
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias"})

    def framework_version(self) -> str:
        return f"transformers {transformers.__version__}, torch {torch.__version__}"

    def build(self, p: Problem, dev: torch.device, t: torch.dtype) -> torch.nn.Module:
        raise NotImplementedError

    def call(self, s: Dict[str, Any]):
        """The timed module call -> (output (B, L, E), weights (B, H, L, S) or None)."""
        raise NotImplementedError

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
        if device not in self.devices():
            raise ValueError(f"device: expected one of {self.devices()}, got {device!r}")
        p, dev, t = problem, torch.device(device), TORCH_DTYPES[dtype]
        if not _same(p.key, p.value):
            raise Unsupported("the module takes one key/value source: key and value must be "
                              "the same array")
        if self.source == "self" and not _same(p.query, p.key):
            raise Unsupported("a self-attention module: query, key and value must be the "
                              "same array")
        module = self.build(p, dev, t).eval()

        def put(a):
            return torch.as_tensor(np.ascontiguousarray(a), device=dev).to(t)

        return {"p": p, "device": dev, "module": module, "query": put(p.query),
                "kv": put(p.key), "mask": hf_mask(p, self.attn, t, dev), "compile_s": None}

    def run(self, s: Dict[str, Any]):
        with torch.inference_mode():
            return self.call(s)

    def fetch(self, s: Dict[str, Any], handle) -> Result:
        out, weights = handle
        return Result(_np(out), None if weights is None else _np(weights))


def _copy(param: torch.nn.Parameter, value: Optional[np.ndarray]) -> None:
    with torch.no_grad():
        param.copy_(torch.as_tensor(value))


class HFBert(HFAttention):
    source = "kv"
    features = HFAttention.features | {"cross"}

    def build(self, p, dev, t):
        from transformers.models.bert.modeling_bert import BertConfig, BertCrossAttention

        config = BertConfig(hidden_size=p.E, num_attention_heads=p.H,
                            attention_probs_dropout_prob=0.0, attn_implementation=self.attn)
        module = BertCrossAttention(config).to(dev, t)
        lin = adapters.to_linear(p.weights)  # role -> (weight (out, in), bias)
        for role, layer in (("q", module.query), ("k", module.key), ("v", module.value)):
            _copy(layer.weight, lin[role].weight)
            _copy(layer.bias, lin[role].bias if lin[role].bias is not None
                  else np.zeros(layer.bias.shape))
        # The canonical output projection (BERT's sits in BertSelfOutput with a residual and
        # a LayerNorm): a plain linear layer after the module.
        out = torch.nn.Linear(p.E, p.E, bias=lin["o"].bias is not None).to(dev, t)
        _copy(out.weight, lin["o"].weight)
        if lin["o"].bias is not None:
            _copy(out.bias, lin["o"].bias)
        module.out_linear = out
        return module

    def call(self, s):
        m, mask = s["module"], s["mask"]
        heads, weights = m(s["query"], encoder_hidden_states=s["kv"], **mask)  # (B, L, H*D)
        return m.out_linear(heads), weights


class HFGPT2(HFAttention):
    def build(self, p, dev, t):
        from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Config

        config = GPT2Config(n_embd=p.E, n_head=p.H, attn_pdrop=0.0, resid_pdrop=0.0,
                            attn_implementation=self.attn)
        module = GPT2Attention(config, layer_idx=0).to(dev, t)
        packed = adapters.to_conv1d_packed(p.weights)  # c_attn (E, 3E), c_proj (E, E)
        for name in ("c_attn", "c_proj"):
            layer = getattr(module, name)
            _copy(layer.weight, packed[name].weight)
            _copy(layer.bias, packed[name].bias if packed[name].bias is not None
                  else np.zeros(layer.bias.shape))
        return module

    def call(self, s):
        return s["module"](s["query"], **s["mask"])


class HFLlama(HFAttention):
    features = HFAttention.features | {"gqa"}

    def build(self, p, dev, t):
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaConfig

        w = p.weights
        has_bias = w.b_q is not None
        if has_bias != (w.b_o is not None):
            raise Unsupported("Llama's attention_bias switches the q, k, v and o biases together")
        config = LlamaConfig(hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.K,
                             head_dim=p.D, attention_bias=has_bias, attention_dropout=0.0,
                             attn_implementation=self.attn)
        module = LlamaAttention(config, layer_idx=0).to(dev, t)
        lin = adapters.to_linear(w)
        for role, layer in zip("qkvo", (module.q_proj, module.k_proj, module.v_proj,
                                        module.o_proj)):
            _copy(layer.weight, lin[role].weight)
            if has_bias:
                _copy(layer.bias, lin[role].bias)
        # Identity rotary embedding: the canonical problem has no positional encoding.
        ones = torch.ones(p.B, p.L, p.D, device=dev, dtype=t)  # cos (B, L, D)
        module.identity_rope = (ones, torch.zeros_like(ones))  # sin = 0
        return module

    def call(self, s):
        m = s["module"]
        return m(s["query"], position_embeddings=m.identity_rope, **s["mask"])


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
    },
    "sdpa": {"nan_padding": _NAN_PADDING},
}


def variants() -> List[type]:
    """One class per module and attention implementation: ``hf.MODEL[eager|sdpa]``."""
    out = []
    for model, base in _MODELS.items():
        for attn in IMPLEMENTATIONS:
            features = base.features | ({"weights"} if attn == "eager" else set())
            cls = type(f"HF_{model}_{attn}", (base,), {
                "name": f"hf.{model}[{attn}]", "attn": attn, "features": frozenset(features),
                "deviations": DEVIATIONS[attn], "__module__": __name__})
            out.append(cls)
    return out
