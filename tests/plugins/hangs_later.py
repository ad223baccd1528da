"""A plugin that answers its first calls and then hangs, saying so in a marker file: a run to
interrupt once some cases have finished ($MHA_SUITE_TEST_MARKER names the file)."""

import os
import time
from pathlib import Path

from implementations.numpy.mha import NumpyMHA

CALLS_BEFORE_HANGING = 4


class HangsLater(NumpyMHA):
    name = "later.hangs"
    calls = 0

    def run(self, state):
        type(self).calls += 1
        if type(self).calls > CALLS_BEFORE_HANGING:
            Path(os.environ["MHA_SUITE_TEST_MARKER"]).touch()
            time.sleep(3600)
        return super().run(state)
