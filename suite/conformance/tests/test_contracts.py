"""Option contracts: what each declared option must change, both sides run on the same problems.

A plugin declares ``contracts`` (``suite.plugins.declarations.Contract``): another of its names, or itself
with an option set otherwise, must differ from it, or be farther from the float64 oracle.
Each contract is one case of the ``contracts`` family, for the implementations that declare
it (the judge and its sign test: ``suite.conformance.families.contracts``).
"""

from __future__ import annotations

from suite.conformance.families.contracts import cases_of  # noqa: F401  (read by the conftest: cases per target)


def test_contract(case, conform):
    conform.case(case)
