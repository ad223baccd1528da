"""The shared conformance cases, declared as data: family, name, how to build the problem.

Every case builds its problem from a seed derived from its family and name (never from its
position in a list), so a failing test id
(``test_agreement.py::test_case[numpy-cpu-float32-masking/causal]``) replays exactly the
same arrays, and adding a case changes no other case's arrays. One ``Case`` type serves
every family with fixed inputs: the agreement families here (the problem against the float64
oracle under the agreement rule), the mask forms (``suite.conformance.families.mask_forms``)
and the property and gradient cases (``suite.conformance.families.properties``), whose
``judge`` checks a property instead;
``suite.conformance.catalog`` lists them all for ``mha-suite repro`` and the conformance tests.
"""

from __future__ import annotations

from typing import Dict, List

from suite.conformance.families import (
    decode,
    dropout,
    generation,
    lanes,
    layouts,
    masking,
    numerics,
    packed,
    paged,
    shapes,
    special_values,
    tiles,
    variants,
)
from suite.conformance.families.declare import (  # noqa: F401  (the cases' types, re-exported)
    CASES,
    Case,
    Judge,
    case,
    one_input,
)

# The families with fixed inputs, in their own modules (suite.conformance.families),
# registered in this order: the catalogue's and the tests' order (a case's inputs come
# from its name, never from its position).
FAMILIES = (masking, shapes, numerics, tiles, special_values, lanes, layouts, variants, decode,
            generation, packed, paged, dropout)
for _family in FAMILIES:
    for _name, _build, _kw in _family.BUILDERS:
        case(_family.FAMILY, _name, **_kw)(_build)


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
