"""Transformers attention layers as shipped (implementations/hf/shipped.py): their own
weights, norms and rotary embeddings, judged on the q, k and v they compute themselves.

    mha-suite check --plugin examples/shipped_layers.py --impl 'plugin:*' -k masking
"""

import math

import torch
import transformers
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
from transformers.models.gemma2 import modeling_gemma2 as g2
from transformers.models.gemma3 import modeling_gemma3 as g3
from transformers.models.gpt_oss import modeling_gpt_oss as oss
from transformers.models.llama import modeling_llama as llama

from implementations.hf.shipped import ShippedCore
from implementations.hf.transformers import DEVIATIONS


class LatentAttention(ShippedCore):  # DeepSeek-V3's MLA: q/kv latents, their RMSNorms, rope
    name = "mine.deepseek_v3_attention[shipped]"
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias", "scale", "weights",
                          "packed"})
    deviations = DEVIATIONS["eager"]  # transformers' eager mask: finfo.min, not -inf

    def build(self, p):
        c = transformers.DeepseekV3Config(
            hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.H, q_lora_rank=12,
            kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
            attn_implementation=self.attn)
        return self.layer(ds.DeepseekV3Attention(c, 0), ds.DeepseekV3RotaryEmbedding(c), p)


class RotaryAttention(ShippedCore):  # Llama: rotary q and k, grouped kv heads, sdpa
    name, attn, rotary = "mine.llama_attention[shipped,sdpa]", "sdpa", True
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias", "scale", "gqa", "packed"})
    deviations = DEVIATIONS["sdpa"]

    def build(self, p):
        c = transformers.LlamaConfig(hidden_size=p.E, num_attention_heads=p.H,
                                     num_key_value_heads=p.K, head_dim=p.D,
                                     attn_implementation=self.attn)
        return self.layer(llama.LlamaAttention(c, 0), llama.LlamaRotaryEmbedding(c), p)


class CappedAttention(ShippedCore):  # Gemma 2: the cap in its eager function, rotary
    name, rotary = "mine.gemma2_attention[shipped]", True
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias", "scale", "gqa",
                          "softcap", "weights", "packed"})
    deviations = DEVIATIONS["eager"]

    def build(self, p):
        c = transformers.Gemma2Config(
            hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.K, head_dim=p.D,
            query_pre_attn_scalar=p.D, attn_logit_softcapping=p.softcap,
            attn_implementation=self.attn)
        return self.layer(g2.Gemma2Attention(c, 0), g2.Gemma2RotaryEmbedding(c), p)


class QKNormAttention(ShippedCore):  # Gemma 3: RMSNorm on each q and k head, then rotary
    name, rotary = "mine.gemma3_attention[shipped]", True
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias", "scale", "gqa",
                          "weights", "packed"})
    deviations = DEVIATIONS["eager"]

    def build(self, p):
        c = transformers.Gemma3TextConfig(
            hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.K, head_dim=p.D,
            query_pre_attn_scalar=p.D, attn_logit_softcapping=p.softcap,
            attn_implementation=self.attn)
        attn = g3.Gemma3Attention(c, 0)
        return self.layer(attn, g3.Gemma3RotaryEmbedding(c), p, layer_type=attn.layer_type)


class SinkAttention(ShippedCore):  # gpt-oss: a sink logit per head in the softmax, rotary
    name, rotary = "mine.gpt_oss_attention[shipped]", True
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias", "scale", "gqa", "sinks",
                          "weights", "packed"})
    deviations = DEVIATIONS["eager"]

    def build(self, p):
        c = transformers.GptOssConfig(
            hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.K, head_dim=p.D,
            layer_types=["full_attention"], num_hidden_layers=1, attn_implementation=self.attn)
        attn = oss.GptOssAttention(c, 0)
        with torch.no_grad():  # the case's sinks (none: -inf); the layer leaves them empty
            attn.sinks.copy_(torch.full((p.H,), -math.inf) if p.sinks is None
                             else torch.tensor(p.sinks))
        return self.layer(attn, oss.GptOssRotaryEmbedding(c), p)
