"""A plugin whose forward kills its process (a segfaulting kernel: a compiler crashed
under load), and neighbours that work: the run goes on without the dead worker's case."""

import os

from implementations.numpy.mha import NumpyMHA


class Crashes(NumpyMHA):
    name = "crash.segfault"

    def run(self, state):
        if state["p"].L == 1 and state["p"].S > 1:  # a length-1 query against several keys
            os._exit(139)  # as a process killed by SIGSEGV reports it
        return super().run(state)


class Works(NumpyMHA):
    name = "crash.neighbour_works"


class CrashesToo(Crashes):
    """A second one, so both workers die close together (``two_crash.*``)."""

    name = "two_crash.segfault"


class WorksToo(NumpyMHA):
    name = "two_crash.neighbour_works"
