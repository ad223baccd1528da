"""Planted bug: forgets the 1/sqrt(d) scale (uses 1)."""

from implementations.numpy.mha import NumpyMHA


class ForgetsScale(NumpyMHA):
    name = "bug.no_scale"

    def attend(self, q, k, v, mask, scale, need_weights):
        return super().attend(q, k, v, mask, q.dtype.type(1), need_weights)
