"""FlexAttention's decoding path on CUDA (one query row, or four, against a 16- or 256-slot
cache with per-sequence lengths as a block mask), compiled, at head widths 16 and 64 (its
CUDA kernels refuse widths under 16, which the suite's decode cases use), against float64."""
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

dev = "cuda" if torch.cuda.is_available() else "cpu"
flex = torch.compile(flex_attention)
print("torch", torch.__version__, dev)
for dtype in (torch.float32, torch.bfloat16):
    for D in (16, 64):
        for Lq, S in ((1, 16), (4, 16), (1, 256)):
            B, H = 3, 4
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
                       for n in (Lq, S, S))
            lens = torch.tensor([S, S // 2 - 1, 1])
            off = lens - Lq  # the rows sit at the end of each sequence's cache (decode steps)
            lens_d, off_d = lens.to(dev), off.to(dev)

            def mask_mod(b, h, qi, kj):  # used in this iteration only: late binding is moot
                return (kj < lens_d[b]) & (kj <= qi + off_d[b])  # noqa: B023

            bm = create_block_mask(mask_mod, B, None, Lq, S, device=dev)
            try:
                out = flex(*(t.to(dev, dtype) for t in (q, k, v)), block_mask=bm)
                keep = (torch.arange(S)[None, None, :] < lens[:, None, None]) & \
                    (torch.arange(S)[None, None, :] <= torch.arange(Lq)[None, :, None] + off[:, None, None])
                s = (q @ k.transpose(-1, -2)) / D ** 0.5
                s = s.masked_fill(~keep[:, None], float("-inf"))
                ref = torch.nan_to_num(torch.softmax(s, -1)) @ v  # a row with no key: zero
                err = (out.double().cpu() - ref).abs().amax(dim=(1, 2, 3))
                res = f"max error per sequence {[round(e, 4) for e in err.tolist()]}"
            except Exception as exc:  # noqa: BLE001 - the library's answer is the result
                res = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            print(f"{str(dtype)[6:]:8s} D={D:3d} Lq={Lq} S={S:3d}: {res}")
