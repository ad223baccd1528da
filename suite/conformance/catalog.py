"""Every conformance case with fixed inputs, one ``suite.conformance.cases.Case`` each: the
agreement families (``suite.conformance.cases``), the mask forms
(``suite.conformance.families.mask_forms``), the property and gradient cases
(``suite.conformance.families.properties``) and a module wrapper's own translation
(``suite.conformance.families.wrapper``). ``mha-suite repro`` and the conformance tests
look cases up here.

The Hypothesis family (``hypothesis/random_shapes``, ``hypothesis/random_inference``) is not
here: it draws its problems (derandomised, so ``--repeat`` replays it), which no one seed and
set of arrays can stand for.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from suite.conformance import cases
from suite.conformance.cases import Case
from suite.conformance.families import mask_forms, properties, wrapper

# Families whose problems are drawn, not fixed: no Case, no standalone reproducer.
DRAWN = {"hypothesis": "draws its problems with Hypothesis: random_shapes the shapes and masks, "
                       "random_inference the decode, packed and paged forms, each with the "
                       "score variants a plugin declares (derandomised: replay one with "
                       "mha-suite check -k random_shapes --repeat N, or -k random_inference)"}
# The drawn cases of each such family (each runs as ``test_<name>``).
DRAWN_CASES = {"hypothesis": ("random_shapes", "random_inference")}

# Tests that run one case and are named otherwise than it (test ids are kept: records and
# known failures match on them).
RENAMED = {"causal_gradients": "causality"}

ALL: List[Case] = [*cases.CASES, *mask_forms.CASES, *properties.CASES,
                   *wrapper.CASES]


def get(family: str, name: str) -> Case:
    """The case ``family/name``; KeyError naming the known ones otherwise."""
    for c in ALL:
        if c.family == family and c.name == name:
            return c
    raise KeyError(f"unknown case {family}/{name}; known: "
                   f"{', '.join(sorted(f'{c.family}/{c.name}' for c in ALL))}")


def of_family(family: str) -> List[Case]:
    """The cases of ``family``, in declaration order."""
    return [c for c in ALL if c.family == family]


def from_test(test: str, param: Optional[str]) -> Tuple[str, str]:
    """(family, name) of the case a test runs, from its function name and its case
    parameter: ``test_gradient[...-plain]`` runs gradients/plain, ``test_repeatable[...]``
    properties/repeatable, ``test_random_shapes[...]`` hypothesis/random_shapes (and each
    drawn case of ``DRAWN_CASES`` so)."""
    name = param or RENAMED.get(test.removeprefix("test_"), test.removeprefix("test_"))
    for family, drawn in DRAWN_CASES.items():
        if param is None and name in drawn:
            return family, name
    if test == "test_gradient":
        return "gradients", name
    found = [c for c in ALL if c.name == name and c.family in ("properties", "gradients")]
    return (found[0].family, name) if found else ("", name)
