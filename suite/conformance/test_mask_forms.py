"""Mask forms: every form a plugin declares (``mask_forms``) against the float64 oracle.

The same canonical problem goes to the library in the form named by the case, produced by
``suite.adapters.form_mask`` without materialising what the library broadcasts itself, so
each of the library's broadcast and mask-merging paths is exercised; a form the plugin does
not declare is reported unsupported.
"""

from __future__ import annotations

import pytest

from suite.adapters import with_form
from suite.check import run_problem
from suite.mask_forms import CASES


@pytest.mark.parametrize("case", CASES, ids=[f"{c.family}/{c.name}" for c in CASES])
def test_mask_form(case, conform):
    def judge(impl, out):
        if case.form not in getattr(impl, "mask_forms", frozenset()):
            return out.classify("unsupported", f"does not declare mask form {case.form}")
        problem = case.problem(self_attention=getattr(impl, "kv_source", "") == "self")
        return run_problem(impl, out, with_form(problem, case.form))

    conform(case.family, case.name, case.seed, judge)
