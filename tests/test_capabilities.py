"""Feature detection by capability, for the framework releases that cannot be installed here
(torch older than 2.13 has no CPU wheel reachable from CI): each test stands in for an older
release by taking away or breaking what that release lacks, and checks the built-in says so
(undeclared feature -> "unsupported", missing API -> unavailable with the reason).
"""

from __future__ import annotations

import sys
import types

import pytest

from suite.conformance import judge
from suite.conformance.cases import get
from suite.plugins import conditions
from suite.plugins.registry import Registry


class _OldDynamoConfig:
    """torch 2.4/2.5's dynamo config: the limits under their old names only."""

    def __init__(self) -> None:
        self.cache_size_limit = 8
        self.accumulated_cache_size_limit = 256


def test_recompile_limits_are_raised_under_either_name(monkeypatch):
    pytest.importorskip("torch")
    import torch._dynamo

    from implementations.torch import compiled as torch_compiled

    old = _OldDynamoConfig()
    monkeypatch.setattr(torch._dynamo, "config", old)
    torch_compiled.allow_recompiles()
    assert old.cache_size_limit == torch_compiled.RECOMPILE_LIMIT
    assert old.accumulated_cache_size_limit == torch_compiled.ACCUMULATED_RECOMPILE_LIMIT
    assert torch_compiled.config_name(old, "recompile") == "cache_size_limit"
    with pytest.raises(AttributeError, match="fail_on_recompile_limit_hit"):
        torch_compiled.config_name(old, "fail_on_hit")


class _FakeCompiled:
    """A prepared compiled plugin whose call does what ``run`` says (no compiling)."""

    def __init__(self, run) -> None:
        self._run = run

    def run(self, state):
        return self._run()

    def synchronize(self, state):
        return None


def test_compiled_names_probe_where_dynamo_has_no_fail_on_limit_setting(monkeypatch):
    # torch 2.2-2.4: the limits exist, a setting that makes reaching them an error does not;
    # the compiled names must still register there (their probe compiles and runs).
    pytest.importorskip("torch")
    import torch._dynamo

    from implementations.torch import compiled as torch_compiled

    real = torch._dynamo.config

    class WithoutFailOnLimit:  # this torch's config, the fail-on-limit names taken away
        def __getattr__(self, name):
            if name in torch_compiled.LIMIT_NAMES["fail_on_hit"]:
                raise AttributeError(name)
            return getattr(real, name)

        def __setattr__(self, name, value):
            setattr(real, name, value)

    monkeypatch.setattr(torch._dynamo, "config", WithoutFailOnLimit())
    assert torch_compiled.warm_call(_FakeCompiled(lambda: None), {}) >= 0.0
    assert torch_compiled._probe(torch_compiled.TorchCompiled) is None


def test_eager_fallback_past_the_limit_is_an_error_without_the_setting(monkeypatch):
    # What dynamo logs on those releases when it falls back to eager: a sweep must not time
    # the eager code under a compiled name.
    pytest.importorskip("torch")
    import logging

    import torch._dynamo

    from implementations.torch import compiled as torch_compiled

    monkeypatch.setattr(torch._dynamo, "config", _OldDynamoConfig())

    def hit_limit():
        logging.getLogger("torch._dynamo.convert_frame").warning(
            "torch._dynamo hit config.%s (%s)\n   function: %s", "cache_size_limit", 8, "'f'")

    with pytest.raises(RuntimeError, match="hit config.cache_size_limit"):
        torch_compiled.warm_call(_FakeCompiled(hit_limit), {})
    logging.getLogger("torch._dynamo.convert_frame").warning("an unrelated warning")
    assert torch_compiled.warm_call(_FakeCompiled(lambda: None), {}) >= 0.0


def test_recompile_limit_new_name_wins_and_is_never_lowered(monkeypatch):
    pytest.importorskip("torch")
    import torch._dynamo

    from implementations.torch import compiled as torch_compiled

    new = types.SimpleNamespace(recompile_limit=10**6, accumulated_recompile_limit=3)
    monkeypatch.setattr(torch._dynamo, "config", new)
    torch_compiled.allow_recompiles()
    assert new.recompile_limit == 10**6
    assert new.accumulated_recompile_limit == torch_compiled.ACCUMULATED_RECOMPILE_LIMIT


def _flash_of_torch_2_4(monkeypatch):
    """SDPA whose pinned backend refuses a broadcast or non-contiguous mask, GQA, gradients
    through a mask (what flash on the CPU of torch 2.4/2.5 answers: "No available kernel"),
    q/k/v with a strided last axis and value heads of another width (flash on the CPU of
    every torch: measured on 2.13)."""
    import torch
    import torch.nn.functional as F

    from implementations.torch import sdpa as torch_sdpa

    real = F.scaled_dot_product_attention
    pinned = {"on": False}

    def sdpa(q, k, v, attn_mask=None, **kw):
        if pinned["on"]:
            broadcast = attn_mask is not None and any(
                m == 1 and n > 1 for m, n in zip(attn_mask.shape[:3], q.shape[:3])
            ) or (attn_mask is not None and attn_mask.stride(-1) != 1) or q.stride(-1) != 1 \
                or v.shape[-1] != q.shape[-1]
            if broadcast or q.shape[1] != k.shape[1] or kw.get("enable_gqa") or (
                    attn_mask is not None and q.requires_grad):
                raise RuntimeError("No available kernel. Aborting execution.")
        return real(q, k, v, attn_mask=attn_mask, **kw)

    class Pin:
        def __enter__(self):
            pinned["on"] = True

        def __exit__(self, *exc):
            pinned["on"] = False

    monkeypatch.setattr(torch_sdpa.F, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(torch_sdpa, "kernel_context",
                        lambda short: (lambda: Pin()) if short == "flash" else None)
    monkeypatch.setattr(torch_sdpa.cache, "memo", lambda name, compute: compute())
    return torch


def test_sdpa_backend_declares_only_the_forms_its_probes_ran(monkeypatch):
    pytest.importorskip("torch")
    _flash_of_torch_2_4(monkeypatch)
    from implementations.torch import sdpa as torch_sdpa

    (flash,) = torch_sdpa.backend_variants()
    assert flash.name == "torch.sdpa[flash]"
    assert "gqa" not in flash.features and "grad" in flash.features
    assert {"bias", "valid_lens", "causal"} <= flash.features
    assert set(flash.runs) == {"causal", "mask", "grad", "dropout"}  # dropout: not refused here
    assert "last_strided" not in flash.layouts and "transposed" in flash.layouts
    impl = flash()
    by_case = {name: judge.run_case(impl, flash.name, "cpu", "float32", get(family, name)).outcome
               for family, name in [("shapes", "gqa"), ("masking", "bias_broadcast"),
                                    ("masking", "bias"), ("masking", "none")]}
    # A missing kernel is "unsupported", never an error; what it runs still passes.
    assert by_case == {"gqa": "unsupported", "bias_broadcast": "unsupported",
                       "bias": "pass", "none": "pass"}


def test_sdpa_kernel_falls_back_to_the_pre_2_3_context_manager(monkeypatch):
    torch = pytest.importorskip("torch")
    from implementations.torch import sdpa as torch_sdpa

    monkeypatch.setitem(sys.modules, "torch.nn.attention", None)  # torch 2.2: no such module
    seen = {}
    monkeypatch.setattr(torch.backends.cuda, "sdp_kernel", lambda **flags: seen.update(flags),
                        raising=False)
    torch_sdpa.kernel_context("flash")()
    assert seen == {"enable_flash": True, "enable_mem_efficient": False, "enable_math": False}
    assert torch_sdpa.kernel_context("cudnn") is None  # no flag for it before 2.3


def test_jax_nn_without_dot_product_attention_is_unavailable_with_the_reason(monkeypatch):
    jax = pytest.importorskip("jax")
    from implementations.jax import nn as jax_nn

    monkeypatch.delattr(jax.nn, "dot_product_attention")
    reg = Registry()
    entry = reg.register(jax_nn.JaxNN, source="builtin")
    assert not entry.available
    assert "no jax.nn.dot_product_attention" in entry.error and jax.__version__ in entry.error


def test_jax_nn_that_refuses_the_gqa_layout_leaves_gqa_undeclared(monkeypatch):
    jax = pytest.importorskip("jax")
    from implementations.jax import nn as jax_nn

    real = jax.nn.dot_product_attention

    def old(q, k, v, *a, **kw):  # jax 0.4.31: K kv heads in this layout raise
        if q.shape[2] != k.shape[2]:
            raise ValueError("query and key heads differ")
        return real(q, k, v, *a, **kw)

    monkeypatch.setattr(jax.nn, "dot_product_attention", old)
    monkeypatch.setattr(jax_nn.cache, "memo", lambda name, compute: compute())
    impl = jax_nn.JaxNN()
    assert "gqa" not in impl.features
    out = judge.run_case(impl, "jax.nn", "cpu", "float32", get("shapes", "gqa"))
    assert out.outcome == "unsupported", out.reason


def test_builtin_with_no_dtype_anywhere_is_unavailable_with_a_reason():
    from implementations.numpy.mha import NumpyMHA

    class NoDtypes(NumpyMHA):
        name = "numpy.none"

        def dtypes(self, device):
            return ()

    for source in ("builtin", "plugin"):  # nothing to run: unavailable, saying why
        entry = Registry().register(NoDtypes, source=source)
        assert not entry.available
        assert "dtypes" in entry.error and "got ()" in entry.error, entry.error


@pytest.mark.parametrize("version,declared", [("2.4.0", True), ("2.4.1", True),
                                              ("2.5.0", False), ("2.13.0+cpu", False)])
def test_sdpa_builtins_declare_nan_fully_masked_rows_before_torch_2_5(monkeypatch, version,
                                                                      declared):
    # Measured on 2.4.0 and 2.4.1: every SDPA path gives NaN rows where no key is left; from
    # 2.5 the spec's zero row is required (and 2.4.0's NaN in rows with keys still fails).
    pytest.importorskip("torch")
    from implementations.torch.fmha import TorchFMHA
    from implementations.torch.nn import TorchNNSDPA
    from implementations.torch.sdpa import TorchSDPA
    from suite.plugins.declarations import deviations_for

    monkeypatch.setattr(conditions, "installed", lambda dist: version if dist == "torch" else None)
    for cls in (TorchSDPA, TorchNNSDPA, TorchFMHA):
        got = deviations_for(cls, "float32", "cpu").get("fully_masked_rows")
        assert (got is not None and got.policy == "nan") == declared, cls.name
