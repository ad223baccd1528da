"""A plugin whose forward never returns (a deadlocked kernel), and a neighbour that works."""

import time

from implementations.numpy.mha import NumpyMHA


class Hangs(NumpyMHA):
    name = "hang.forever"

    def run(self, state):
        time.sleep(3600)


class Works(NumpyMHA):
    name = "hang.neighbour_works"


class WrapsTheAlarm(NumpyMHA):
    """Hangs, and wraps whatever interrupts it in its own error, as compilers do (dynamo
    re-raises an exception from a traced call as InternalTorchDynamoError)."""

    name = "hang.wraps_the_alarm"

    def run(self, state):
        try:
            time.sleep(3600)
        except Exception as exc:
            raise RuntimeError(f"internal error: {exc}") from exc
