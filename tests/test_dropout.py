"""The dropout family (#39 item 5): training mode judged by the draws' mean and spread."""

import dataclasses
import itertools

import numpy as np
import pytest

from suite.conformance.cases import by_family
from suite.conformance.families.dropout import DRAWS, dropout_problem, dropout_variance, z_for
from suite.spec.problem import InputError
from tests.conftest import planted, run_catalog_case

# The score variants in training mode (#50): their own tests below.
VARIANT_CASES = ["softcap_causal", "alibi_causal", "sinks_gqa", "rel_t5_encoder",
                 "score_mod_causal"]
FORM_CASES = ["packed_causal_docs"]  # an inference form in training mode (issue 50)
DROPOUT = [c.name for c in by_family()["dropout"]
           if c.name not in VARIANT_CASES + FORM_CASES]
STATISTICAL = [n for n in DROPOUT if n != "p_zero_is_eval"]


def _builtin(name):
    if name == "numpy":
        from implementations.numpy.mha import NumpyMHA

        return NumpyMHA()
    pytest.importorskip("torch")
    from implementations.torch.eager import TorchEager
    from implementations.torch.nn import TorchNN
    from implementations.torch.sdpa import TorchSDPA

    return {"torch.eager": TorchEager, "torch.sdpa": TorchSDPA, "torch.nn": TorchNN}[name]()


@pytest.mark.parametrize("impl", ["numpy", "torch.eager", "torch.sdpa", "torch.nn"])
@pytest.mark.parametrize("case", DROPOUT)
def test_the_references_pass(impl, case):
    out = run_catalog_case(_builtin(impl), "dropout", case, "float32")
    if impl == "torch.nn" and case in ("gqa", "independent_draws_gqa"):  # no GQA in nn.MHA
        assert out.outcome == "unsupported" and "gqa" in out.reason, out.reason
    else:
        assert out.outcome == "pass", out.reason


@pytest.mark.parametrize("bug, cases", [
    ("NoRescale", STATISTICAL),  # the mean shrinks by 1 - p
    ("Ignored", STATISTICAL),  # no spread
    ("SameMask", STATISTICAL),  # one mask every call: biased mean, no spread
    ("KeepProbability", ["mean_and_spread", "gqa"]),  # at p = 0.5 (masked) it is right
    ("OneMaskForAllHeads", ["masked"]),  # less spread (ratio about 0.8 there)
    ("OnTheOutput", ["gqa"]),  # whole head rows dropped (ratio about 0.77 there)
    ("DropsAtZero", ["p_zero_is_eval", *STATISTICAL]),
    # #50 item 4: masks related across batch items, heads or calls, each with the right
    # per-element mean and spread, fail only the joint statistics of independent_draws
    ("OneMaskForTheBatch", ["independent_draws"]),
    ("OneMaskForAllHeads", ["independent_draws"]),
    ("RepeatsEvery", ["independent_draws"]),
    ("RepeatsEvery50", ["independent_draws"]),
    ("OneMaskPerKVGroup", ["independent_draws_gqa"]),
])
def test_planted_dropout_bugs_fail(bug, cases):
    impl = getattr(planted("dropout_planted"), bug)()
    for case in cases:
        out = run_catalog_case(impl, "dropout", case, "float32")
        assert out.outcome == "fail", (bug, case, out.outcome)


@pytest.mark.parametrize("bug, statistic, case", [
    ("OneMaskForTheBatch", "batch", "independent_draws"),
    ("OneMaskForAllHeads", "heads", "independent_draws"),
    ("RepeatsEvery50", "call+50", "independent_draws"),
    ("OneMaskPerKVGroup", "heads", "independent_draws_gqa")])
def test_a_related_mask_fails_by_the_statistic_that_names_it(bug, statistic, case):
    """Each planted relation passes the per-element mean and spread of the twinned problem
    and fails its own correlation, which the verdict names with its value (a cycle of two
    masks fails the mean already: test_planted_dropout_bugs_fail)."""
    impl = getattr(planted("dropout_planted"), bug)()
    out = run_catalog_case(impl, "dropout", case, "float32")
    assert out.outcome == "fail" and f"{statistic} 1" in out.reason, out.reason
    assert "drew related masks" in out.reason, out.reason


def test_a_mask_per_kv_group_passes_every_case_without_gqa():
    """The mask shared by a group's query heads is right where every head is its own group:
    only the GQA twins show it (and the per-element statistics of ``gqa`` do not)."""
    impl = planted("dropout_planted").OneMaskPerKVGroup()
    for case in ("independent_draws", "mean_and_spread", "gqa"):
        out = run_catalog_case(impl, "dropout", case, "float32")
        assert out.outcome == "pass", (case, out.reason)


def test_twins_are_twins():
    """The twinned problem's eval-mode output: item 1 equals item 0, head 1's block head
    0's and head 3's head 2's, so any correlation of their draws comes from the masks."""
    from suite.conformance.families.dropout import _independent_draws, _independent_draws_gqa
    from suite.spec import oracle

    for square, build in itertools.product((None, 8), (_independent_draws, _independent_draws_gqa)):
        p = dataclasses.replace(build(5, square=square), dropout=None)
        out, _ = oracle.oracle(p)
        V = p.E // p.H
        np.testing.assert_array_equal(out[0], out[1])
        np.testing.assert_array_equal(out[..., 0:V], out[..., V:2 * V])
        np.testing.assert_array_equal(out[..., 2 * V:3 * V], out[..., 3 * V:4 * V])
        assert not np.array_equal(out[..., 0:V], out[..., 2 * V:3 * V])


def test_the_variance_is_what_the_draws_show():
    """The exact variance of one call against 4,000 draws of the reference's dropout, per
    element: within 15% where it is not tiny."""
    from suite.conformance.judge import attempt

    impl = planted("dropout_planted").NumpyMHA()
    p = dropout_problem(3, 0.3)
    draws = np.stack([attempt(impl, [p], "cpu", "float64")[0][0].output for _ in range(4000)])
    var = dropout_variance(p)
    live = var > 1e-3 * var.max()
    ratio = draws.var(axis=0, ddof=1)[live] / var[live]
    assert 0.85 < ratio.min() and ratio.max() < 1.15, (ratio.min(), ratio.max())
    assert dropout_variance(dataclasses.replace(p, dropout=0.0)).max() == 0.0


def test_z_is_the_bonferroni_quantile():
    import math

    for n in (1, 100, 5000):
        z = z_for(n)
        assert math.isclose(math.erfc(z / math.sqrt(2)), 1e-6 / n, rel_tol=1e-6)
    assert DRAWS >= 100


@pytest.mark.parametrize("rate", [1.0, -0.1, float("nan"), "0.1"])
def test_a_bad_dropout_is_one_line(rate):
    p = dataclasses.replace(dropout_problem(0, 0.1), dropout=rate)
    with pytest.raises(InputError, match=r"^dropout: expected None \(eval mode\) or a "
                                         r"probability in \[0, 1\), got "):
        p.validate()


# --- the built-ins whose libraries drop attention weights (Keras, Flax, Hugging Face) -------


def _keras(name="keras.mha"):
    pytest.importorskip("implementations.keras.mha")  # picks Keras's backend, then imports it
    from implementations.keras.mha import KerasMHA, KerasMHAWeights

    return {"keras.mha": KerasMHA, "keras.mha+weights": KerasMHAWeights}[name]


def _flax(name="flax.mha"):
    pytest.importorskip("flax")
    from implementations.jax.flax import FlaxLinenFp32Softmax, FlaxMHA

    return {"flax.mha": FlaxMHA, "flax.linen[fp32_softmax]": FlaxLinenFp32Softmax}[name]


def _hf(name):
    pytest.importorskip("transformers")
    from implementations.hf.transformers import variants

    (cls,) = [c for c in variants() if c.name == name]
    return cls


def _planted(base, name, **attrs):
    """A subclass of the built-in ``base`` with one attribute changed: the planted bug."""
    return type(name.replace(".", "_"), (base,), {"name": name, **attrs})()


@pytest.mark.parametrize("impl", ["keras.mha", "flax.mha", "flax.linen[fp32_softmax]",
                                  "hf.gpt2[sdpa]"])
def test_the_new_builtins_pass_masked(impl):
    """One statistical case each (float32): the full family runs in `mha-suite check`."""
    cls = _keras(impl) if impl.startswith("keras") else \
        _flax(impl) if impl.startswith("flax") else _hf(impl)
    out = run_catalog_case(cls(), "dropout", "masked", "float32")
    assert out.outcome == "pass", out.reason


@pytest.mark.parametrize("bug, cases", [
    # called with training=False: the layer's Dropout is skipped, no spread
    ("ignores_training", ["mean_and_spread"]),
    # one seed for every draw: each new layer draws the same mask
    ("one_seed", ["masked"]),
])
def test_keras_planted_dropout_fails(bug, cases):
    from implementations.keras import mha

    base = _keras()
    if bug == "ignores_training":
        impl = _planted(base, "planted.keras_ignores_training",
                        module_mask=lambda self, p: {**mha.call_kwargs(p), "training": False})
    else:
        impl = _planted(base, "planted.keras_one_seed", layer_kwargs={"seed": 1})
    for case in cases:
        out = run_catalog_case(impl, "dropout", case, "float32")
        assert out.outcome == "fail", (bug, case, out.outcome, out.reason)
        assert "spread" in out.reason or "mean" in out.reason, out.reason


@pytest.mark.parametrize("bug, kwargs, case", [
    # deterministic=True wins over the training-mode arguments: no dropout
    ("deterministic", {"deterministic": True}, "mean_and_spread"),
    # flax's default: one (L, S) mask shared by every batch item and head (median variance
    # ratio 0.78 on masked, measured flax 0.12.8)
    ("broadcast_dropout", {"broadcast_dropout": True}, "masked"),
])
def test_flax_planted_dropout_fails(bug, kwargs, case):
    impl = _planted(_flax(), f"planted.flax_{bug}", module_kwargs=kwargs)
    out = run_catalog_case(impl, "dropout", case, "float32")
    assert out.outcome == "fail", (bug, out.outcome, out.reason)
    assert "spread" in out.reason, out.reason


def test_hf_planted_one_seed_fails():
    """torch's RNG seeded alike for every draw: the same mask each call."""
    def seed_dropout(self, state, p):
        state["dropout_seed"] = 0
        return state

    impl = _planted(_hf("hf.bert[sdpa]"), "planted.hf_one_seed", seed_dropout=seed_dropout)
    out = run_catalog_case(impl, "dropout", "mean_and_spread", "float32")
    assert out.outcome == "fail", out.reason  # a biased mean, or no spread


@pytest.mark.parametrize("make", ["keras.mha", "flax.mha", "flax.linen[fp32_softmax]",
                                  "hf.gpt2[eager]"])
def test_draws_are_new_masks_and_a_run_replays(make):
    """Successive training-mode calls draw new masks; a fresh instance (a new run) draws
    the same sequence again (the seed is the problem's digest and the draw's index)."""
    from suite.plugins.interface import call, expressible

    cls = _keras(make) if make.startswith("keras") else \
        _flax(make) if make.startswith("flax") else _hf(make)
    p = expressible(cls(), dropout_problem(1, 0.3))  # hf.gpt2: one key/value source

    def three(impl):
        return [call(impl, p, "cpu", "float32").output for _ in range(3)]

    first, again = three(cls()), three(cls())
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])


def _square(impl, seed, rate, K=None):
    """The self-attention form of the family's statistical cases (Lq = Lk = 8, key padding
    8 and 5, causal when the model is, BLOOM's own ALiBi), for the names that take only
    their own hidden states (kv_source "self"): the family's cases have Lq != Lk."""
    from suite.spec.problem import Alibi, Mask, make_problem
    from suite.spec.variants import alibi_slopes

    mask = Mask(valid_lens=np.array([8, 5]), causal=bool(getattr(impl, "causal", True)))
    p = make_problem(seed, 2, 8, 8, 16, 4, K=K, self_attention=True, mask=mask)
    if "alibi" in impl.features:
        p = dataclasses.replace(p, alibi=Alibi(alibi_slopes(4), "key"))
    return dataclasses.replace(p, dropout=rate)


def _judge_square(impl, p):
    from suite.conformance.families.dropout import _judge_draws
    from suite.conformance.judge import Outcome

    return _judge_draws(impl, Outcome(impl.name, "cpu", "float32", "dropout", "square", 0,
                                      "pass"), p)


@pytest.mark.parametrize("name, K", [
    ("hf.llama[sdpa]", 2),  # GQA
    ("hf.model.gpt2[eager]", None),  # resid_pdrop and embd_pdrop stay 0
    ("hf.model.bloom[eager]", None),  # hidden_dropout (its residual add) stays 0
    ("hf.model.bert[sdpa]", None),  # an encoder: padding only; hidden_dropout_prob stays 0
])
def test_hf_self_attention_names_pass_their_square_forms(name, K):
    impl = _hf(name)()
    out = _judge_square(impl, _square(impl, 1, 0.5 if K is None else 0.3, K))
    assert out.outcome == "pass", out.reason


def test_hf_flex_names_leave_dropout_undeclared():
    """transformers' flex_attention_forward raises for any dropout above 0."""
    pytest.importorskip("transformers")
    from implementations.hf.transformers import variants

    flex = [c for c in variants() if c.name.endswith("[flex]")]
    assert flex and all("dropout" not in c.features for c in flex)
    assert all("dropout" in c.features for c in variants() if not c.name.endswith("[flex]"))


@pytest.mark.parametrize("case", VARIANT_CASES)
def test_variants_in_training_mode_pass_on_the_references_and_a_path_that_drops_them_fails(case):
    """Gemma 2's cap, ALiBi and gpt-oss's sinks with dropout: the references pass; a plugin
    whose training path leaves the variant out (eval mode keeps it) fails the draws' mean; a
    library that takes no such variant says so (unsupported)."""
    assert {c.name for c in by_family()["dropout"]} >= set(VARIANT_CASES)
    out = run_catalog_case(_builtin("numpy"), "dropout", case, "float32")
    assert out.outcome == "pass", out.reason
    bug = planted("dropout_planted").VariantsDroppedInTraining()
    out = run_catalog_case(bug, "dropout", case, "float32")
    assert out.outcome == "fail" and "standard errors" in out.reason, (out.outcome, out.reason)
    pytest.importorskip("torch")
    assert run_catalog_case(_builtin("torch.eager"), "dropout", case, "float32").outcome == "pass"
    out = run_catalog_case(_builtin("torch.sdpa"), "dropout", case, "float32")
    assert out.outcome == "unsupported", out.reason


@pytest.mark.parametrize("square", [False, True])
def test_a_training_path_that_drops_only_the_score_mod_fails_its_case(square):
    """score_mod_causal (cross and square forms): a plugin whose training path leaves the
    score modifier out, every other variant kept, fails the draws' mean; the same plugin
    passes the capped case (its cap kept in training)."""
    bug = planted("score_mod_planted").TrainingDropsScoreMod
    if square:
        bug = type("SquareBug", (bug,), {"kv_source": "self"})
    out = run_catalog_case(bug(), "dropout", "score_mod_causal", "float32")
    assert out.outcome == "fail" and "standard errors" in out.reason, (out.outcome, out.reason)
    out = run_catalog_case(bug(), "dropout", "softcap_causal", "float32")
    assert out.outcome == "pass", out.reason


def test_packed_sequences_in_training_mode_pass_on_the_references_and_a_path_that_joins_them_fails():
    """Padding-free training: the references pass the packed dropout case; a plugin whose
    training path lets packed sequences attend each other (its eval path keeps them apart)
    fails the draws' mean; a library that does not pack says so."""
    case = FORM_CASES[0]
    out = run_catalog_case(_builtin("numpy"), "dropout", case, "float32")
    assert out.outcome == "pass", out.reason
    bug = planted("dropout_planted").PackedAcrossInTraining()
    out = run_catalog_case(bug, "dropout", case, "float32")
    assert out.outcome == "fail" and "standard errors" in out.reason, (out.outcome, out.reason)
    pytest.importorskip("torch")
    out = run_catalog_case(_builtin("torch.nn"), "dropout", case, "float32")
    assert out.outcome == "unsupported" and "packed" in out.reason, out.reason


def test_the_spread_calibration_runs_the_reference_inside_its_band(capsys):
    """python -m suite.conformance.dropout_spread (the figures of docs/verdicts/dropout.md):
    a line per form of each selected case, the reference never outside the band; a plugin
    whose band were the fixed one would show its ratio's spread beside a half-width of 0.1."""
    from suite.conformance import dropout_spread

    assert dropout_spread.main(["--runs", "3", "-k", "alibi_causal"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["alibi_causal", "cross"],
                                                    ["alibi_causal", "square"]]
    for line in lines:
        assert line.endswith("outside 0 of 3"), line
    # the variant case's band is wider than the fixed one (0.12-0.18 in 120 runs measured)
    widest = max(float(line.split("half-width ")[1].split("-")[1].rstrip(",").split(",")[0])
                 for line in lines)
    assert widest > 0.1, lines


def test_a_model_config_without_the_problems_attention_dropout_is_unsupported_in_training():
    """A subclass of a built-in model that inherits the core's ``dropout`` but whose config
    keeps the attention's dropout at 0 (a recipe written before the core declared it) would
    fail a correct model for "no spread": it is unsupported in training mode, in one line
    naming the config's field; eval mode (dropout None) and a rate of 0 still run."""
    from suite.plugins.interface import Unsupported, call, expressible

    base = _hf("hf.model.llama[sdpa]")

    def config(self, p):
        c = base.config(self, p)
        c.attention_dropout = 0.0  # what the recipe's config left
        return c

    forgot = _planted(base, "planted.no_config_dropout", config=config)
    p = _square(forgot, 1, 0.5)
    with pytest.raises(Unsupported, match=r"attention dropout \(attention_dropout=0\.0\) is not "
                                          r"the problem's"):
        call(forgot, expressible(forgot, p), "cpu", "float32")
    out = _judge_square(forgot, p)
    assert out.outcome == "unsupported" and "attention_dropout(p)" in out.reason, out.reason
    for rate in (None, 0.0):  # eval mode, and training mode that drops nothing
        q = dataclasses.replace(p, dropout=rate)
        assert call(forgot, expressible(forgot, q), "cpu", "float32").output is not None
    out = _judge_square(base(), p)  # the built-in's config passes the rate
    assert out.outcome == "pass", out.reason
