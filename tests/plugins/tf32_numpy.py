"""Float32 attention whose matrix products round their operands to TF32 first, as a GPU's
tensor cores do by default in JAX and Triton: ``tf32.plain`` declares it (float32_dots=tf32),
``tf32.undeclared`` does not, ``tf32.ignores_mask`` declares it and also ignores the mask
(a real bug the declaration must not excuse)."""

from typing import Any, Dict

import numpy as np

from implementations.numpy.mha import NumpyMHA
from suite.plugins.adapters import AttendMask
from suite.plugins.declarations import VARIANT_FEATURES, Deviation
from suite.spec.oracle import round_to

TF32 = Deviation("tf32", "float32 products take TF32 operands (emulated in NumPy)")


def mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b with both operands rounded to TF32, accumulated in float32."""
    t = lambda x: round_to(x, "tf32").astype(np.float32)  # noqa: E731
    return np.matmul(t(a), t(b)).astype(np.float32)


class Tf32Undeclared(NumpyMHA):
    name = "tf32.undeclared"
    features = NumpyMHA.features - VARIANT_FEATURES  # its own core: no score variants

    def dtypes(self, device: str):
        return ("float32",)

    def run(self, s: Dict[str, Any]):
        p, w = s["p"], s["w"]
        B, L, S, H, K, D = p.B, p.L, p.S, p.H, p.K, p.D
        q, k, v = mm(s["query"], w["w_q"]), mm(s["key"], w["w_k"]), mm(s["value"], w["w_v"])
        if w["b_q"] is not None:
            q, k, v = q + w["b_q"], k + w["b_k"], v + w["b_v"]
        q = q.reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
        k = np.repeat(k.reshape(B, S, K, D).transpose(0, 2, 1, 3), H // K, axis=1)  # (B, H, S, D)
        v = np.repeat(v.reshape(B, S, K, D).transpose(0, 2, 1, 3), H // K, axis=1)  # (B, H, S, D)
        heads, weights = self.attend(q, k, v, s["mask"], s["scale"], s["need_weights"])
        out = mm(heads.transpose(0, 2, 1, 3).reshape(B, L, H * D), w["w_o"])  # (B, L, E)
        return (out if w["b_o"] is None else out + w["b_o"]), weights

    def attend(self, q, k, v, mask, scale, need_weights):
        scores = mm(q, k.transpose(0, 1, 3, 2)) * np.float32(scale)  # (B, H, L, S)
        if mask.bias is not None:
            scores = np.where(np.isneginf(mask.bias), -np.inf, scores + mask.bias)
        row_max = scores.max(axis=-1, keepdims=True)
        row_max[np.isneginf(row_max)] = 0
        e = np.exp(scores - row_max)
        total = e.sum(axis=-1, keepdims=True)
        total[total == 0] = 1
        weights = (e / total).astype(np.float32)
        return mm(weights, v), (weights if need_weights else None)


class Tf32Declared(Tf32Undeclared):
    name = "tf32.plain"
    deviations = {"float32_dots": TF32}


class Tf32IgnoresMask(Tf32Declared):
    name = "tf32.ignores_mask"

    def attend(self, q, k, v, mask, scale, need_weights):
        return super().attend(q, k, v, AttendMask(), scale, need_weights)
