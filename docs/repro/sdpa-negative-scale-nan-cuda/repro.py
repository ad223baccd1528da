"""Reproducer: torch SDPA's fused CUDA kernels (FlashAttention and cuDNN) return NaN for
every row when the softmax scale is negative, in float16 and bfloat16; the math and
memory-efficient backends give the right answer. Needs torch with a CUDA device."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

if not torch.cuda.is_available():
    raise SystemExit("needs a CUDA device")
g = torch.Generator().manual_seed(0)
for dtype in (torch.float16, torch.bfloat16):
    q, k, v = (torch.randn(1, 2, n, 64, generator=g).to("cuda", dtype) for n in (3, 5, 5))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=-0.125)
    for backend in ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"):
        try:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                out = F.scaled_dot_product_attention(q, k, v, scale=-0.125)
        except RuntimeError as exc:
            print(f"{str(dtype):15s} {backend:20s} refused: {str(exc)[:60]}")
            continue
        print(f"{str(dtype):15s} {backend:20s} negative scale: NaN in {int(out.isnan().sum())} "
              f"of {out.numel()}, max error {(out.double() - ref).abs().max().item():.3g}")
