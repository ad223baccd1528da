"""Planted bug: reads a boolean mask's True as "masked" (torch.nn's polarity, misapplied)."""

import dataclasses

import numpy as np

from implementations.numpy.mha import NumpyMHA


class InvertedBool(NumpyMHA):
    name = "bug.inverted_bool"

    def prepare(self, problem, device, dtype, **kw):
        m = problem.mask
        if m.allowed is not None:
            problem = dataclasses.replace(problem, mask=dataclasses.replace(
                m, allowed=~np.asarray(m.allowed)))
        return super().prepare(problem, device, dtype, **kw)
