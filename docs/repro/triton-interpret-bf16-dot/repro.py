"""Reproducer: Triton's interpreter (triton 3.9.0, TRITON_INTERPRET=1) computes tl.dot of two
bfloat16 blocks wrongly on the CPU (errors ~1e10 on N(0, 1) inputs); float16 and float32 dots
are right. triton.flash works around it under the interpreter only (DOT_F32: float32
operands, the same arithmetic: a product of two bfloat16 numbers is exact in float32).

Run: python repro.py   (needs torch and triton; no GPU)
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # read when @triton.jit decorates, so before the kernel

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def dot(a, b, c, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(a + i[:, None] * N + i[None, :])  # (N, N)
    y = tl.load(b + i[:, None] * N + i[None, :])  # (N, N)
    tl.store(c + i[:, None] * N + i[None, :], tl.dot(x, y))  # float32 accumulation


torch.manual_seed(0)
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    a, b = torch.randn(16, 16).to(dtype), torch.randn(16, 16).to(dtype)
    c = torch.empty(16, 16)
    dot[(1,)](a, b, c, 16)
    err = (c - a.float() @ b.float()).abs().max().item()
    print(f"{dtype}: max error {err:.3g}", "WRONG" if err > 1e-2 else "ok")
