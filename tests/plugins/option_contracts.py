"""Planted bugs for option contracts: options accepted and ignored, beside plugins that honour
them (the same NumPy algorithm in each)."""

import numpy as np

from implementations.numpy.mha import NumpyMHA
from suite.plugins.declarations import VARIANT_FEATURES, Contract


class HalfSoftmax(NumpyMHA):
    """Softmax in float16 (the run's dtype), or in float32 when ``fp32_softmax``, its weights
    rounded to float16 once."""

    name = "ok.fp32_softmax"
    features = NumpyMHA.features - VARIANT_FEATURES  # its own core: no score variants
    fp32_softmax = True
    honours_option = True
    contracts = (Contract("fp32_softmax", "closer_to_oracle", {"fp32_softmax": False},
                          "a float32 softmax rounds once, a float16 one at every step",
                          dtypes=frozenset({"float16"})),)

    def dtypes(self, device):
        return ("float16",)

    def attend(self, q, k, v, mask, scale, need_weights):
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale
        if mask.bias is not None:
            scores = scores + mask.bias
        if self.fp32_softmax and self.honours_option:
            scores = scores.astype(np.float32)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = (scores / scores.sum(axis=-1, keepdims=True)).astype(q.dtype)
        return weights @ v, (weights if need_weights else None)


class IgnoresFp32Softmax(HalfSoftmax):
    """Takes ``fp32_softmax`` and does nothing with it (as flax 0.8.3-0.8.4 did with
    ``force_fp32_for_softmax``)."""

    name = "bug.fp32_softmax_ignored"
    honours_option = False


class Unscaled(NumpyMHA):
    """``scaled = False`` multiplies q.k by 1 instead of the problem's scale."""

    name = "ok.unscaled"
    scaled = False
    honours_option = True
    contracts = (Contract("unscaled", "differs", {"scaled": True},
                          "without the scale, q.k is not multiplied by 1/sqrt(d)",
                          scale=lambda p: 1.0),)

    def attend(self, q, k, v, mask, scale, need_weights):
        scaled = self.scaled or not self.honours_option
        scale = q.dtype.type(self.module_scale if scaled else 1)
        return super().attend(q, k, v, mask, scale, need_weights)

    def prepare(self, problem, device, dtype, **kw):
        # The module's own scale (1/sqrt(d)), whatever the problem says: the option decides.
        self.module_scale = problem.D ** -0.5
        return super().prepare(problem, device, dtype, **kw)


class IgnoresUnscaled(Unscaled):
    """Takes ``scaled=False`` and scales anyway."""

    name = "bug.unscaled_ignored"
    honours_option = False
