"""A plugin whose every call takes a while, so a kill or Ctrl-C lands mid-measurement."""

import time

from implementations.numpy.mha import NumpyMHA

CALL_S = 0.05


class Slow(NumpyMHA):
    name = "slow.numpy"

    def run(self, state):
        time.sleep(CALL_S)
        return super().run(state)
