"""Export paths (implementations.export): a torch plugin's module exported with
torch.onnx.export and run by onnxruntime must agree with the module run eagerly.

Planted plugins show each way an export path can go wrong and that the suite names it:
a module that drops its mask when traced fails the masked cases and the contract, an
export cache that ignores the mask kind reuses a causal graph for an unmasked problem, a
mismatch only the contract can see (the eager side off the oracle, the export on it) fails
the contract, an exporter that raises is the case's error, not "unsupported". Most run the
TorchScript exporter (about a second an export); one case runs the dynamo exporter.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from implementations.export import onnx_export  # noqa: E402
from implementations.export.onnx_export import EXPORT_FAMILIES, ExportPath, exported  # noqa: E402
from implementations.torch.nn import TorchNN  # noqa: E402
from implementations.torch.sdpa import TorchSDPA  # noqa: E402
from suite.conformance.families import contracts  # noqa: E402
from suite.conformance.judge import Outcome  # noqa: E402
from suite.plugins.interface import Unavailable, Unsupported, check_interface  # noqa: E402
from suite.spec.problem import Mask, make_problem  # noqa: E402
from tests.conftest import run_catalog_case  # noqa: E402


def _exporting() -> bool:
    """True while an exporter traces the module (either exporter)."""
    return bool(torch.jit.is_tracing() or torch.compiler.is_exporting()
                or torch.onnx.is_in_onnx_export())


class PlainSDPA(TorchSDPA):
    """torch.sdpa without GQA: the TorchScript exporter has no translation of SDPA's
    ``enable_gqa`` (measured, torch 2.13), and these tests are about masks."""

    name = "planted.sdpa"
    features = TorchSDPA.features - {"gqa"}


class DropsMaskWhenTraced(PlainSDPA):
    """A kernel that forgets its mask when traced: right eagerly, unmasked when exported."""

    name = "planted.drops_mask"

    def attend(self, q, k, v, mask, scale, need_weights):
        if _exporting():
            mask = mask.replace(bias=None, allowed=None, dead_keys=None, causal_only=False)
        return super().attend(q, k, v, mask, scale, need_weights)


class ScaledEagerly(PlainSDPA):
    """Eagerly its output is 0.1% off (off the oracle, so its own cases fail); the traced
    graph drops the factor. Only the contract sees that the two paths differ."""

    name = "planted.scaled_eagerly"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, w = super().attend(q, k, v, mask, scale, need_weights)
        return (heads if _exporting() else heads * 1.001), w


class RaisesWhenTraced(PlainSDPA):
    """A call the exporter cannot trace (it raises inside the trace): the case's error."""

    name = "planted.raises_when_traced"

    def attend(self, q, k, v, mask, scale, need_weights):
        if _exporting():
            raise RuntimeError("planted: no tracing here")
        return super().attend(q, k, v, mask, scale, need_weights)


class RefusesCausal(PlainSDPA):
    """The eager module refuses causal problems (Unsupported): so does its export."""

    name = "planted.refuses_causal"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.causal_only:
            raise Unsupported("planted: no causal flag here")
        return super().attend(q, k, v, mask, scale, need_weights)


def _ts(cls):
    return exported(cls, "torchscript")


def _contract(impl) -> Outcome:
    (case,) = contracts.cases_of(impl)
    return case.run(impl, Outcome(impl.name, "cpu", "float32", case.family, case.name,
                                  case.seed, "pass"))


@pytest.fixture(autouse=True)
def _fresh_graphs():
    onnx_export.clear_cache()
    yield
    onnx_export.clear_cache()


def test_the_correct_export_passes_masked_cases_and_its_contract():
    impl = _ts(PlainSDPA)()
    for family, case in (("masking", "causal"), ("masking", "combined"),
                         ("shapes", "odd_lengths")):
        out = run_catalog_case(impl, family, case, "float32")
        assert out.outcome == "pass", (case, out.reason)
    out = _contract(impl)
    assert out.outcome == "pass", out.reason
    assert "within the bound on all 8 problems" in out.reason


def test_an_export_that_drops_the_mask_fails_the_masked_cases_and_the_contract():
    eager = DropsMaskWhenTraced()
    assert run_catalog_case(eager, "masking", "causal", "float32").outcome == "pass"
    impl = _ts(DropsMaskWhenTraced)()
    for case in ("causal", "valid_lens", "bool_mask"):
        out = run_catalog_case(impl, "masking", case, "float32")
        assert out.outcome == "fail", (case, out.reason)
    assert run_catalog_case(impl, "masking", "none", "float32").outcome == "pass"
    out = _contract(impl)
    assert out.outcome == "fail", out.reason
    assert "the paths disagree on problem 1 (causal)" in out.reason, out.reason
    assert impl.name in out.reason and "exporter=None" in out.reason


def _two_masks(L: int = 6):
    """A causal problem and one with a boolean mask of the same shapes (every row and key
    kept): the same graph inputs, other baked flags (is_causal vs attn_mask)."""
    rng = np.random.default_rng(0)
    allowed = np.tril(np.ones((L, L), bool)) | (rng.random((L, L)) < 0.5)
    return [make_problem(seed, 2, L, L, 16, 2, mask=m).validate()
            for seed, m in ((1, Mask(causal=True)), (2, Mask(allowed=allowed)))]


def _output(impl, p):
    state = impl.prepare(p, "cpu", "float32")
    return impl.fetch(state, impl.run(state)).output, state


def test_a_graph_cache_blind_to_the_mask_kind_reuses_a_causal_graph():
    class StaleKey(_ts(PlainSDPA)):
        name = "planted.stale_key"

        def graph_key(self, state, template, tensors):  # shapes only: is_causal baked in
            return "|".join(str(tuple(t.shape)) for t in tensors)

    causal, masked = _two_masks()
    want = PlainSDPA()(masked, "cpu", "float32").output
    for cls, agrees in ((_ts(PlainSDPA), True), (StaleKey, False)):
        onnx_export.clear_cache()
        impl = cls()
        _output(impl, causal)
        got, state = _output(impl, masked)
        assert state["exported_now"] is agrees  # the stale key found the causal graph
        assert np.allclose(got, want, atol=1e-5) is agrees, cls.name


def test_one_graph_per_shape_takes_each_problems_weights_and_mask_as_inputs():
    impl = _ts(PlainSDPA)()
    seen = []
    for seed in (1, 2):  # the same shapes and mask kind, other weights, inputs and mask
        allowed = np.random.default_rng(seed).random((2, 1, 5, 7)) < 0.7
        allowed[..., 0] = True  # every row keeps a key
        p = make_problem(seed, 2, 5, 7, 16, 2, mask=Mask(allowed=allowed)).validate()
        got, state = _output(impl, p)
        seen.append(state["exported_now"])
        want = PlainSDPA()(p, "cpu", "float32").output
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert seen == [True, False]


def test_an_exporter_that_raises_is_the_cases_error_and_a_refusal_is_unsupported():
    out = run_catalog_case(_ts(RaisesWhenTraced)(), "masking", "causal", "float32")
    assert out.outcome == "error", out.reason
    assert "torch.onnx.export(dynamo=False) raised" in out.reason
    assert "planted: no tracing here" in out.reason
    out = run_catalog_case(_ts(RefusesCausal)(), "masking", "causal", "float32")
    assert out.outcome == "unsupported" and "no causal flag" in out.reason, out.reason


def test_a_mismatch_only_the_contract_sees_fails_it():
    impl = _ts(ScaledEagerly)()
    assert run_catalog_case(impl, "masking", "causal", "float32").outcome == "pass"
    assert run_catalog_case(ScaledEagerly(), "masking", "causal", "float32").outcome == "fail"
    out = _contract(impl)
    assert out.outcome == "fail" and "the paths disagree" in out.reason, out.reason


def test_the_dynamo_export_of_torch_nn_passes_a_masked_case():
    pytest.importorskip("onnxscript")
    impl = exported(TorchNN, "dynamo")()
    out = run_catalog_case(impl, "masking", "combined", "float32")
    assert out.outcome == "pass", out.reason


def test_declarations_of_an_export_path():
    cls = _ts(TorchNN)
    check_interface(cls)
    assert cls.name == "export.onnx-ts[torch.nn]"
    assert exported(TorchNN).name == "export.onnx[torch.nn]"
    assert "grad" not in cls.features and "dropout" not in cls.features
    assert "weights" in cls.features and cls.deviations == TorchNN.deviations
    assert cls.families == EXPORT_FAMILIES
    (contract,) = cls.contracts
    assert contract.relation == "agrees" and dict(contract.against) == {"exporter": None}
    assert cls().dtypes("cpu") == ("float32",)
    with pytest.raises(TypeError, match="torch plugin class"):
        exported(object)
    with pytest.raises(ValueError, match="exporter"):
        exported(TorchNN, "tflite")
    with pytest.raises(TypeError, match="already an export path"):
        exported(cls)
    assert issubclass(cls, ExportPath)


def test_a_missing_package_makes_it_unavailable(monkeypatch):
    real = onnx_export.importlib.import_module

    def missing(name, *a):
        if name == "onnxscript":
            raise ImportError("No module named 'onnxscript'")
        return real(name, *a)

    monkeypatch.setattr(onnx_export.importlib, "import_module", missing)
    with pytest.raises(Unavailable, match="onnxscript is not installed") as info:
        exported(TorchSDPA, "dynamo")()
    assert "\n" not in str(info.value)
    exported(TorchSDPA, "torchscript")()  # the TorchScript exporter does not need it


def test_builtin_names_are_registered_with_existing_sources():
    from suite.plugins.registry import BUILTINS

    ours = {n: spec for n, spec in BUILTINS.items() if n.startswith("export.")}
    assert ours
    for name, spec in ours.items():
        module, attr = spec.split(":")
        cls = getattr(__import__(module, fromlist=[attr]), attr)
        assert cls.name == name
        assert cls.source_name in BUILTINS, (name, cls.source_name)


def test_the_executorch_path_passes_a_masked_case_and_drops_no_mask():
    pytest.importorskip("executorch")
    impl = exported(PlainSDPA, "executorch")()
    assert impl.name == "export.executorch[planted.sdpa]"
    assert run_catalog_case(impl, "masking", "combined", "float32").outcome == "pass"
    out = run_catalog_case(exported(DropsMaskWhenTraced, "executorch")(), "masking", "causal",
                           "float32")
    assert out.outcome == "fail", out.reason


def test_the_executorch_path_exports_the_layout_it_feeds():
    """A broadcast bias reaches the exporter as a strided view; the program is fed contiguous
    tensors, so it must be exported on contiguous ones (else ExecuTorch's add kernel refuses
    the call: 'different dim orders', error 0x12, measured on executorch 1.5.1)."""
    pytest.importorskip("executorch")
    out = run_catalog_case(exported(PlainSDPA, "executorch")(), "masking", "bias_broadcast",
                           "float32")
    assert out.outcome == "pass", out.reason


def test_the_executorch_module_imports_first_in_a_fresh_process():
    """Importing implementations.export.executorch before onnx_export once stopped at a
    circular import (onnx_export made the ExecuTorch names at import, reaching back into the
    half-imported module); a process that only wants the ExecuTorch names imports it first."""
    import subprocess
    import sys

    code = ("import implementations.export.executorch as e; "
            "print(e.ExportExecuTorchTorchNN.name, e.ExportExecuTorchTorchSDPA.name)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["export.executorch[torch.nn]", "export.executorch[torch.sdpa]"]


def test_a_runtime_outside_the_declared_range_makes_it_unavailable(monkeypatch):
    """executorch 1.1-1.3 install beside torch 2.13 and import, then fail in every case: a
    release outside the extra's range is unavailable, in one line naming the range."""
    from suite.plugins import registry

    def outside(module):
        return "onnxruntime 1.0.0 is installed; mha-suite declares onnxruntime>=1.23" \
            if module == "onnxruntime" else None

    monkeypatch.setattr(registry, "outside_declared_range", outside)
    with pytest.raises(Unavailable, match="declares onnxruntime>=1.23") as info:
        exported(TorchSDPA, "torchscript")()
    assert "\n" not in str(info.value)
