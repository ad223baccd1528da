"""A library whose fully masked rows depend on the dtype: it fills masked logits with -1e30,
so in float64/float32 a row with no key has equal logits (the mean of the values) and in
float16 the fill overflows to -inf (a row of -inf: NaN). Declared per dtype, and wrongly."""

import numpy as np

from implementations.numpy.mha import NumpyMHA
from suite.plugins.declarations import VARIANT_FEATURES, Deviation

MEAN = Deviation("mean_values", "planted: the -1e30 fill makes a dead row's logits equal")
NAN = Deviation("nan", "planted: the -1e30 fill overflows to -inf in float16")


class _MaskFill(NumpyMHA):
    features = NumpyMHA.features - VARIANT_FEATURES  # its own core: no score variants
    def attend(self, q, k, v, mask, scale, need_weights):
        with np.errstate(over="ignore", invalid="ignore"):
            fill = np.array(-1e30).astype(q.dtype)  # float16: -inf
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale  # (B, H, L, S)
            if mask.bias is not None:
                scores = np.where(np.isneginf(mask.bias), fill, scores + mask.bias)
            e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # (B, H, L, S)
            weights = e / e.sum(axis=-1, keepdims=True)
            return weights @ v, (weights if need_weights else None)  # (B, H, L, D)


class PerDtype(_MaskFill):
    name = "dtype_policy.right"
    deviations = {**NumpyMHA.deviations,
                  "fully_masked_rows": {"float64": MEAN, "float32": MEAN, "float16": NAN}}


class Swapped(_MaskFill):
    """Each dtype's policy declared for the other dtype."""

    name = "dtype_policy.swapped"
    deviations = {**NumpyMHA.deviations,
                  "fully_masked_rows": {"float64": NAN, "float32": NAN, "float16": MEAN}}


class OnePolicy(_MaskFill):
    """The single-policy form: right in float32, wrong in float16."""

    name = "dtype_policy.one"
    deviations = {**NumpyMHA.deviations, "fully_masked_rows": MEAN}
