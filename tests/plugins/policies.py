"""Plugins that test declared deviations as checked policies, and the other verdicts:
a declaration must not excuse a different failure, a policy must be followed where it is
declared, a declaration no case needs is stale, a plugin may refuse a problem, and an
outcome that changes between fresh instances is flaky."""

import dataclasses

import numpy as np

from implementations.numpy.mha import NumpyMHA
from suite.plugins.declarations import Deviation
from suite.plugins.interface import Unsupported


class GarbageThrough(NumpyMHA):
    """Declares NaN padding, but ignores valid_lens: huge finite garbage in padded keys
    changes the output, which no NaN-padding policy excuses."""

    name = "policy.garbage_through"
    deviations = {"nan_padding": Deviation("confined", "planted: padding is not masked")}

    def prepare(self, problem, device, dtype, **kw):
        problem = dataclasses.replace(problem, mask=dataclasses.replace(problem.mask,
                                                                        valid_lens=None))
        return super().prepare(problem, device, dtype, **kw)


class _Unmasked(NumpyMHA):
    """A query row with no key to attend attends every key, as if nothing were masked."""

    def attend(self, q, k, v, mask, scale, need_weights):
        bias = mask.bias
        if bias is not None:
            dead = np.isneginf(bias).all(axis=-1, keepdims=True)  # (B, H|1, L, 1)
            mask = mask.replace(bias=np.where(dead, 0, bias).astype(bias.dtype))
        return super().attend(q, k, v, mask, scale, need_weights)


class ClaimsNaN(_Unmasked):
    """Declares NaN for fully masked rows but attends as if unmasked there: a failure."""

    name = "policy.claims_nan"
    deviations = {"fully_masked_rows": Deviation("nan", "planted: the claim is wrong")}


class ClaimsUnmasked(_Unmasked):
    """Declares what it does (attends as if unmasked): a checked deviation."""

    name = "policy.claims_unmasked"
    deviations = {"fully_masked_rows": Deviation("unmasked", "planted: the mask is dropped")}


class Stale(NumpyMHA):
    """Declares NaN rows but computes the spec's zero output: a stale declaration."""

    name = "policy.stale"
    deviations = {"fully_masked_rows": Deviation("nan", "planted: no longer true")}


class RefusesOneHead(NumpyMHA):
    """Cannot express H = 1 and says so in prepare."""

    name = "policy.refuses_one_head"

    def prepare(self, problem, device, dtype, **kw):
        if problem.H == 1:
            raise Unsupported("planted: this kernel needs at least two heads")
        return super().prepare(problem, device, dtype, **kw)


class Flaky(NumpyMHA):
    """Right in its first instance, off by 1e-3 in the next (a fresh instance per repeat)."""

    name = "policy.flaky"
    built = 0

    def __init__(self):
        super().__init__()
        type(self).built += 1
        self.off = 1e-3 if type(self).built % 2 == 0 else 0.0

    def run(self, state):
        out, weights = super().run(state)
        return out + self.off, weights
