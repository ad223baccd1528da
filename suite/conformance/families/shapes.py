"""The shapes family: B = 1, length 1, odd lengths, Lq != Lk with key != value, one head to
many, head width 1, GQA and MQA, no projection bias, self-attention."""

from __future__ import annotations

from suite.conformance.families.declare import family
from suite.spec.problem import make_problem

FAMILY = "shapes"
BUILDERS, case = family(FAMILY)

# --- shapes --------------------------------------------------------------------------------
@case("batch_1")
def _batch_1(seed):
    """B = 1."""
    return make_problem(seed, 1, 9, 9, 16, 2)


@case("length_1")
def _length_1(seed):
    """Lq = Lk = 1."""
    return make_problem(seed, 2, 1, 1, 16, 2)


@case("query_length_1")
def _query_length_1(seed):
    """A single query over many keys (decoding)."""
    return make_problem(seed, 2, 1, 37, 16, 2)


@case("odd_lengths", square=113)
def _odd(seed, square=None):
    """Lq = 113, Lk = 203: no tile or vector width divides them (self-attention: 113)."""
    if square is not None:
        return make_problem(seed, 2, square, square, 32, 4, self_attention=True)
    return make_problem(seed, 2, 113, 203, 32, 4)


@case("cross_key_ne_value", distinct_kv=True)
def _cross(seed):
    """Cross-attention, Lq != Lk, key != value."""
    return make_problem(seed, 2, 5, 17, 24, 3)


@case("one_head")
def _one_head(seed):
    """H = 1: the whole width is one head."""
    return make_problem(seed, 2, 10, 10, 16, 1)


@case("many_heads")
def _many_heads(seed):
    """H = 16 heads of width 4: head i owns columns [4i, 4i+4)."""
    return make_problem(seed, 2, 10, 10, 64, 16)


@case("head_width_1")
def _head_width_1(seed):
    """D = 1 (H = E)."""
    return make_problem(seed, 2, 6, 6, 8, 8)


@case("gqa")
def _gqa(seed):
    """GQA: H = 8 query heads share K = 2 kv heads; query head h reads kv head h // 4."""
    return make_problem(seed, 2, 9, 9, 32, 8, 2)


@case("gqa_groups_of_2", square=11)
def _gqa2(seed, square=None):
    """GQA with H = 4, K = 2: h // 2 and h % 2 differ for heads 1 and 2."""
    if square is not None:
        return make_problem(seed, 2, square, square, 32, 4, 2, self_attention=True)
    return make_problem(seed, 2, 9, 11, 32, 4, 2)


@case("mqa")
def _mqa(seed):
    """MQA: one kv head for all H = 4 query heads."""
    return make_problem(seed, 2, 9, 9, 32, 4, 1)


@case("no_projection_bias")
def _no_bias(seed):
    """Projections without biases."""
    return make_problem(seed, 2, 8, 8, 16, 2, bias=False)


@case("self_attention")
def _self(seed):
    """query, key and value are one array."""
    return make_problem(seed, 2, 12, 12, 16, 4, self_attention=True)


