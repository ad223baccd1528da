"""torch.compile's attention rewrite with a mask fails to compile once the scale varies.

Inductor's pattern matcher (torch/_inductor/fx_passes/fuse_attention.py) rewrites
``softmax(q @ k^T / s + mask) @ v`` into scaled_dot_product_attention. A compiled function
that takes ``s`` as a Python float compiles for the first value; called with another value
it recompiles with the float dynamic, and the rewrite hands that symbol to SDPA as its
``scale``: BackendCompilerFailed ("Expected a value of type 'Optional[float]' for argument
'scale' but instead found type 'FakeTensor'"). The same graph without the mask recompiles
fine. Prints what each call did.
"""

import torch


def with_mask(q, k, v, mask, inv_scale):
    return torch.softmax(q @ k.transpose(-2, -1) / inv_scale + mask, dim=-1) @ v


def without_mask(q, k, v, inv_scale):
    return torch.matmul(q, k.transpose(-2, -1)).div(inv_scale).softmax(dim=-1).matmul(v)


def main() -> None:
    print(f"torch {torch.__version__}")
    q = torch.randn(1, 2, 8, 16)
    mask = torch.zeros(1, 1, 8, 8)
    for name, fn, extra in (("without a mask", without_mask, ()),
                            ("with a mask", with_mask, (mask,))):
        compiled = torch.compile(fn)
        with torch.inference_mode():
            for inv_scale in (4.0, 2.0):
                try:
                    compiled(q, q, q, *extra, inv_scale)
                    print(f"{name}, 1/scale {inv_scale}: compiled")
                except Exception as exc:  # torch._dynamo.exc.BackendCompilerFailed
                    cause = exc
                    while cause.__cause__ is not None or getattr(cause, "inner_exception", None):
                        cause = cause.__cause__ or cause.inner_exception
                    print(f"{name}, 1/scale {inv_scale}: {type(exc).__name__}: "
                          f"{type(cause).__name__}: {str(cause).strip().splitlines()[0]}")


if __name__ == "__main__":
    main()
