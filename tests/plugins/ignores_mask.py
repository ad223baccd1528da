"""Planted bug: accepts every mask and ignores it."""

from implementations.numpy_mha import NumpyMHA


class IgnoresMask(NumpyMHA):
    name = "bug.ignores_mask"

    def attend(self, q, k, v, bias, scale, need_weights):
        return super().attend(q, k, v, None, scale, need_weights)
