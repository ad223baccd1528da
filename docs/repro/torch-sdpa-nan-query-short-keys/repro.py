"""Reproducer: torch's CPU SDPA (flash kernel) returns a row of zeros, not NaN, for a query
row holding NaN when the key length is under one SIMD vector (torch 2.13.0+cpu).

A NaN in a query row makes every logit of that row NaN, so softmax and the row's output are
NaN (the math backend and float64 reference give NaN). With fewer keys than one vector of
the kernel's accumulation type (8 float32 lanes at ATEN_CPU_CAPABILITY=default and avx2, 16
at avx512; half that in float64) every key sits in the vector loop's tail and the row comes
back as zeros. With an attn_mask the row is NaN. S = 4 shows it at every level on any x86
CPU; S = 8 and 13 only at avx512. Run it under each level:

    for c in default avx2 avx512; do ATEN_CPU_CAPABILITY=$c python repro.py; done

Exit status 0 when the zeros show at S = 4 (reproduced), 1 when the row is NaN (fixed).
Needs only torch.
"""
import sys

import torch
import torch.nn.functional as F

print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
torch.manual_seed(0)
zeroed = {}
for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
    bad = []
    for S in (1, 3, 4, 7, 8, 9, 13, 15, 16, 17):
        q = torch.randn(1, 2, 5, 8, dtype=dtype)
        k = torch.randn(1, 2, S, 8, dtype=dtype)
        v = torch.randn(1, 2, S, 8, dtype=dtype)
        q[0, 1, 2, 3] = float("nan")
        row = F.scaled_dot_product_attention(q, k, v)[0, 1, 2]
        if not torch.isnan(row).all():
            bad.append(S)
    zeroed[dtype] = bad
    print(f"{str(dtype):15s} NaN query row not NaN at key lengths S = {bad or 'none'}")
sys.exit(0 if 4 in zeroed[torch.float32] else 1)
