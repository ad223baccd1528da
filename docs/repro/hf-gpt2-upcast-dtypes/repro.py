"""Reproducer: GPT2Attention with reorder_and_upcast_attn=True (the eager path's
_upcast_and_reordered_attn) in float64 and in float16 (transformers 5.23.0, torch 2.13.0+cpu).
Needs only torch and transformers.

1. float64: the scores are computed in a float32 buffer (baddbmm into torch.empty(...,
   dtype=float32)), so a float64 module runs in float32 (error ~1e-7 against float64); with an
   attention mask, float32 scores + float64 mask promote to float64 and the path's own check
   raises "Error with upcasting, attn_weights does not have dtype torch.float32".
2. float16: HF's additive mask holds finfo(float16).min = -65504, added to float32 scores: a
   fully masked row's logits are all shifted by the same -65504, which float32 resolves, so
   the row attends as if unmasked (in float32/bfloat16 runs, finfo.min swamps the logits and
   the row is uniform).
"""
import torch
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Config

B, L, E, H = 1, 4, 8, 2
config = GPT2Config(n_embd=E, n_head=H, attn_pdrop=0.0, resid_pdrop=0.0,
                    reorder_and_upcast_attn=True, attn_implementation="eager")
torch.manual_seed(0)
x64 = torch.randn(B, L, E, dtype=torch.float64)

module = GPT2Attention(config, layer_idx=0).double().eval()
with torch.no_grad():
    module.c_attn.weight.normal_()  # logits of order 1, as trained weights give
    out, _ = module(x64)
    plain = GPT2Attention(GPT2Config(n_embd=E, n_head=H, attn_implementation="eager"),
                          layer_idx=0).double().eval()
    plain.load_state_dict(module.state_dict())
    ref, _ = plain(x64)
print("float64, no mask: max |upcast - plain eager| =", float((out - ref).abs().max()))
try:
    with torch.no_grad():
        module(x64, attention_mask=torch.zeros(B, 1, L, L, dtype=torch.float64))
except RuntimeError as exc:
    print("float64 with a mask raises:", exc)

module16 = module.half()
mask = torch.zeros(B, 1, L, L, dtype=torch.float16)
mask[:, :, 1] = torch.finfo(torch.float16).min  # query row 1 may attend no key
with torch.no_grad():
    w = module16(x64.half(), attention_mask=mask, output_attentions=True)[1]
print("float16, fully masked row 1, weights:", w[0, 0, 1].tolist(),
      "(uniform would be 0.25 each)")
