"""Plugins that cannot be used: a constructor that raises, a class without the interface."""

from implementations.numpy.mha import NumpyMHA


class ConstructorRaises(NumpyMHA):
    name = "unusable.constructor"

    def __init__(self):
        raise RuntimeError("driver handshake failed")


class NoInterface:
    name = "unusable.interface"

    def run(self, state):
        return state
