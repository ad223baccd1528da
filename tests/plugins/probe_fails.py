"""A Flax module whose every call raises, as a library release that refuses the device does:
its dtype probes all fail, and its listing must say with which exception."""

from implementations.jax.flax import FlaxLinenFp32Softmax


class ProbeFails(FlaxLinenFp32Softmax):
    name = "probe.fails"

    def prepare(self, *args, **kwargs):
        raise RuntimeError("jax.device('cpu') is not supported by this release")
