"""A vision attention module as timm's ``Attention2d`` writes it: an NCHW feature map,
one fused 1x1 convolution for q, k and v, and a 1x1 convolution for the output."""

import torch.nn.functional as F
from torch import nn


class ConvAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, bias: bool = True):
        super().__init__()
        self.num_heads, self.dim_head = num_heads, dim // num_heads
        self.qkv = nn.Conv2d(dim, dim * 3, 1, bias=bias)
        self.proj = nn.Conv2d(dim, dim, 1, bias=bias)

    def forward(self, x):
        """x (B, C, H, W) -> (B, C, H, W): every position attends every position."""
        B, C, H, W = x.shape
        q, k, v = self.qkv(x).reshape(B, 3, self.num_heads, self.dim_head, -1).unbind(1)
        out = F.scaled_dot_product_attention(  # per head (B, heads, H*W, dim_head)
            q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(-1, -2))
        return self.proj(out.transpose(-1, -2).reshape(B, C, H, W))
