"""Plugins whose work completes only inside synchronize (like a GPU or JAX dispatch)."""

import threading
import time

import numpy as np

from suite.plugins.interface import Implementation, Result

WORK_S = 0.05


class AsyncWork(Implementation):
    """run() only launches ~50 ms of work; synchronize() waits for it."""

    name = "async.honest"
    framework = "numpy"

    def prepare(self, problem, device, dtype, **kw):
        return {"p": problem, "thread": None}

    def run(self, state):
        state["thread"] = threading.Thread(target=time.sleep, args=(WORK_S,))
        state["thread"].start()
        return state

    def synchronize(self, state):
        state["thread"].join()

    def fetch(self, state, handle):
        p = state["p"]
        return Result(np.zeros((p.B, p.L, p.E)))


class NoBarrier(AsyncWork):
    """The same work with a barrier that does not wait: a timer would see only the launch."""

    name = "async.no_barrier"

    def synchronize(self, state):
        pass
