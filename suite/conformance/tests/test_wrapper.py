"""The wrapper's own translation: a module wrapper's weights read back and the mask it hands
its library, against the canonical problem, before any verdict on the library (the cases and
their judges: ``suite.conformance.families.wrapper``). Run them first with ``mha-suite check -k wrapper``."""

from __future__ import annotations

import pytest

from suite.conformance.families.wrapper import CASES


@pytest.mark.parametrize("case", CASES, ids=[f"{c.family}/{c.name}" for c in CASES])
def test_wrapper(case, conform):
    conform.case(case)
