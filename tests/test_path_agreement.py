"""Paths of one module must agree (the ``agrees`` contract): a path that drops what the other
computes fails, even where the problem cannot express it; the problems carry the variants
both paths declare; a problem one path cannot take is left out, never failed."""

from __future__ import annotations

import numpy as np
import pytest

from suite.conformance.families import contracts
from suite.conformance.judge import Outcome
from suite.plugins.declarations import RELATIONS, Contract
from suite.plugins.interface import Unsupported, check_interface
from tests.conftest import planted


def _plugins():
    return planted("paths_planted")


def _judge(impl, dtype: str) -> Outcome:
    (case,) = contracts.cases_of(impl)
    return case.run(impl, Outcome(impl.name, "cpu", dtype, case.family, case.name, case.seed,
                                  "pass"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_path_that_drops_an_intrinsic_cap_fails_and_the_fixed_path_passes(dtype):
    """The held-out bug's shape: a module that caps at 50 by its config (the problem says
    nothing of it); its fused path dropped the cap. Against the oracle the buggy path passes
    and the eager one fails; the contract fails the pair, and passes once the path caps."""
    mod = _plugins()
    buggy = _judge(mod.CappedFusedDropsCap(), dtype)
    assert buggy.outcome == "fail", buggy.reason
    assert buggy.reason.startswith("agrees: the paths disagree on problem 0 (no mask)")
    (pair,) = buggy.comparisons
    assert pair.err > 1e-3 and pair.err > 100 * pair.bound, pair  # a cap of 50 on logits ~3
    fixed = _judge(mod.CappedFused(), dtype)
    assert fixed.outcome == "pass", fixed.reason
    assert "within the bound on all 8 problems" in fixed.reason
    assert fixed.comparisons[0].err == 0  # the same computation: bit-identical


def test_the_problems_carry_the_variants_both_paths_declare():
    mod = _plugins()
    out = _judge(mod.DeclaredFusedDropsCap(), "float32")
    assert out.outcome == "fail", out.reason
    assert "problem 4 (no mask, alibi, rel_bias, sinks, softcap, value_width)" in out.reason
    shared = frozenset({"softcap", "gqa"})
    ps = contracts.agreement_problems("x", shared)
    assert [p.softcap for p in ps] == [None] * 4 + [4.0] * 4
    assert [p.K for p in ps] == [4, 4, 2, 2] * 2
    assert [bool(p.mask.causal) for p in ps] == [False, True] * 4
    assert not any(p.alibi is not None or p.sinks is not None for p in ps)
    assert all(not p.has_variants() for p in contracts.agreement_problems("x", frozenset()))


def test_a_problem_one_path_cannot_take_is_left_out_and_none_is_unsupported():
    mod = _plugins()

    class CausalOnly(mod.CappedFused):
        """A decoder: every problem without a causal mask is refused."""

        name = "paths.causal_only"

        def prepare(self, problem, device, dtype, *, need_weights=False, grad=False):
            if not problem.mask.causal:
                raise Unsupported("the model is causal")
            return super().prepare(problem, device, dtype, need_weights=need_weights,
                                   grad=grad)

    out = _judge(CausalOnly(), "float32")
    assert out.outcome == "pass", out.reason
    assert "all 4 problems both run" in out.reason and "4 left out" in out.reason

    class Never(CausalOnly):
        name = "paths.never"

        def prepare(self, problem, device, dtype, *, need_weights=False, grad=False):
            raise Unsupported("nothing")

    out = _judge(Never(), "float32")
    assert out.outcome == "unsupported" and "no problem both sides run" in out.reason


def test_nan_in_one_path_only_is_a_disagreement():
    mod = _plugins()

    class NaNRow(mod.CappedFused):
        name = "paths.nan_row"

        def attend(self, q, k, v, mask, scale, need_weights):
            heads, w = super().attend(q, k, v, mask, scale, need_weights)
            heads = heads.copy()
            heads[0, 0, 0, 0] = np.nan
            return heads, w

    out = _judge(NaNRow(), "float32")
    assert out.outcome == "fail" and "NaN in different entries" in out.reason, out.reason


def test_agrees_is_a_declared_relation_and_checked():
    assert "agrees" in RELATIONS
    mod = _plugins()

    class Bad(mod.CappedFused):
        name = "paths.bad"
        contracts = (Contract("x", "agree", "paths.capped[eager]", "typo"),)

    with pytest.raises(TypeError, match="relation expected one of .*'agrees'"):
        check_interface(Bad)
    check_interface(mod.CappedFused)


# name -> the contract each built-in with several paths declares (the other side in words)
PATHS = {
    "torch.nn[sdpa]": "torch.nn[sdpa](need_weights=True)",
    "torch.nn[fast]": "torch.nn[fast](need_weights=True)",
    "torch.F_mha": "torch.F_mha(need_weights=True)",
    "torch.compile": "torch.compile(compiled=False)",
    "torch.compile[pattern]": "torch.compile[pattern](compiled=False)",
    "torch.sdpa[math]": "torch.sdpa",
    "hf.gpt2[sdpa]": "hf.gpt2[sdpa](attn='eager')",
    "hf.gpt2[sdpa,unscaled]": "hf.gpt2[sdpa,unscaled](attn='eager')",
    "hf.model.llama[sdpa]": "hf.model.llama[sdpa](attn='eager')",
    "hf.model.gemma2[flex]": "hf.model.gemma2[flex](attn='eager')",
    "flax.mha": "flax.mha(returns_weights=True)",
}


@pytest.mark.parametrize("name", list(PATHS))
def test_builtins_with_several_paths_declare_their_agreement(name):
    from suite.plugins.registry import shared

    entry = shared().entries.get(name)
    if entry is None or not entry.available:
        pytest.skip(f"{name} is not available here")
    agrees = [c for c in entry.impl.contracts if c.relation == "agrees"]
    assert len(agrees) == 1, entry.impl.contracts
    other = contracts.other_side(entry.impl, agrees[0])
    assert other.name == PATHS[name]
    assert type(other) is not type(entry.impl)


def test_torch_nn_sdpa_path_agrees_with_its_weights_path():
    """One built-in pair run for real (cheap): nn.MultiheadAttention's two paths."""
    from suite.plugins.registry import shared

    entry = shared().entries.get("torch.nn[sdpa]")
    if entry is None or not entry.available:
        pytest.skip("torch is not installed")
    out = _judge(entry.impl, "float32")
    assert out.outcome == "pass", out.reason
    assert "within the bound on all 8 problems both run" in out.reason


def test_a_sampled_run_gives_a_compiler_the_fold_over_pair_of_the_agreement_problems(monkeypatch):
    """Under --sample or --cover a per-shape compiler on either side runs two problems of
    causal x gqa x variants, all off and all on (problems 0 and 7): each factor at both of
    its levels; a plugin that compiles nothing runs all eight."""
    mod = _plugins()
    ps = contracts.agreement_problems("x", frozenset({"softcap", "gqa"}))
    pair = [ps[i] for i in contracts.SAMPLED_PROBLEMS]
    factors = [(bool(p.mask.causal), p.K == 2, p.softcap is not None) for p in pair]
    assert factors == [(False, False, False), (True, True, True)], factors
    monkeypatch.setattr(contracts, "SAMPLED", True)
    assert "within the bound on all 8 problems" in _judge(mod.CappedFused(), "float32").reason

    class Compiled(mod.CappedFused):
        compiles_per_shape = True

    fixed = _judge(Compiled(), "float32")
    assert fixed.outcome == "pass", fixed.reason
    assert "within the bound on all 2 problems" in fixed.reason
    assert "problems 0, 7 of 8" in fixed.reason

    class CompiledDropsCap(mod.CappedFusedDropsCap):
        compiles_per_shape = True

    assert _judge(CompiledDropsCap(), "float32").outcome == "fail"  # the bug still shows
    monkeypatch.setattr(contracts, "SAMPLED", False)
    assert "within the bound on all 8 problems" in _judge(Compiled(), "float32").reason


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_decode_steps_that_drop_an_intrinsic_cap_disagree_with_the_module_s_prefill(dtype):
    """Issue 50: the cap a module's config sets (the problem says nothing of it) kept by its
    prefill and dropped at its decode steps. generation/agrees_with_prefill runs the module's
    steps against its own one-call prefill: the pair disagrees from step 2 on; the module
    that caps on both paths agrees with itself (bit for bit)."""
    from implementations.numpy.mha import NumpyMHA
    from tests.conftest import run_catalog_case

    mod = _plugins()

    class StepsDropCap(planted("generation_planted").CountsChunks, mod.CappedEager):
        name = "paths.capped[steps_drop_cap]"

        def attend(self, q, k, v, mask, scale, need_weights):
            if self.decode_step():  # the plain kernel, without the cap
                return NumpyMHA.attend(self, q, k, v, mask, scale, need_weights)
            return super().attend(q, k, v, mask, scale, need_weights)

    out = run_catalog_case(StepsDropCap(), "generation", "agrees_with_prefill", dtype)
    assert out.outcome == "fail", out.reason
    assert out.reason.startswith("decode steps vs the module's own prefill") \
        and "(step 1 of 5" not in out.reason, out.reason
    fixed = run_catalog_case(mod.CappedEager(), "generation", "agrees_with_prefill", dtype)
    assert fixed.outcome == "pass", fixed.reason
