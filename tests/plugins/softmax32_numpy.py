"""Float64 attention whose softmax runs in float32 (the logits cast down, the weights cast
back), as transformers' eager attention computes it for float64 inputs:
``softmax32.plain`` declares it (float64_softmax=float32), ``softmax32.undeclared`` does
not, ``softmax32.nan_rows`` declares it and also gives NaN for a row with no key to attend
(a real behaviour the declaration must not excuse: transformers' finfo(float64).min fill
becomes -inf in float32)."""

import numpy as np

from implementations.numpy.mha import NumpyCore, NumpyMHA
from suite.plugins.declarations import Deviation

SOFTMAX32 = Deviation("float32", "the softmax of float64 logits runs in float32 (emulated in "
                                 "NumPy)")


class Softmax32Undeclared(NumpyMHA):
    name = "softmax32.undeclared"
    features = NumpyCore.features | {"weights"}  # its own core: no variants, forms or dropout
    empty_rows_nan = False

    def dtypes(self, device: str):
        return ("float64",)

    def attend(self, q, k, v, mask, scale, need_weights):
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale  # (B, H, L, S), float64
        if mask.bias is not None:
            scores = np.where(np.isneginf(mask.bias), -np.inf, scores + mask.bias)
            v = np.where(np.isneginf(mask.bias).all(axis=-2)[..., None], 0, v)
        s32 = scores.astype(np.float32)  # the softmax in float32
        row_max = s32.max(axis=-1, keepdims=True)
        if not self.empty_rows_nan:
            row_max[np.isneginf(row_max)] = 0
        with np.errstate(invalid="ignore"):  # a row with no key: -inf - -inf (nan_rows)
            e = np.exp(s32 - row_max)
        total = e.sum(axis=-1, keepdims=True)
        if not self.empty_rows_nan:
            total[total == 0] = 1
        weights = (e / total).astype(np.float64)  # cast back
        return weights @ v, (weights if need_weights else None)


class Softmax32Declared(Softmax32Undeclared):
    name = "softmax32.plain"
    deviations = {**NumpyMHA.deviations, "float64_softmax": SOFTMAX32}


class Softmax32NanRows(Softmax32Declared):
    name = "softmax32.nan_rows"
    empty_rows_nan = True
