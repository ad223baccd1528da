"""Reproducer: torch SDPA on the CPU (torch 2.13.0+cpu), float16/bfloat16, zeroes a row whose
float attn_mask holds +inf.

logit + inf is +inf, and softmax's logit - max is inf - inf = NaN, so the row is NaN, which
is what float32 (and float16 at small shapes, e.g. L=3, S=5) returns. At L=11, S=13 in
float16 and bfloat16 the row comes back as exact zeros instead. Needs only NumPy and torch.
"""
import numpy as np
import torch
import torch.nn.functional as F

rng = np.random.default_rng(0)
q = torch.from_numpy(rng.standard_normal((2, 2, 11, 8)))
k = torch.from_numpy(rng.standard_normal((2, 2, 13, 8)))
v = torch.from_numpy(rng.standard_normal((2, 2, 13, 8)))
mask = torch.from_numpy(rng.standard_normal((2, 2, 11, 13)))
mask[0, 1, 3, 4] = float("inf")
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    out = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype),
                                         attn_mask=mask.to(dtype))
    print(f"{str(dtype):15s} row (0, 1, 3) = {out[0, 1, 3, :3].float().tolist()}  "
          f"({int(out.isnan().sum())} NaN; 8 expected)")
