"""torch's bfloat16 matmul lets a NaN row poison the row above it when the inner dimension is
odd, on CPUs with AVX-512 BF16 / AMX.

``w @ v`` with w (2, 2, S, S) and v (2, 2, S, 8) in bfloat16, row S // 2 of w[1, 0] NaN: the
product's NaN rows should be exactly that one row. Prints, per S, the NaN rows of the product
and whether a row beside the NaN one is NaN too.
"""

import torch


def main() -> None:
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    torch.manual_seed(0)
    for S in (8, 16, 17, 31, 33, 64):
        w = torch.rand(2, 2, S, S).bfloat16()
        v = torch.randn(2, 2, S, 8).bfloat16()
        w[1, 0, S // 2] = float("nan")
        rows = sorted({r for b, h, r in torch.isnan(w @ v).any(-1).nonzero().tolist()})
        verdict = "NaN leaked into another row" if rows != [S // 2] else "ok"
        print(f"S = {S:2d}: NaN rows of the product {rows} (expected [{S // 2}]): {verdict}")


if __name__ == "__main__":
    main()
