"""jax.nn in float64 (JAX's 64-bit mode) without its float64_softmax declaration: its softmax
still runs in float32, so the float64 cases must fail it."""

from implementations.jax.nn import JaxNN


class JaxNNUndeclared(JaxNN):
    name = "x64.undeclared"

    def __init__(self) -> None:
        super().__init__()
        self.deviations = {k: v for k, v in self.deviations.items() if k != "float64_softmax"}
