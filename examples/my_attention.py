"""A user's attention module, as many projects have one: four nn.Linear projections and
SDPA, with an explicit path that also returns the attention weights."""

import torch.nn.functional as F
from torch import nn


class MyAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key, value, mask=None, need_weights=False):
        """query (B, L, E), key/value (B, S, E); mask bool (B, 1|H, L, S), True = attend."""
        B, L, E = query.shape
        H, D = self.num_heads, E // self.num_heads

        def heads(x):  # (B, T, E) -> (B, H, T, D)
            return x.view(B, -1, H, D).transpose(1, 2)

        q, k, v = heads(self.q_proj(query)), heads(self.k_proj(key)), heads(self.v_proj(value))
        if need_weights:  # the explicit path: softmax(q k^T / sqrt(D)) v
            scores = q @ k.transpose(-1, -2) / D**0.5  # (B, H, L, S)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(-1)  # (B, H, L, S)
            out = weights @ v
        else:  # the fused path
            weights, out = None, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(B, L, E)), weights
