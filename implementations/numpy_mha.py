"""NumPy MHA: the tutorials' vectorised algorithm, and the adapter other NumPy kernels reuse.

``NumpyCore`` does the untimed and projection work; a NumPy attention kernel
subclasses it and supplies only ``attend(q, k, v, mask, scale, need_weights)`` (per-head
q, k, v -> head outputs), the signature the torch and jax cores share; ``mask`` is what
``attention_mask(problem, dtype)`` translates the canonical mask into: by default a
``suite.adapters.AttendMask`` of NumPy arrays in the compute dtype, which a kernel with
its own mask representation overrides (``numpy.flash`` keeps the mask in parts).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from suite.adapters import AttendMask, attend_mask
from suite.plugin import Deviation, Implementation, Result
from suite.problem import Problem

NP_DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16}


class NumpyCore(Implementation):
    """Projections, head split/merge and mask translation for NumPy kernels."""

    framework = "numpy"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale"})

    def framework_version(self) -> str:
        return np.__version__

    def dtypes(self, device: str):
        return ("float64", "float32", "float16")

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if device != "cpu":
            raise ValueError(f"device: expected 'cpu', got {device!r}")
        if dtype not in NP_DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(NP_DTYPES)}, got {dtype!r}")
        if need_weights and "weights" not in self.features:
            raise ValueError(f"need_weights: {self.name} does not return attention weights "
                             f"(feature 'weights' not declared), got True")
        t = NP_DTYPES[dtype]
        p = problem

        def cast(a: Optional[np.ndarray]) -> Optional[np.ndarray]:
            return None if a is None else np.ascontiguousarray(a, dtype=t)

        mask = self.attention_mask(p, t)
        return {"p": p, "dtype": t, "need_weights": need_weights,
                "query": cast(p.query), "key": cast(p.key), "value": cast(p.value),
                "w": {k: cast(v) for k, v in p.weights.as_dict().items()},
                "mask": mask, "scale": t(p.effective_scale)}

    def attention_mask(self, problem: Problem, dtype: type) -> Any:
        """The canonical mask in the form ``attend`` takes, built once in ``prepare``
        (untimed): an ``AttendMask`` whose bias carries -inf where the boolean parts forbid
        attention, in ``dtype``; a kernel with its own mask form overrides this."""
        def cast(a: Optional[np.ndarray]) -> Optional[np.ndarray]:
            return None if a is None else np.ascontiguousarray(a, dtype=dtype)

        return attend_mask(problem, put_float=cast)

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: AttendMask,
               scale: float, need_weights: bool):
        """q (B, H, L, D), k/v (B, H, S, D), mask.bias (B, H|1, L, S) or None.

        Returns (heads (B, H, L, D), weights (B, H, L, S) or None).
        """
        raise NotImplementedError

    def run(self, s: Dict[str, Any]):
        p, w = s["p"], s["w"]
        B, L, S, H, K, D = p.B, p.L, p.S, p.H, p.K, p.D
        q = s["query"] @ w["w_q"]  # (B, L, H*D)
        k = s["key"] @ w["w_k"]  # (B, S, K*D)
        v = s["value"] @ w["w_v"]  # (B, S, K*D)
        if w["b_q"] is not None:
            q += w["b_q"]
            k += w["b_k"]
            v += w["b_v"]
        q = q.reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
        k = k.reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
        v = v.reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
        if K != H:  # query head h reads kv head h // (H // K)
            k = np.repeat(k, H // K, axis=1)  # (B, H, S, D)
            v = np.repeat(v, H // K, axis=1)  # (B, H, S, D)
        heads, weights = self.attend(q, k, v, s["mask"], s["scale"], s["need_weights"])
        out = heads.transpose(0, 2, 1, 3).reshape(B, L, H * D) @ w["w_o"]  # (B, L, E)
        if w["b_o"] is not None:
            out += w["b_o"]
        return out, weights

    def fetch(self, state: Any, handle: Any) -> Result:
        out, weights = handle
        return Result(out.astype(np.float64),
                      None if weights is None else weights.astype(np.float64))


class NumpyMHA(NumpyCore):
    """Scores, masked softmax, weighted sum: the plain vectorised algorithm."""

    name = "numpy"
    features = NumpyCore.features | {"weights"}
    deviations = {"nan_padding": Deviation(
        "confined", "a NaN or inf value at a key masked for some rows but not all reaches those "
                    "rows: their weight there is 0 and 0 * NaN is NaN in weights @ v (values "
                    "masked for every row are zeroed first; measured, special_values cases)")}

    def attend(self, q, k, v, mask, scale, need_weights):
        bias = mask.bias
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale  # (B, H, L, S)
        if bias is not None:
            scores += bias
            # Padded keys may hold NaN/garbage: masked scores are exactly -inf, never NaN.
            scores[np.broadcast_to(np.isneginf(bias), scores.shape)] = -np.inf
        row_max = scores.max(axis=-1, keepdims=True)  # (B, H, L, 1)
        # A fully masked row has no finite logit: use 0 as its max so exp gives all zeros
        # (a +inf or NaN max stays: IEEE makes that row NaN, as the spec says).
        row_max[np.isneginf(row_max)] = 0
        scores -= row_max
        np.exp(scores, out=scores)  # softmax in the input dtype, max-subtracted
        total = scores.sum(axis=-1, keepdims=True)  # (B, H, L, 1)
        total[total == 0] = 1  # fully masked row: weights stay 0, so its head output is 0
        scores /= total
        if bias is not None:
            v = np.where(np.isneginf(bias).all(axis=-2)[..., None], 0, v)  # NaN padding: 0*NaN
        heads = scores @ v  # (B, H, L, D)
        return heads, (scores if need_weights else None)
