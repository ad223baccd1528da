"""The whole-model Hugging Face built-ins (hf.model.*): registration, how the canonical problem
is posed to a model, and that the cases they run catch a model whose mask pipeline is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from suite.conformance.judge import Outcome
from suite.plugins import registry
from suite.spec.problem import Mask, make_problem

pytest.importorskip("torch")
pytest.importorskip("transformers")

from implementations.hf import model as hf_model  # noqa: E402  (after the importorskips)

MODELS = {"llama": ("eager", "sdpa", "flex"), "mistral": ("eager", "sdpa", "flex"),
          "gemma2": ("eager", "flex"), "gpt_oss": ("eager", "flex"), "bloom": ("eager",),
          "gpt2": ("eager", "sdpa"),
          "bert": ("eager", "sdpa", "flex"),
          "bert_decoder": ("eager", "sdpa", "flex")}


def _impl(name: str):
    return next(cls for cls in hf_model.variants() if cls.name == name)()


def _form_case(form: str):
    from suite.conformance.families.mask_forms import CASES

    return next(c for c in CASES if c.name == form)


def _run_form(impl, form: str) -> Outcome:
    case = _form_case(form)
    out = Outcome(impl.name, "cpu", "float32", case.family, case.name, case.seed, "pass")
    return case.run(impl, out)


def test_models_register_in_the_hf_family_with_each_attention_implementation(monkeypatch):
    monkeypatch.setattr(registry, "_FAMILIES", {})
    reg = registry.Registry()
    for cls in registry._family(registry.BUILTIN_FAMILIES["hf.*"]):
        reg.register(cls, "builtin")
    names = {n for n in reg.entries if n.startswith("hf.model.")}
    assert names == {f"hf.model.{m}[{a}]" for m, attns in MODELS.items() for a in attns}
    for name in names:
        impl = reg.entries[name].impl
        assert impl.kv_source == "self" and impl.framework == "hf"
        assert ("weights" in impl.features) == name.endswith("[eager]")
        assert impl.compiles_per_shape == name.endswith("[flex]")
    assert reg.entries["hf.model.bert[sdpa]"].impl.mask_forms == {"kpm_bool"}
    assert "local_window+causal_flag" in reg.entries["hf.model.mistral[sdpa]"].impl.mask_forms


@pytest.mark.parametrize("name,mask,why", [
    ("hf.model.llama[sdpa]", Mask(), "is causal"),  # a decoder's causality is its config's
    ("hf.model.bert[sdpa]", Mask(causal=True), "not causal"),
    ("hf.model.gpt2[eager]", Mask(valid_lens=np.ones((2, 6), int), causal=True), "per-query"),
    ("hf.model.llama[eager]", Mask(causal=True, allowed=np.ones((6, 6), bool)), "boolean"),
])
def test_a_mask_the_model_cannot_build_is_unsupported(name, mask, why):
    from suite.plugins.interface import Unsupported

    p = make_problem(0, 2, 6, 6, 16, 2, self_attention=True, bias=False, mask=mask)
    with pytest.raises(Unsupported, match=why):
        _impl(name).prepare(p, "cpu", "float32")


@pytest.mark.parametrize("name", ["hf.model.llama[sdpa]", "hf.model.gpt2[eager]",
                                  "hf.model.bert_decoder[sdpa]"])
def test_padding_beside_the_models_causal_mask_passes(name):
    out = _run_form(_impl(name), "causal_flag+kpm_bool")
    assert out.outcome == "pass", out.reason


class _NoPadding:
    """A planted adapter bug: the 2-D attention_mask never reaches the model."""

    def module_mask(self, problem, device, dtype):
        mask = super().module_mask(problem, device, dtype)
        return {**mask, "attention_mask": None}


@pytest.mark.parametrize("name,form", [("hf.model.llama[sdpa]", "causal_flag+kpm_bool"),
                                       ("hf.model.bert[eager]", "kpm_bool")])
def test_a_model_that_ignores_its_padding_fails(name, form):
    base = type(_impl(name))
    impl = type("Planted", (_NoPadding, base), {"name": "bug.no_padding"})()
    assert _run_form(impl, form).outcome == "fail"


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_sliding_window_is_the_models_own_and_an_off_by_one_fails(attn):
    impl = _impl(f"hf.model.mistral[{attn}]")
    out = _run_form(impl, "local_window+causal_flag")
    assert out.outcome == "pass", out.reason
    # A window one key short (config sliding_window = left, not left + 1) is caught.
    base = type(impl)
    short = type("Short", (base,), {"name": "bug.short_window",
                                    "sliding_window": lambda self, p: base.sliding_window(
                                        self, p) - 1})()
    assert _run_form(short, "local_window+causal_flag").outcome == "fail"


@pytest.mark.parametrize("name,dtype,rows", [
    # Measured on transformers 5.24: a batch item with no valid key (attention_mask all
    # zeros). eager fills masked logits with finfo(dtype).min, so its rows attend every key
    # equally (the mean of the values); the sdpa path gives the spec's zero head output.
    ("hf.model.llama[eager]", "float32", "mean_values"),
    ("hf.model.llama[sdpa]", "float32", "zero"),
    ("hf.model.bert[eager]", "float32", "mean_values"),
    ("hf.model.bert[sdpa]", "float32", "zero"),
    ("hf.model.bert_decoder[eager]", "float64", "mean_values"),
    # Llama's eager softmax runs in float32 whatever the dtype: float64's finfo.min becomes
    # -inf there, and a row of -inf is NaN.
    ("hf.model.llama[eager]", "float64", "nan"),
])
def test_an_item_with_no_valid_key(name, dtype, rows):
    from suite.plugins.interface import call

    impl = _impl(name)
    p = make_problem(0, 2, 7, 7, 16, 2, self_attention=True, bias=False,
                     mask=Mask(valid_lens=np.array([7, 0]), causal=impl.causal))
    out = call(impl, p, "cpu", dtype).output[1]  # (L, E): the item without keys
    x = p.query[1]
    if rows == "nan":
        assert np.isnan(out).all()
        return
    if rows == "zero":
        expected = np.zeros_like(out)  # no projection bias: the row is b_o = 0
    else:
        expected = np.broadcast_to((x @ p.weights.w_v).mean(axis=0) @ p.weights.w_o, out.shape)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def _variant_case(name: str):
    from suite.conformance import catalog

    return next(c for c in catalog.ALL if c.family == "variants" and c.name == name)


class _NoSoftcap:
    """A planted model bug as a release shipped it: a path that drops the soft-capping (the
    config's cap never reaches the attention)."""

    def config(self, p):
        config = super().config(p)
        config.attn_logit_softcapping = None
        return config


def test_gemma2_soft_caps_as_the_problem_says_and_a_path_that_drops_it_fails():
    """The model's cap is the problem's: its own path passes the soft-capping case; one that
    drops the cap fails it (the problem says the model soft-caps, so the oracle does too),
    and still passes a case without a cap (what the suite could see before: nothing). The
    flex path runs the same case in every dtype in CI's check (33 s more here, compiled)."""
    impl = _impl("hf.model.gemma2[eager]")
    case = _variant_case("softcap_self_causal_padding")

    def run(impl, case):
        out = Outcome(impl.name, "cpu", "float32", case.family, case.name, case.seed, "pass")
        return case.run(impl, out)

    assert run(impl, case).outcome == "pass"
    planted = type("Planted", (_NoSoftcap, type(impl)), {"name": "bug.no_softcap"})()
    assert run(planted, case).outcome == "fail"
    assert _run_form(planted, "causal_flag+kpm_bool").outcome == "pass"


class _NoSinks:
    """A model whose sinks never leave their -inf (a port that forgets the learned sinks)."""

    def load_variants(self, model, p):
        self.first_attention(model).sinks.fill_(float("-inf"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpt_oss_takes_the_problems_sinks_and_a_model_that_drops_them_fails(dtype):
    """gpt-oss's learned sinks are the problem's: its eager path passes the sinks cases it
    can take (the self-attention form, batch 2 with no key attending only to its sink), one
    that drops them fails, and without sinks (-inf) it is the textbook model."""
    impl = _impl("hf.model.gpt_oss[eager]")
    case = _variant_case("sinks_self_causal_padding")

    def run(impl, case):
        out = Outcome(impl.name, "cpu", dtype, case.family, case.name, case.seed, "pass")
        return case.run(impl, out)

    assert run(impl, case).outcome == "pass", run(impl, case).reason
    planted = type("Planted", (_NoSinks, type(impl)), {"name": "bug.no_sinks"})()
    failed = run(planted, case)
    assert failed.outcome == "fail", failed.reason
    assert _run_form(impl, "causal_flag+kpm_bool").outcome == "pass"


class _SlopesReversed:
    """BLOOM's ALiBi tensor with its heads in reverse order (a port that lays out the
    (B*H, 1, S) bias head-minor)."""

    def layer_inputs(self, args, kwargs, query, p):
        args, kwargs = super().layer_inputs(args, kwargs, query, p)
        a = kwargs["alibi"]
        kwargs["alibi"] = a.view(p.B, p.H, *a.shape[1:]).flip(1).reshape(a.shape)
        return args, kwargs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bloom_adds_its_own_alibi_and_a_model_with_its_slopes_reversed_fails(dtype):
    """BLOOM's ALiBi (its slopes by key position) is always on: it runs the problems whose
    ALiBi is its own and passes them; reversed slopes fail; a problem without ALiBi, or with
    other slopes, is unsupported, never judged against a model that adds them anyway."""
    impl = _impl("hf.model.bloom[eager]")
    case = _variant_case("alibi_key_self_causal_padding")

    def run(impl, case):
        out = Outcome(impl.name, "cpu", dtype, case.family, case.name, case.seed, "pass")
        return case.run(impl, out)

    assert run(impl, case).outcome == "pass", run(impl, case).reason
    planted = type("Planted", (_SlopesReversed, type(impl)), {"name": "bug.bloom_reversed"})()
    assert run(planted, case).outcome == "fail"
    plain = _run_form(impl, "causal_flag+kpm_bool")
    assert plain.outcome == "unsupported" and "always adds ALiBi" in plain.reason
    other = _variant_case("alibi_distance_six_heads")
    assert run(impl, other).outcome == "unsupported"


def test_gpt_oss_flex_on_a_cpu_is_unsupported_with_the_librarys_words():
    impl = _impl("hf.model.gpt_oss[flex]")
    out = _run_form(impl, "causal_flag")
    assert out.outcome == "unsupported", out.reason
    assert "Attention sinks cannot be run on CPU" in out.reason


def test_gemma2_takes_the_problems_scale_as_its_int_query_pre_attn_scalar():
    from suite.plugins.interface import Unsupported

    impl = _impl("hf.model.gemma2[eager]")
    p = make_problem(0, 2, 6, 6, 16, 2, self_attention=True, mask=Mask(causal=True))
    assert impl.config(p).query_pre_attn_scalar == 8  # D = 8: the default 1/sqrt(D)
    with pytest.raises(Unsupported, match="query_pre_attn_scalar"):
        impl.config(make_problem(0, 2, 6, 6, 16, 2, self_attention=True, scale=0.3,
                                 mask=Mask(causal=True)))
