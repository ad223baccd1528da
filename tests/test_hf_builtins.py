"""The Hugging Face and functional-MHA built-ins: registration, the reason when transformers is
missing, and the mask translation their adapters rely on."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from suite.plugins import registry
from suite.spec.problem import Mask, make_problem

HF_NAMES = [f"hf.{m}[{a}]" for m in ("bert", "gpt2", "llama") for a in ("eager", "sdpa")]


HF_FAMILY = registry.BUILTIN_FAMILIES["hf.*"]


@pytest.fixture
def fresh_family(monkeypatch):
    """The hf.* family imported afresh (not from this process's earlier loads)."""
    monkeypatch.setattr(registry, "_FAMILIES", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_hf_family_is_unavailable_with_the_install_hint_when_transformers_is_missing(
        fresh_family, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.delitem(sys.modules, "implementations.hf.transformers", raising=False)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    with pytest.raises(registry.PluginError) as exc:
        registry._family(HF_FAMILY)
    # what the registry records for the family (as `mha-suite list` shows it)
    why = registry._describe(exc.value.__cause__ or exc.value.__context__)
    assert why == "transformers is not installed (pip install 'mha-suite[hf]')"


def test_hf_modules_register_with_both_attention_implementations(fresh_family):
    pytest.importorskip("transformers")
    reg = registry.Registry()
    for cls in registry._family(HF_FAMILY):
        reg.register(cls, "builtin")
    entries = reg.entries
    config_names = [f"hf.gpt2[{a},{o}]" for o in ("unscaled", "scale_by_layer")
                    for a in ("eager", "sdpa")] + ["hf.gpt2[eager,upcast]"]
    # hf.model.* (whole models) register here too: tests/test_hf_model.py checks them.
    assert sorted(n for n in entries if not n.startswith("hf.model.")) == sorted(
        HF_NAMES + config_names)
    for name in HF_NAMES:
        assert entries[name].available, (name, entries[name].error)
        impl = entries[name].impl
        # eager always returns the attention weights; sdpa never does
        assert ("weights" in impl.features) == name.endswith("[eager]")
        assert impl.framework == "hf" and impl.array_library == "torch"
    assert entries["hf.bert[sdpa]"].impl.kv_source == "shared"
    assert "gqa" in entries["hf.llama[sdpa]"].impl.features
    assert "gqa" not in entries["hf.gpt2[sdpa]"].impl.features


def test_fmha_is_registered_on_both_code_paths():
    pytest.importorskip("torch")
    assert registry.BUILTINS["torch.F_mha"].endswith(":TorchFMHA")
    cls = registry._load_object(registry.BUILTINS["torch.F_mha+weights"])
    assert "weights" in cls.features and cls.need_weights


def _problem(mask: Mask):
    return make_problem(0, 2, 5, 5, 8, 2, self_attention=True, mask=mask)


def test_hf_masks_follow_each_attention_implementation():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from implementations.hf.transformers import hf_mask

    dev = torch.device("cpu")
    causal = _problem(Mask(causal=True))
    sdpa = hf_mask(causal, "sdpa", torch.float32, dev)
    assert sdpa["attention_mask"] is None and sdpa["is_causal"]  # SDPA's own flag
    eager = hf_mask(causal, "eager", torch.float32, dev)
    assert not eager["is_causal"]
    m = eager["attention_mask"][0, 0]  # (L, S) additive
    assert m.dtype == torch.float32
    assert m[0, 1] == torch.finfo(torch.float32).min and m[1, 0] == 0
    # With any other part, sdpa_attention_forward would drop is_causal: causal goes in the mask.
    both = _problem(Mask(valid_lens=np.array([5, 3]), causal=True))
    sdpa = hf_mask(both, "sdpa", torch.float32, dev)
    assert not sdpa["is_causal"]
    allowed = sdpa["attention_mask"]  # bool, True = attend
    assert allowed.dtype == torch.bool
    assert not allowed[0, 0, 0, 1] and not allowed[1, 0, 4, 3] and allowed[1, 0, 4, 2]


def test_fmha_masks_use_its_polarity_and_the_causal_hint():
    torch = pytest.importorskip("torch")
    from implementations.torch.fmha import fmha_masks

    dev = torch.device("cpu")
    kw = fmha_masks(_problem(Mask(causal=True)), dev, torch.float32)
    assert kw["is_causal"] and kw["attn_mask"].shape == (5, 5)  # the hint needs the mask
    assert kw["attn_mask"][0, 1] and not kw["attn_mask"][1, 0]  # True = NOT allowed
    kw = fmha_masks(_problem(Mask(valid_lens=np.array([5, 3]), bias=np.ones((5, 5)))), dev,
                    torch.float32)
    assert not kw["is_causal"]
    assert kw["key_padding_mask"].dtype == torch.float32  # float with a float attn_mask
    assert kw["key_padding_mask"][1, 3] == float("-inf") and kw["key_padding_mask"][1, 2] == 0


def _gpt2(name: str):
    from implementations.hf.transformers import variants

    return next(cls for cls in variants() if cls.name == name)()


@pytest.mark.parametrize("name,expected", [
    ("hf.gpt2[eager]", lambda D: D ** -0.5),
    ("hf.gpt2[sdpa,unscaled]", lambda D: 1.0),
    ("hf.gpt2[eager,scale_by_layer]", lambda D: D ** -0.5 / 4),  # layer_idx 3
])
@pytest.mark.parametrize("attribute", ["missing", "misleading"])
def test_gpt2_scale_comes_from_its_config_not_a_module_attribute(name, expected, attribute):
    # transformers < 5.4's GPT2Attention has no `scaling` attribute (5.3.0: AttributeError on
    # every case when the adapter read it): the scale GPT-2's config asks for
    # (scale_attn_weights, scale_attn_by_inverse_layer_idx, the head width) is what the
    # canonical scale is compared with, and folded into W_q where the name declares it.
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    impl = _gpt2(name)
    p = make_problem(0, 2, 5, 5, 8, 2, self_attention=True)  # D = 4
    module = impl.build_for(p, shared_input=True)
    if attribute == "missing":
        if hasattr(module, "scaling"):
            del module.scaling
    else:
        module.scaling = 123.0  # what a release might call something else
    with torch.no_grad():
        impl.load_weights(module, p)
    ratio = p.effective_scale / expected(p.D)
    w_q = module.c_attn.weight[:, :p.E].detach().numpy()  # Conv1D (in, out): q first
    np.testing.assert_allclose(w_q, p.weights.w_q * ratio, rtol=1e-12, atol=0)
    if not impl.fold_scale:
        assert ratio == pytest.approx(1.0)


def test_gpt2_refuses_a_scale_its_config_cannot_express():
    pytest.importorskip("transformers")
    from suite.plugins.interface import Unsupported

    impl = _gpt2("hf.gpt2[eager]")  # no fold: 1/sqrt(D) only
    p = make_problem(0, 2, 5, 5, 8, 2, self_attention=True, scale=0.25)  # D = 4: config 0.5
    module = impl.build_for(p, shared_input=True)
    if hasattr(module, "scaling"):
        del module.scaling
    with pytest.raises(Unsupported, match=r"scales q\.k by 0\.5, the problem by 0\.25"):
        impl.load_weights(module, p)


def test_gpt2_cross_attention_is_told_by_its_query_layer():
    # The cross-attention form is the one with its own query layer `q_attn`: the adapter
    # loads q there and packed k/v (E, 2E) in c_attn, whatever the module calls its flag.
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    impl = _gpt2("hf.gpt2[sdpa]")
    p = make_problem(0, 2, 5, 5, 8, 2, self_attention=True)
    module = impl.build_for(p, shared_input=False)
    if hasattr(module, "is_cross_attention"):
        del module.is_cross_attention  # a constructor flag, not read
    with torch.no_grad():
        impl.load_weights(module, p)
    np.testing.assert_array_equal(module.q_attn.weight.detach().numpy(), p.weights.w_q)
    np.testing.assert_array_equal(module.c_attn.weight[:, :p.E].detach().numpy(), p.weights.w_k)
