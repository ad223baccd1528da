"""One key/value source (as Hugging Face cross-attention's encoder_hidden_states): plugins
that read only ``key``, and one that does so without declaring it."""

import dataclasses
import os

from implementations.numpy.mha import NumpyMHA
from implementations.torch.eager import TorchEager

# Where the plugins write what they were given ("shared"/"distinct" a line), for the test.
SEEN_ENV = "MHA_SUITE_TEST_KV_SEEN"


def _note(problem) -> None:
    path = os.environ.get(SEEN_ENV)
    if path:
        with open(path, "a") as f:
            f.write("shared\n" if problem.value is problem.key else "distinct\n")


class SharedKV(NumpyMHA):
    """Declares one key/value source and uses ``key`` as the value, as such a module does."""

    name = "kv.shared"
    kv_source = "shared"

    def prepare(self, problem, device, dtype, **kw):
        _note(problem)
        return super().prepare(dataclasses.replace(problem, value=problem.key), device, dtype,
                               **kw)


class SharedKVGrad(TorchEager):
    """One key/value leaf in torch: its gradient is the key's and the value's together."""

    name = "kv.shared_grad"
    kv_source = "shared"

    def prepare(self, problem, device, dtype, **kw):
        _note(problem)
        state = super().prepare(problem, device, dtype, **kw)
        state["tensors"]["value"] = state["tensors"]["key"]  # one input tensor
        return state


class IgnoresValue(NumpyMHA):
    """Planted bug: uses ``key`` as the value without declaring one key/value source."""

    name = "bug.ignores_value"

    def prepare(self, problem, device, dtype, **kw):
        return super().prepare(dataclasses.replace(problem, value=problem.key), device, dtype,
                               **kw)
