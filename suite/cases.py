"""The shared conformance cases, declared as data: family, name, how to build the problem.

Every case builds its problem from a seed derived from its name, so a failing
test id (``test_masking.py::test_case[numpy-cpu-float32-causal_top_left]``)
replays exactly the same arrays.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Callable, Dict, List

import numpy as np

from suite.problem import Mask, Problem, make_problem


@dataclasses.dataclass(frozen=True)
class Case:
    family: str  # masking, shapes, numerics, properties
    name: str
    build: Callable[[int], Problem]
    doc: str = ""
    # The case is about key != value: unsupported for a plugin with one key/value source.
    distinct_kv: bool = False

    @property
    def seed(self) -> int:
        return zlib.crc32(f"{self.family}/{self.name}".encode())

    def problem(self) -> Problem:
        return self.build(self.seed).validate()


CASES: List[Case] = []


def case(family: str, name: str, *, distinct_kv: bool = False):
    """Register a case; which declarable behaviours its problem exhibits is read from the
    problem itself (``suite.check.behaviours``), never from a tag."""
    def deco(fn: Callable[[int], Problem]) -> Callable[[int], Problem]:
        CASES.append(Case(family, name, fn, (fn.__doc__ or "").strip(), distinct_kv))
        return fn
    return deco


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed + 1)


# --- masking -------------------------------------------------------------------------------
B, L, E, H = 3, 11, 16, 4


@case("masking", "none")
def _none(seed):
    """No mask at all."""
    return make_problem(seed, B, L, 13, E, H)


@case("masking", "valid_lens")
def _valid_lens(seed):
    """Key padding: batch b sees keys j < valid_lens[b]."""
    return make_problem(seed, B, L, 13, E, H, mask=Mask(valid_lens=np.array([13, 5, 1])))


@case("masking", "valid_lens_per_query")
def _valid_lens_2d(seed):
    """valid_lens of shape (B, Lq): a length per query row."""
    vl = _rng(seed).integers(1, 14, size=(B, L))
    return make_problem(seed, B, L, 13, E, H, mask=Mask(valid_lens=vl))


@case("masking", "causal")
def _causal(seed):
    """Causal self-shaped attention, Lq == Lk."""
    return make_problem(seed, B, L, L, E, H, mask=Mask(causal=True))


@case("masking", "causal_top_left_short_query")
def _causal_tl_short(seed):
    """Causal, Lq < Lk, top-left aligned: query i sees keys j <= i."""
    return make_problem(seed, B, 7, 12, E, H, mask=Mask(causal=True))


@case("masking", "causal_top_left_long_query")
def _causal_tl_long(seed):
    """Causal, Lq > Lk, top-left aligned."""
    return make_problem(seed, B, 12, 7, E, H, mask=Mask(causal=True))


@case("masking", "causal_bottom_right_short_query")
def _causal_br_short(seed):
    """Causal, Lq < Lk, bottom-right aligned: query i sees keys j <= i + Lk - Lq."""
    return make_problem(seed, B, 7, 12, E, H, mask=Mask(causal=True, causal_align="bottom_right"))


@case("masking", "causal_bottom_right_long_query")
def _causal_br_long(seed):
    """Causal, Lq > Lk, bottom-right aligned: the first Lq - Lk rows see no key."""
    return make_problem(seed, B, 12, 7, E, H, mask=Mask(causal=True, causal_align="bottom_right"))


@case("masking", "bool_mask")
def _bool_mask(seed):
    """A boolean (B, H, Lq, Lk) mask, True = may attend (every row keeps one key)."""
    allowed = _rng(seed).random((B, H, L, 13)) < 0.6
    allowed[..., 0] = True
    return make_problem(seed, B, L, 13, E, H, mask=Mask(allowed=allowed))


@case("masking", "bool_mask_broadcast")
def _bool_mask_bcast(seed):
    """A boolean (Lq, Lk) mask broadcast over batch and heads."""
    allowed = _rng(seed).random((L, 13)) < 0.5
    allowed[:, 3] = True
    return make_problem(seed, B, L, 13, E, H, mask=Mask(allowed=allowed))


@case("masking", "bias")
def _bias(seed):
    """An additive float (B, H, Lq, Lk) bias."""
    bias = 2.0 * _rng(seed).standard_normal((B, H, L, 13))
    return make_problem(seed, B, L, 13, E, H, mask=Mask(bias=bias))


@case("masking", "bias_broadcast")
def _bias_bcast(seed):
    """An additive (1, H, 1, Lk) bias, ALiBi-like, broadcast over batch and queries."""
    bias = -0.5 * np.arange(13)[None, None, None, :] * np.arange(1, H + 1)[None, :, None, None]
    return make_problem(seed, B, L, 13, E, H, mask=Mask(bias=bias))


@case("masking", "bias_as_mask")
def _bias_as_mask(seed):
    """A 0/-inf additive bias: must agree with the equivalent boolean mask."""
    allowed = _rng(seed).random((B, 1, L, 13)) < 0.6
    allowed[..., 2] = True
    return make_problem(seed, B, L, 13, E, H, mask=Mask(bias=np.where(allowed, 0.0, -np.inf)))


@case("masking", "combined")
def _combined(seed):
    """valid_lens AND causal AND a boolean mask, plus a bias."""
    rng = _rng(seed)
    allowed = rng.random((B, 1, L, L)) < 0.7
    allowed[..., 0] = True
    return make_problem(seed, B, L, L, E, H, mask=Mask(
        valid_lens=np.array([L, 6, 2]), causal=True, allowed=allowed,
        bias=rng.standard_normal((1, H, L, L))))


def _padded(seed: int, fill: float) -> Problem:
    p = make_problem(seed, B, L, 13, E, H, mask=Mask(valid_lens=np.array([13, 5, 9])))
    key, value = p.key.copy(), p.value.copy()
    for b, n in enumerate(p.mask.valid_lens):
        key[b, n:] = fill
        value[b, n:] = fill
    return dataclasses.replace(p, key=key, value=value)


@case("masking", "nan_padding")
def _nan_padding(seed):
    """Padded keys and values hold NaN: the unpadded output must not change."""
    return _padded(seed, np.nan)


@case("masking", "garbage_padding")
def _garbage_padding(seed):
    """Padded keys and values hold 1e4 garbage: the unpadded output must not change."""
    return _padded(seed, 1e4)


@case("masking", "fully_masked_valid_lens")
def _fully_masked_vl(seed):
    """valid_lens 0 for one batch item: its rows attend to nothing, so output = b_o."""
    return make_problem(seed, B, L, 13, E, H, mask=Mask(valid_lens=np.array([13, 0, 4])))


@case("masking", "fully_masked_bool_row")
def _fully_masked_bool(seed):
    """A boolean mask with all-False query rows: those rows give a zero head output."""
    allowed = _rng(seed).random((B, H, L, 13)) < 0.6
    allowed[..., 0] = True
    allowed[1, :, 3] = False
    allowed[0, 2, 5] = False
    return make_problem(seed, B, L, 13, E, H, mask=Mask(allowed=allowed))


# --- shapes --------------------------------------------------------------------------------
@case("shapes", "batch_1")
def _batch_1(seed):
    """B = 1."""
    return make_problem(seed, 1, 9, 9, 16, 2)


@case("shapes", "length_1")
def _length_1(seed):
    """Lq = Lk = 1."""
    return make_problem(seed, 2, 1, 1, 16, 2)


@case("shapes", "query_length_1")
def _query_length_1(seed):
    """A single query over many keys (decoding)."""
    return make_problem(seed, 2, 1, 37, 16, 2)


@case("shapes", "odd_lengths")
def _odd(seed):
    """Lq = 113, Lk = 203: no tile or vector width divides them."""
    return make_problem(seed, 2, 113, 203, 32, 4)


@case("shapes", "cross_key_ne_value", distinct_kv=True)
def _cross(seed):
    """Cross-attention, Lq != Lk, key != value."""
    return make_problem(seed, 2, 5, 17, 24, 3)


@case("shapes", "one_head")
def _one_head(seed):
    """H = 1: the whole width is one head."""
    return make_problem(seed, 2, 10, 10, 16, 1)


@case("shapes", "many_heads")
def _many_heads(seed):
    """H = 16 heads of width 4: head i owns columns [4i, 4i+4)."""
    return make_problem(seed, 2, 10, 10, 64, 16)


@case("shapes", "head_width_1")
def _head_width_1(seed):
    """D = 1 (H = E)."""
    return make_problem(seed, 2, 6, 6, 8, 8)


@case("shapes", "gqa")
def _gqa(seed):
    """GQA: H = 8 query heads share K = 2 kv heads; query head h reads kv head h // 4."""
    return make_problem(seed, 2, 9, 9, 32, 8, 2)


@case("shapes", "gqa_groups_of_2")
def _gqa2(seed):
    """GQA with H = 4, K = 2: h // 2 and h % 2 differ for heads 1 and 2."""
    return make_problem(seed, 2, 9, 11, 32, 4, 2)


@case("shapes", "mqa")
def _mqa(seed):
    """MQA: one kv head for all H = 4 query heads."""
    return make_problem(seed, 2, 9, 9, 32, 4, 1)


@case("shapes", "no_projection_bias")
def _no_bias(seed):
    """Projections without biases."""
    return make_problem(seed, 2, 8, 8, 16, 2, bias=False)


@case("shapes", "self_attention")
def _self(seed):
    """query, key and value are one array."""
    return make_problem(seed, 2, 12, 12, 16, 4, self_attention=True)


# --- numerics ------------------------------------------------------------------------------
@case("numerics", "large_logits")
def _large_logits(seed):
    """Inputs scaled x30: logits in the hundreds must not overflow the softmax."""
    return make_problem(seed, 2, 16, 16, 32, 2, input_scale=30.0)


@case("numerics", "explicit_scale")
def _explicit_scale(seed):
    """An explicit scale 0.37 instead of 1/sqrt(D)."""
    return make_problem(seed, 2, 10, 10, 32, 4, scale=0.37)


@case("numerics", "negative_scale")
def _negative_scale(seed):
    """A negative scale -0.6: the softmax favours the least similar key."""
    return make_problem(seed, 2, 10, 10, 32, 4, scale=-0.6)


@case("numerics", "long_rows")
def _long_rows(seed):
    """Lk = 1024: the softmax sum accumulates many terms."""
    return make_problem(seed, 1, 16, 1024, 32, 2)


@case("numerics", "wide_heads")
def _wide_heads(seed):
    """D = 128: the q.k dot products accumulate many terms."""
    return make_problem(seed, 1, 16, 16, 256, 2)


def by_family() -> Dict[str, List[Case]]:
    out: Dict[str, List[Case]] = {}
    for c in CASES:
        out.setdefault(c.family, []).append(c)
    return out


def get(family: str, name: str) -> Case:
    for c in CASES:
        if c.family == family and c.name == name:
            return c
    raise KeyError(f"unknown case {family}/{name}")
