"""A plugin whose forward never returns (a deadlocked kernel), and a neighbour that works."""

import time

from implementations.numpy_mha import NumpyMHA


class Hangs(NumpyMHA):
    name = "hang.forever"

    def run(self, state):
        time.sleep(3600)


class Works(NumpyMHA):
    name = "hang.neighbour_works"
