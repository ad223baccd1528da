"""Masking, shapes, numerics, tiles and special values: every case against the float64 oracle
under the agreement rule."""

from __future__ import annotations

import pytest

from suite.cases import CASES
from suite.check import run_problem

AGREEMENT = [c for c in CASES
             if c.family in ("masking", "shapes", "numerics", "tiles", "special_values")]


@pytest.mark.parametrize("case", AGREEMENT, ids=[f"{c.family}/{c.name}" for c in AGREEMENT])
def test_case(case, conform):
    conform(case.family, case.name, case.seed,
            lambda impl, out: run_problem(impl, out, case.problem(),
                                          distinct_kv=case.distinct_kv))
