"""A plugin that logs every call of its timed step to the file named by MHA_TEST_CALLS,
and sleeps, so each call is long enough to be timed one call a round."""

import os
import time

from implementations.numpy.mha import NumpyMHA

CALL_S = 0.02


class Counted(NumpyMHA):
    name = "counted.numpy"

    def run(self, state):
        with open(os.environ["MHA_TEST_CALLS"], "a") as f:
            f.write("call\n")
        time.sleep(CALL_S)
        return super().run(state)
