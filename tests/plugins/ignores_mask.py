"""Planted bug: accepts every mask and ignores it."""

from implementations.numpy.mha import NumpyMHA
from suite.plugins.adapters import AttendMask


class IgnoresMask(NumpyMHA):
    name = "bug.ignores_mask"

    def attend(self, q, k, v, mask, scale, need_weights):
        return super().attend(q, k, v, AttendMask(variants=mask.variants), scale, need_weights)
