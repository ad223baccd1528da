"""A torch module with QK-norm and rotary embeddings, as shipped: the suite reads the q, k
and v it hands torch.nn.functional.scaled_dot_product_attention.

    mha-suite check --plugin examples/shipped_torch_module.py --impl 'plugin:*' -k masking
"""

import torch
import torch.nn.functional as F

from implementations.hf.shipped import ShippedCore
from suite.plugins.declarations import Deviation


def rotate(x):  # x (B, L, H, D): rotary embedding at positions 0..L-1, rotate-half pairs
    L, D = x.shape[1], x.shape[-1]
    freq = 10000.0 ** (-torch.arange(0, D, 2, dtype=x.dtype) / D)
    angle = torch.arange(L, dtype=x.dtype)[:, None] * freq  # (L, D/2)
    cos, sin = torch.cat([angle.cos()] * 2, -1)[:, None], torch.cat([angle.sin()] * 2, -1)[:, None]
    half = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + half * sin


class NormedRotaryAttention(torch.nn.Module):
    def __init__(self, E, H):
        super().__init__()
        self.H, self.qkv, self.out = H, torch.nn.Linear(E, 3 * E), torch.nn.Linear(E, E)
        self.q_norm, self.k_norm = torch.nn.RMSNorm(E // H), torch.nn.RMSNorm(E // H)

    def forward(self, x, mask=None):  # mask: True or 0 = attend (SDPA's attn_mask)
        B, L, E = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.H, -1).unbind(2)  # (B, L, H, D) each
        q, k = rotate(self.q_norm(q)), rotate(self.k_norm(k))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), attn_mask=mask)
        return self.out(o.transpose(1, 2).reshape(B, L, E))


class NormedRotary(ShippedCore):
    name, framework, capture = "mine.normed_rotary[shipped]", "torch", "sdpa"
    rotary = True  # rotate() turns pairs of the head width: an odd one is unsupported
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias"})
    deviations = {"nan_padding": Deviation(
        "confined", "a NaN in a masked key reaches SDPA's rows beside it (measured, torch "
                    "2.13.0+cpu: 16 nan_padding cases)")}

    def build(self, p):
        return NormedRotaryAttention(p.E, p.H)
