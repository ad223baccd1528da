"""Properties every implementation must have, whatever its numerics (the cases and their
judges: ``suite.conformance.families.properties``)."""

from __future__ import annotations

from suite.conformance.catalog import get


def test_permutation_equivariance(conform):
    """Unmasked self-attention: permuting the positions permutes the output."""
    conform.case(get("properties", "permutation_equivariance"))


def test_weights_are_distributions(conform):
    """Returned attention weights are >= 0 and each row sums to 1 (0 for a fully masked row)."""
    conform.case(get("properties", "weights_are_distributions"))


def test_batch_equals_items(conform):
    """A batched call equals the per-item calls."""
    conform.case(get("properties", "batch_equals_items"))


def test_repeatable(conform):
    """Two identical calls give bit-identical results."""
    conform.case(get("properties", "repeatable"))
