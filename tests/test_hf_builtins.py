"""The Hugging Face and functional-MHA built-ins: registration, the reason when transformers is
missing, and the mask translation their adapters rely on."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from suite import registry
from suite.problem import Mask, make_problem

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
    monkeypatch.delitem(sys.modules, "implementations.hf_transformers", raising=False)
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
    assert sorted(entries) == sorted(HF_NAMES + config_names)
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
    from implementations.hf_transformers import hf_mask

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
    from implementations.torch_fmha import fmha_masks

    dev = torch.device("cpu")
    kw = fmha_masks(_problem(Mask(causal=True)), dev, torch.float32)
    assert kw["is_causal"] and kw["attn_mask"].shape == (5, 5)  # the hint needs the mask
    assert kw["attn_mask"][0, 1] and not kw["attn_mask"][1, 0]  # True = NOT allowed
    kw = fmha_masks(_problem(Mask(valid_lens=np.array([5, 3]), bias=np.ones((5, 5)))), dev,
                    torch.float32)
    assert not kw["is_causal"]
    assert kw["key_padding_mask"].dtype == torch.float32  # float with a float attn_mask
    assert kw["key_padding_mask"][1, 3] == float("-inf") and kw["key_padding_mask"][1, 2] == 0
