"""Masking, shapes, numerics, tiles and special values: every case against the float64 oracle
under the agreement rule."""

from __future__ import annotations

import pytest

from suite.conformance.cases import CASES


@pytest.mark.parametrize("case", CASES, ids=[f"{c.family}/{c.name}" for c in CASES])
def test_case(case, conform):
    conform.case(case)
