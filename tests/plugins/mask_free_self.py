"""A mask-free self-attention module (as timm's ``Attention``: one input, a fused qkv
projection, no mask argument) wrapped as a plugin: ``kv_source = "self"`` and no mask
feature, so every case it runs is unmasked self-attention."""

import torch

from implementations.torch.common import TorchModuleCore


class QKVAttention(torch.nn.Module):
    def __init__(self, dim: int, heads: int, bias: bool = True):
        super().__init__()
        self.heads = heads
        self.q_proj = torch.nn.Linear(dim, dim, bias=bias)
        self.k_proj = torch.nn.Linear(dim, dim, bias=bias)
        self.v_proj = torch.nn.Linear(dim, dim, bias=bias)
        self.out_proj = torch.nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, E), no mask
        B, L, E = x.shape

        def heads(t):
            return t.view(B, L, self.heads, E // self.heads).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out_proj(o.transpose(1, 2).reshape(B, L, E))


class MaskFreeSelf(TorchModuleCore):
    name = "self.mask_free"
    kv_source = "self"
    features = frozenset({"grad"})

    def build(self, p):
        return QKVAttention(p.E, p.H, bias=p.weights.b_q is not None)

    def shares_input(self, problem, grad):
        return True

    def call(self, module, query, key, value, mask, need_weights):
        return module(query), None
