"""Reproducer: compiled FlexAttention on the CPU (torch 2.13.0+cpu) turns NaN rows into zeros.

A NaN in query row 4 makes every logit of that row NaN, so softmax and the head output are
NaN (eager flex_attention and SDPA give NaN); the compiled kernel returns 0 for the row.
A NaN in key 5 under a causal mask: rows 5.. read it and are NaN in eager; compiled, some
of them come back finite. Needs only NumPy and torch.
"""
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

rng = np.random.default_rng(0)
q, k, v = (torch.from_numpy(rng.standard_normal(s)).float()
           for s in ((2, 2, 11, 8), (2, 2, 11, 8), (2, 2, 11, 8)))
compiled = torch.compile(flex_attention, dynamic=False)

q_nan = q.clone()
q_nan[1, :, 4, 0] = float("nan")  # one element of query row 4, every head
sdpa = F.scaled_dot_product_attention(q_nan, k, v)
out = compiled(q_nan, k, v)
print("NaN query row: SDPA row (1, 0, 4) =", sdpa[1, 0, 4, :3].tolist(),
      "| compiled flex =", out[1, 0, 4, :3].tolist(), f"({int(out.isnan().sum())} NaN; 16 expected)")

k_nan = k.clone()
k_nan[0, :, 5, 0] = float("nan")  # key 5: rows i >= 5 attend it under a causal mask
block = create_block_mask(lambda b, h, i, j: j <= i, None, None, 11, 11, device="cpu")
out = compiled(q, k_nan, v, block_mask=block)
rows = out[0].isnan().any(-1).any(0)  # (L,)
print("NaN key 5, causal: rows with NaN (compiled flex):", rows.nonzero().flatten().tolist(),
      "| expected rows 5..10")
