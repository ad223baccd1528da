"""Plugins whose fetch returns something that is not a valid output."""

import numpy as np

from implementations.numpy.mha import NumpyMHA
from suite.plugins.interface import Result


class ReturnsList(NumpyMHA):
    name = "badout.list"

    def fetch(self, state, handle):
        return Result(super().fetch(state, handle).output.tolist())


class WrongShape(NumpyMHA):
    name = "badout.shape"

    def fetch(self, state, handle):
        return Result(super().fetch(state, handle).output[:, :1])


class ReturnsNaN(NumpyMHA):
    name = "badout.nan"

    def fetch(self, state, handle):
        return Result(np.full_like(super().fetch(state, handle).output, np.nan))


class BareArray(NumpyMHA):
    name = "badout.bare"

    def fetch(self, state, handle):
        return super().fetch(state, handle).output  # not a Result
