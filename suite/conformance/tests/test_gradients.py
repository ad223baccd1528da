"""Gradients of sum(out * g) against the float64 oracle gradient (k = 3), and causality
(the cases and their judges: ``suite.conformance.families.properties``)."""

from __future__ import annotations

import pytest

from suite.conformance.catalog import get, of_family

GRADIENT = [c for c in of_family("gradients") if c.name != "causality"]


@pytest.mark.parametrize("case", GRADIENT, ids=[c.name for c in GRADIENT])
def test_gradient(case, conform):
    conform.case(case)


def test_causal_gradients(conform):
    """Causal mask: with dL/d(out) zero on rows >= 4, grads of query/key/value rows >= 4 are 0."""
    conform.case(get("gradients", "causality"))
