"""Plugins that fail in the ways a registry must survive."""

from implementations.numpy.mha import NumpyMHA
from suite.plugins.interface import Unavailable


class RaisesOnConstruct(NumpyMHA):
    name = "broken.construct"

    def __init__(self):
        raise Unavailable("needs a device this machine lacks")


class RaisesOnRun(NumpyMHA):
    name = "broken.run"

    def run(self, state):
        raise RuntimeError("kernel launch failed")


class Works(NumpyMHA):
    name = "broken.neighbour_works"
