"""A subclass of a built-in (NumpyMHA, "numpy") with a bug in every output: a known-failure
entry listed under the built-in's name applies to it, as its declared deviations do."""

from implementations.numpy.mha import NumpyMHA


class Shifted(NumpyMHA):
    name = "mine.numpy_shifted"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, need_weights)
        return heads + 1e-2, weights
