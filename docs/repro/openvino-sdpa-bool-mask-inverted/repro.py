"""OpenVINO 2025.0-2025.2 CPU: ScaledDotProductAttention reads a boolean attention_mask inverted.

A one-node opset13 ScaledDotProductAttention, compiled for the CPU with an f32 precision hint,
given a boolean mask (True = attend, as the op's spec says) and the same mask as additive 0/-inf.
Prints the error of each against the float64 softmax of the mask and of its negation, then BUG
or ok.
"""
import numpy as np
import openvino as ov
from openvino import opset13 as op

rng = np.random.default_rng(0)
B, H, L, S, D = 2, 3, 4, 5, 8
q = rng.standard_normal((B, H, L, D)).astype(np.float32)
k = rng.standard_normal((B, H, S, D)).astype(np.float32)
v = rng.standard_normal((B, H, S, D)).astype(np.float32)
m = rng.random((B, H, L, S)) > 0.3
m[..., 0] = True  # every row attends a key
m[..., 1] = False  # and no row attends every key (so the negation empties no row)


def attention(mask):
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    s = np.where(mask, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def run(mask, element_type):
    params = [op.parameter(list(x.shape), ov.Type.f32) for x in (q, k, v)]
    pm = op.parameter(list(mask.shape), element_type)
    out = op.scaled_dot_product_attention(*params, pm, causal=False)
    compiled = ov.Core().compile_model(ov.Model([out.output(0)], params + [pm]), "CPU",
                                       {"INFERENCE_PRECISION_HINT": ov.Type.f32})
    return compiled([q, k, v, mask])[0]


print("openvino", ov.__version__)
got_bool = run(m, ov.Type.boolean)
got_float = run(np.where(m, 0, -np.inf).astype(np.float32), ov.Type.f32)
err = lambda got, mask: float(np.max(np.abs(got - attention(mask))))  # noqa: E731
print(f"boolean mask:  err vs mask {err(got_bool, m):.3g}, vs its negation {err(got_bool, ~m):.3g}")
print(f"additive mask: err vs mask {err(got_float, m):.3g}")
print("BUG" if err(got_bool, m) > 1e-4 else "ok")
