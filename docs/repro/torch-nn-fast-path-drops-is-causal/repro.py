"""Reproducer: torch.nn.MultiheadAttention's inference fast path ignores ``is_causal=True``
given without ``attn_mask`` (torch 2.13.0+cpu). Needs only torch.

``forward(x, x, x, is_causal=True)`` with no attn_mask: outside the fast path torch refuses
it ("Need attn_mask if specifying the is_causal hint"); on the fast path (eval mode, no
autograd, one tensor as query, key and value) it returns the output of attention with no mask
at all, need_weights True or False: every query attends the keys after it.
"""
import torch

torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
x = torch.randn(2, 9, 16)
future = torch.ones(9, 9, dtype=torch.bool).triu(1)  # True = not allowed: the causal mask
print(f"torch {torch.__version__}")
with torch.no_grad():
    for need_weights in (False, True):
        flag, _ = mha(x, x, x, is_causal=True, need_weights=need_weights)
        causal, _ = mha(x, x, x, attn_mask=future, need_weights=need_weights)
        unmasked, _ = mha(x, x, x, need_weights=need_weights)
        print(f"need_weights={need_weights}: is_causal alone vs the causal mask: max diff "
              f"{(flag - causal).abs().max():.3g}; vs no mask: {(flag - unmasked).abs().max():.3g}")
try:
    mha.train()
    mha(x, x, x, is_causal=True)
except RuntimeError as exc:
    print("outside the fast path:", exc)
