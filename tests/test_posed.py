"""``Result.posed`` (suite.plugins.interface.Posed): a plugin that computed another problem
than the one handed (a module as shipped: its own q, k and v) says which, and the judge takes
that problem's oracle and bound. Planted with NumPy plugins that compute the oracle of a
problem of their own: the honest one passes, one that says nothing or poses a problem it
did not compute fails, a posed problem with another mask or shape or a NaN of its own fails,
and a case that compares calls is unsupported."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from suite.plugins.interface import Implementation, Posed, Result
from suite.spec import oracle
from suite.spec.problem import Mask
from tests.conftest import run_catalog_case

CASES = ("none", "causal", "valid_lens", "bool_mask")


class OwnQuery(Implementation):
    """Attention on its own query (twice the input's, as a norm of its own would make it),
    returned with that problem as ``posed``."""

    name = "posed.own_query"
    features = frozenset({"valid_lens", "causal", "bool_mask", "bias", "scale", "weights", "cross",
                          "gqa"})
    says = True  # returns Result.posed

    def prepare(self, problem, device, dtype, **kw):
        return {"p": problem}

    def computes(self, p):
        return dataclasses.replace(p, query=p.query * 2.0)

    def poses(self, p, computed):
        return computed

    def run(self, state):
        p = state["p"]
        computed = self.computes(p)
        return p, computed, oracle.oracle(computed)

    def fetch(self, state, handle):
        p, computed, (out, w) = handle
        posed = Posed(self.poses(p, computed), "doubled its query") if self.says else None
        return Result(out, w, posed=posed)


class SaysNothing(OwnQuery):
    name, says = "posed.says_nothing", False


class PosesTheInput(OwnQuery):  # computed on twice the query, says it computed the input's
    name = "posed.poses_the_input"

    def poses(self, p, computed):
        return p


class PosesNoMask(OwnQuery):
    name = "posed.poses_no_mask"

    def computes(self, p):
        return dataclasses.replace(p, query=p.query * 2.0, mask=Mask())


class MakesNaN(OwnQuery):
    name = "posed.makes_nan"

    def computes(self, p):
        q = p.query * 2.0
        q[0, -1, 0] = np.nan
        return dataclasses.replace(p, query=q)


class DropsARow(OwnQuery):
    name = "posed.drops_a_row"

    def computes(self, p):
        return dataclasses.replace(p, query=p.query[:, 1:] * 2.0,
                                   mask=Mask()) if p.L > 1 else p


@pytest.mark.parametrize("name", CASES)
def test_a_posed_result_is_judged_on_the_problem_it_computed(name):
    assert run_catalog_case(OwnQuery(), "masking", name, "float64").outcome == "pass"
    said = run_catalog_case(SaysNothing(), "masking", name, "float64")
    assert said.outcome == "fail" and "doubled" not in said.reason


def test_a_posed_problem_the_plugin_did_not_compute_fails_with_how():
    out = run_catalog_case(PosesTheInput(), "masking", "causal", "float64")
    assert out.outcome == "fail" and out.reason.endswith("; doubled its query"), out.reason


@pytest.mark.parametrize("plugin, why", [
    (PosesNoMask, "another mask than the problem's"),
    (MakesNaN, "own query holds NaN or inf at batch 0"),
    (DropsARow, "the plugin computed B=")])
def test_a_posed_problem_that_is_no_attention_of_the_case_fails(plugin, why):
    out = run_catalog_case(plugin(), "masking", "causal", "float64")
    assert out.outcome == "fail" and why in out.reason, out.reason


def test_a_case_comparing_calls_is_unsupported_for_a_posed_result():
    out = run_catalog_case(OwnQuery(), "properties", "repeatable", "float64")
    assert out.outcome == "unsupported" and "Result.posed" in out.reason, out.reason
    assert run_catalog_case(SaysNothing(), "properties", "repeatable", "float64").outcome == "pass"
