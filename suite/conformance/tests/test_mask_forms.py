"""Mask forms: every form a plugin declares (``mask_forms``) against the float64 oracle.

The same canonical problem goes to the library in the form named by the case, produced by
``suite.plugins.adapters.form_mask`` without materialising what the library broadcasts itself, so
each of the library's broadcast and mask-merging paths is exercised; a form the plugin does
not declare is reported unsupported (the cases and their judge: ``suite.conformance.families.mask_forms``).
"""

from __future__ import annotations

import pytest

from suite.conformance.families.mask_forms import CASES


@pytest.mark.parametrize("case", CASES, ids=[f"{c.family}/{c.name}" for c in CASES])
def test_mask_form(case, conform):
    conform.case(case)
