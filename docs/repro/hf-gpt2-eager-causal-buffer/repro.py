"""transformers < 5.2: GPT2Attention's eager path applies its causal buffer to self-attention.

A GPT2Attention (self-attention, attn_implementation="eager") called with no mask at all
should attend every key; on transformers 5.0.0 and 5.1.x it masks future keys anyway (its
registered lower-triangular ``bias`` buffer), so its output equals causal attention.
Run: python repro.py  (prints the error against plain and against causal attention).
"""

import torch
from transformers import __version__
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Config

torch.manual_seed(0)
B, L, E, H = 2, 6, 16, 4
config = GPT2Config(n_embd=E, n_head=H, attn_pdrop=0.0, resid_pdrop=0.0, attn_implementation="eager")
attn = GPT2Attention(config, layer_idx=0).double().eval()
x = torch.randn(B, L, E, dtype=torch.float64)
with torch.no_grad():
    out = attn(x)[0]  # (B, L, E), no mask given


def reference(causal: bool) -> torch.Tensor:
    q, k, v = attn.c_attn(x).split(E, dim=2)  # (B, L, E) each
    q, k, v = (t.view(B, L, H, E // H).transpose(1, 2) for t in (q, k, v))  # (B, H, L, D)
    s = q @ k.transpose(-1, -2) / (E // H) ** 0.5  # (B, H, L, L)
    if causal:
        s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    heads = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, E)  # (B, L, E)
    return attn.c_proj(heads)


with torch.no_grad():
    plain = (out - reference(causal=False)).abs().max().item()
    causal = (out - reference(causal=True)).abs().max().item()
print(f"transformers {__version__}: max abs error vs unmasked attention {plain:.3g}, "
      f"vs causal attention {causal:.3g}")
print("BUG: the causal buffer is applied to self-attention" if causal < 1e-12 < plain else "ok")
