"""Reproducer: GPT2Attention with scale_attn_by_inverse_layer_idx (eager, float16) gives NaN
where the keys hold large finite values under the mask (transformers 5.23.0, torch 2.13.0+cpu).
Needs only NumPy, torch and transformers.

The eager path computes ``matmul(q, k^T) * scaling`` with scaling = 1/(sqrt(D)*(layer_idx+1)):
the float16 product overflows to inf before the scale is applied, a masked inf logit stays
inf after ``+ finfo.min``, and the softmax of a row holding inf is NaN. The sdpa path (SDPA
scales before its matmul) and reorder_and_upcast_attn=True (baddbmm in float32 with alpha =
scaling) stay finite. The query here is 4 times a typical one (layer_idx + 1 = 4), as a model
whose logits the config scales down by 4 has.
"""
import numpy as np
import torch
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Config

torch.manual_seed(0)
B, L, S, E, H = 2, 4, 9, 16, 2
rng = np.random.default_rng(0)
query = torch.tensor(4 * rng.standard_normal((B, L, E)), dtype=torch.float16)
keys = rng.standard_normal((B, S, E))
keys[:, 5:] = 1e4  # padding the mask hides: large finite garbage
keys = torch.tensor(keys, dtype=torch.float16)
mask = torch.zeros(B, 1, L, S, dtype=torch.float16)
mask[..., 5:] = torch.finfo(torch.float16).min  # HF's additive 4-D mask

for attn, upcast in (("eager", False), ("eager", True), ("sdpa", False)):
    config = GPT2Config(n_embd=E, n_head=H, attn_pdrop=0.0, resid_pdrop=0.0,
                        scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=upcast,
                        attn_implementation=attn)
    torch.manual_seed(0)
    module = GPT2Attention(config, is_cross_attention=True, layer_idx=3).half().eval()
    with torch.no_grad():  # identity projections: q = query, k = v = keys
        module.q_attn.weight.copy_(torch.eye(E))
        module.c_attn.weight.copy_(torch.cat([torch.eye(E), torch.eye(E)], dim=1))
        for layer in (module.q_attn, module.c_attn):
            layer.bias.zero_()
        out, _ = module(query, encoder_hidden_states=keys, encoder_attention_mask=mask)
    print(f"{attn:5s} reorder_and_upcast_attn={upcast!s:5s}: NaN in {int(out.isnan().sum())} "
          f"of {out.numel()} outputs")
