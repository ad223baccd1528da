"""A plugin whose calls take 10 ms or 40 ms in turn (as if another process took the core
every other round): its rounds' spread is far too wide for a ratio of medians."""

import itertools
import time

from implementations.numpy.mha import NumpyMHA


class Noisy(NumpyMHA):
    name = "noisy.numpy"
    _turn = itertools.cycle([0.01, 0.04])

    def run(self, state):
        time.sleep(next(self._turn))
        return super().run(state)

