"""torch.compile[pattern]: the compiler's own attention rewrite is reached, read from what
the compiled call runs (torch's profiler), not assumed; torch.compile (the suite's masked
softmax, compiled) is not rewritten."""

from __future__ import annotations

import pytest

from suite.spec.problem import Mask, make_problem

torch_compiled = pytest.importorskip("implementations.torch.compiled")


def _ops(cls, problem, dtype="float32"):
    impl = cls()
    state = impl.prepare(problem, "cpu", dtype)
    return torch_compiled.rewritten_ops(impl, state)


@pytest.fixture(scope="module")
def problems():
    import numpy as np

    keep = np.ones((2, 1, 5, 7), bool)
    keep[..., 3] = False
    return {"plain": make_problem(0, 2, 5, 7, 16, 2),
            "bias": make_problem(1, 2, 5, 7, 16, 2, mask=Mask(allowed=keep))}


@pytest.mark.parametrize("kind", ["plain", "bias"])
def test_the_textbook_graph_is_rewritten_into_sdpa(problems, kind):
    ops = _ops(torch_compiled.TorchCompiledPattern, problems[kind])
    assert any("flash_attention" in op or "efficient_attention" in op for op in ops), ops


def test_the_suites_own_compiled_softmax_is_not_rewritten(problems):
    assert _ops(torch_compiled.TorchCompiled, problems["bias"]) == []


def test_compiled_names_are_unavailable_when_torch_is_forced_below_the_cpus_level(monkeypatch):
    """Inductor's code is wrong with ATEN_CPU_CAPABILITY below the CPU's level (measured):
    the compiled names are dropped with that reason there, and only there."""
    from suite.plugins import isa

    monkeypatch.setattr(isa, "native_torch_level", lambda: "avx512")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert torch_compiled.forced_below_native() is None
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    assert torch_compiled.forced_below_native() is None  # the CPU's own level
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert torch_compiled.variants() == []
    assert "forces torch below this CPU's level (avx512)" in torch_compiled.DROPPED["torch.compile"]
