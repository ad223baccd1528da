"""The numerics family: large logits, explicit and negative scales, long rows, wide heads."""

from __future__ import annotations

from suite.conformance.families.declare import family
from suite.spec.problem import make_problem

FAMILY = "numerics"
BUILDERS, case = family(FAMILY)

# --- numerics ------------------------------------------------------------------------------
@case("large_logits")
def _large_logits(seed):
    """Inputs scaled x30: logits in the hundreds must not overflow the softmax."""
    return make_problem(seed, 2, 16, 16, 32, 2, input_scale=30.0)


@case("explicit_scale")
def _explicit_scale(seed):
    """An explicit scale 0.37 instead of 1/sqrt(D)."""
    return make_problem(seed, 2, 10, 10, 32, 4, scale=0.37)


@case("negative_scale")
def _negative_scale(seed):
    """A negative scale -0.6: the softmax favours the least similar key."""
    return make_problem(seed, 2, 10, 10, 32, 4, scale=-0.6)


@case("long_rows", square=1024)
def _long_rows(seed, square=None):
    """Lk = 1024: the softmax sum accumulates many terms (self-attention: Lq = Lk = 1024)."""
    if square is not None:
        return make_problem(seed, 1, square, square, 32, 2, self_attention=True)
    return make_problem(seed, 1, 16, 1024, 32, 2)


@case("wide_heads")
def _wide_heads(seed):
    """D = 128: the q.k dot products accumulate many terms."""
    return make_problem(seed, 1, 16, 16, 256, 2)



