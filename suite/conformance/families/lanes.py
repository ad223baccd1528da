"""The lanes family: lengths across one and two SIMD vectors, where a tail loop lives."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from suite.conformance.families.declare import family
from suite.conformance.families.special_values import _put
from suite.spec.problem import Mask, Problem, make_problem

FAMILY = "lanes"
BUILDERS, case = family(FAMILY)

# --- lanes: lengths across one and two SIMD vectors ------------------------------------------
# A CPU kernel's vector loop runs over whole vectors of keys (8 float32 lanes with AVX2, 16
# with AVX-512; 4 and 8 float64) and a scalar or masked tail after them: a key length under one
# vector runs the tail alone, and a bug there exists on one CPU and not the next. These cases
# put a NaN query row, NaN padding and rows with no key at key (and query) lengths on both
# sides of one and two vectors of every dtype and instruction-set level.
LANE_LENGTHS = (1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33)
LB, LE, LH = 2, 16, 2


def _lanes_nan_query(S: int):
    def build(seed: int) -> Problem:
        p = make_problem(seed, LB, S, S, LE, LH)
        return _put(p, "query", (1, S // 2, 3), np.nan)
    build.__doc__ = (f"Lq = Lk = {S}, no mask: NaN in query row (b=1, i={S // 2}); that output "
                     "row is NaN, no other.")
    return build


def _lanes_fully_masked(S: int):
    def build(seed: int) -> Problem:
        lens = np.arange(S)[None, :] % (S + 1) * np.array([[1], [0]])  # batch 1: no key at all
        lens[0, ::3] = 0  # every third row of batch 0 too
        return make_problem(seed, LB, S, S, LE, LH, mask=Mask(valid_lens=lens))
    build.__doc__ = (f"Lq = Lk = {S}, a key length per query row (row i sees i keys; every "
                     "third row of batch 0 and all of batch 1 see none): zero head outputs.")
    return build


def _lanes_nan_padding(S: int):
    def build(seed: int, square: Optional[int] = None) -> Problem:
        lens = np.array([S, max(1, S - 1 - S // 3)])
        p = make_problem(seed, LB, S, S, LE, LH, mask=Mask(valid_lens=lens),
                         self_attention=square is not None)
        pad = np.arange(S) >= lens[:, None]  # (B, S)
        key, value = p.key.copy(), p.value.copy()
        key[pad], value[pad] = np.nan, np.nan
        if square is not None:  # the one input: its padded query rows are NaN too
            return dataclasses.replace(p, query=key, key=key, value=key)
        return dataclasses.replace(p, key=key, value=value)
    build.__doc__ = (f"Lq = Lk = {S}, key lengths ({S}, {max(1, S - 1 - S // 3)}), padded keys "
                     "and values NaN: the output is unchanged, no NaN anywhere.")
    return build


for _S in LANE_LENGTHS:
    case(f"nan_query_S{_S}", finite=False)(_lanes_nan_query(_S))
    case(f"fully_masked_S{_S}")(_lanes_fully_masked(_S))
    if _S > 1:  # one key cannot be padded
        case(f"nan_padding_S{_S}", finite=False, square=_S)(_lanes_nan_padding(_S))


