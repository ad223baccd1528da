"""The OpenVINO built-ins (#49): the op graph's code paths and the converted torch modules pass
their cases, and planted plugins, each a one-place change of a correct built-in, fail them.

Skipped without openvino (and the conversion tests without torch). Each planted plugin runs
through the suite's own judge (``run_catalog_case``), on the cases that path changes.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

pytest.importorskip("openvino")

from implementations.openvino import sdpa  # noqa: E402
from implementations.openvino.sdpa import (  # noqa: E402
    OpenVINOSDPA,
    OpenVINOSDPAFloatMask,
    OpenVINOSDPAMask,
    Pose,
)
from suite.conformance.families.contracts import cases_of  # noqa: E402
from suite.conformance.judge import Outcome  # noqa: E402
from suite.plugins.interface import Unavailable, Unsupported  # noqa: E402
from tests.conftest import run_catalog_case  # noqa: E402

# --- planted plugins: one-place changes of the op graph --------------------------------------


class DropsCausalFlag(OpenVINOSDPA):
    """The causal attribute left off where the whole mask is causal."""

    name = "bug.openvino.drops_causal_flag"

    def pose(self, p):
        pose = super().pose(p)
        return dataclasses.replace(pose, causal=False)


class FlipsMaskPolarity(OpenVINOSDPA):
    """The boolean attention_mask handed over True = masked (the op reads True = attend)."""

    name = "bug.openvino.flips_polarity"

    def pose(self, p):
        pose = super().pose(p)
        if pose.mask is not None and pose.mask.dtype == bool:
            return dataclasses.replace(pose, mask=~pose.mask)
        return pose


class OmitsScale(OpenVINOSDPA):
    """No scale input: the op's default 1/sqrt(D) where the problem sets another."""

    name = "bug.openvino.omits_scale"

    def build(self, p, dtype, pose):
        return super().build(dataclasses.replace(p, scale=None), dtype, pose)


class ReshapesHeadsWrongly(OpenVINOSDPA):
    """Heads split by reshaping (B, L, H*D) straight to (B, H, L, D), no transpose."""

    name = "bug.openvino.head_reshape"

    def split_heads(self, op, x, to):
        B, length, n, width = (int(d) for d in to.get_data())
        return op.reshape(x, op.constant(np.array([B, n, length, width], np.int64)), False)


class MaskDropsCausal(OpenVINOSDPAMask):
    """``[mask]`` losing a causal-only mask: caught by its contract with the causal flag."""

    name = "bug.openvino.mask_drops_causal"

    def pose(self, p):
        pose = super().pose(p)
        return Pose() if p.mask.kinds == {"causal"} else pose


def outcome(impl, family, case, dtype="float32"):
    return run_catalog_case(impl, family, case, dtype)


@pytest.mark.parametrize("impl, family, case", [
    (OpenVINOSDPA, "masking", "causal"),
    (OpenVINOSDPA, "masking", "causal_top_left_long_query"),
    (OpenVINOSDPA, "masking", "bool_mask"),
    (OpenVINOSDPA, "masking", "valid_lens"),
    (OpenVINOSDPA, "masking", "bias"),
    (OpenVINOSDPA, "numerics", "explicit_scale"),
    (OpenVINOSDPA, "numerics", "negative_scale"),
    (OpenVINOSDPA, "shapes", "many_heads"),
    (OpenVINOSDPA, "shapes", "gqa_groups_of_2"),
    (OpenVINOSDPA, "shapes", "mqa"),
    (OpenVINOSDPA, "mask_forms", "causal_flag"),
    (OpenVINOSDPA, "mask_forms", "bool_B11S"),
    (OpenVINOSDPAMask, "masking", "causal"),
    (OpenVINOSDPAMask, "masking", "combined"),
    (OpenVINOSDPAFloatMask, "masking", "bool_mask"),
    (OpenVINOSDPAFloatMask, "masking", "causal_bottom_right_short_query"),
])
def test_the_op_graph_passes(impl, family, case):
    out = outcome(impl(), family, case)
    assert out.outcome == "pass", out.reason


@pytest.mark.parametrize("impl", [OpenVINOSDPA, OpenVINOSDPAMask, OpenVINOSDPAFloatMask])
def test_a_row_with_no_key_is_the_declared_nan(impl):
    """OpenVINO's documented -inf masking: NaN rows, the declared policy (not a pass)."""
    out = outcome(impl(), "masking", "fully_masked_bool_row")
    assert out.outcome == "deviation", out.reason
    assert "fully_masked_rows=nan" in out.reason


@pytest.mark.parametrize("bug, family, case", [
    (DropsCausalFlag, "masking", "causal"),
    (DropsCausalFlag, "masking", "causal_top_left_long_query"),
    (FlipsMaskPolarity, "masking", "bool_mask"),
    (FlipsMaskPolarity, "masking", "valid_lens"),
    (OmitsScale, "numerics", "explicit_scale"),
    (OmitsScale, "numerics", "negative_scale"),
    (ReshapesHeadsWrongly, "shapes", "many_heads"),
    (ReshapesHeadsWrongly, "masking", "none"),
])
def test_planted_op_graph_bugs_fail(bug, family, case):
    out = outcome(bug(), family, case)
    assert out.outcome == "fail", (out.outcome, out.reason)


@pytest.mark.parametrize("bug, family, case", [
    (DropsCausalFlag, "masking", "bool_mask"),  # no causal part: the flag is not used
    (FlipsMaskPolarity, "masking", "causal"),  # the causal flag, no boolean mask
    (OmitsScale, "masking", "causal"),  # the problem's scale is the default one
])
def test_planted_bugs_pass_where_their_path_is_not_taken(bug, family, case):
    """Each planted change is in one place: cases that do not reach it still pass (so the
    failures above are that change's)."""
    out = outcome(bug(), family, case)
    assert out.outcome == "pass", out.reason


def test_the_flag_and_mask_contract_holds_and_catches_a_dropped_causal_mask():
    good = OpenVINOSDPAMask()
    (case,) = cases_of(good)
    out = case.run(good, Outcome(good.name, "cpu", "float32", case.family, case.name,
                                 case.seed, "pass"))
    assert out.outcome == "pass", out.reason
    bug = MaskDropsCausal()
    (case,) = cases_of(bug)
    out = case.run(bug, Outcome(bug.name, "cpu", "float32", case.family, case.name, case.seed,
                                "pass"))
    assert out.outcome == "fail", (out.outcome, out.reason)


# --- devices, dtypes and the inference precision hint ----------------------------------------


class FakeCompiled:
    def __init__(self, precision):
        self.precision = precision

    def get_property(self, name):
        assert name == "INFERENCE_PRECISION_HINT"
        return self.precision

    def create_infer_request(self):
        return None


class FakeCore:
    """An ``ov.Core`` whose devices, capabilities and compiled precision a test sets."""

    def __init__(self, devices, caps, reports=None):
        self.available_devices = devices
        self.caps = caps
        self.reports = reports
        self.config = None

    def get_property(self, device, name):
        assert name == "OPTIMIZATION_CAPABILITIES"
        return self.caps

    def compile_model(self, model, device, config):
        self.config = config
        return FakeCompiled(self.reports or config["INFERENCE_PRECISION_HINT"])


def _with_core(core):
    impl = OpenVINOSDPA()
    impl.core = core
    return impl


def test_devices_are_cpu_and_the_gpus_openvino_lists():
    impl = _with_core(FakeCore(["CPU", "GPU.0", "GPU.1", "NPU"], ["FP32"]))
    assert impl.devices() == ["cpu", "gpu:0", "gpu:1"]
    assert sdpa.ov_device("gpu:1") == "GPU.1" and sdpa.ov_device("cpu") == "CPU"
    assert _with_core(FakeCore(["CPU"], ["FP32"])).devices() == ["cpu"]


@pytest.mark.parametrize("caps, dtypes", [
    (["FP32", "INT8", "BIN", "EXPORT_IMPORT"], ("float32",)),
    (["FP32", "BF16", "INT8"], ("float32", "bfloat16")),
    (["FP32", "BF16", "FP16"], ("float32", "float16", "bfloat16")),
])
def test_dtypes_are_those_the_device_lists(caps, dtypes):
    assert tuple(_with_core(FakeCore(["CPU"], caps)).dtypes("cpu")) == dtypes


def test_the_hint_is_the_cases_dtype_and_another_reported_precision_is_refused():
    ov = pytest.importorskip("openvino")
    core = FakeCore(["CPU"], ["FP32", "BF16"])
    state = _with_core(core).compile(object(), "cpu", "float32")
    assert core.config == {"INFERENCE_PRECISION_HINT": ov.Type.f32}
    assert state["precision_hint"] == state["inference_precision"] == "f32"
    core = FakeCore(["CPU"], ["FP32", "BF16"], reports=ov.Type.f32)  # bf16 asked, f32 run
    with pytest.raises(Unsupported, match="reports"):
        _with_core(core).compile(object(), "cpu", "bfloat16")
    with pytest.raises(Unsupported, match="OPTIMIZATION_CAPABILITIES"):
        _with_core(FakeCore(["CPU"], ["FP32"])).compile(object(), "cpu", "float16")


def test_the_real_cpu_runs_float32_as_float32():
    impl = OpenVINOSDPA()
    from suite.spec.problem import make_problem

    p = make_problem(0, 1, 3, 3, 8, 2)
    state = impl.prepare(p, "cpu", "float32")
    assert state["inference_precision"] == "f32"


def test_unavailable_without_openvino(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(Unavailable, match="openvino is not installed"):
        OpenVINOSDPA()


# --- ov.convert_model of the torch built-ins' modules ------------------------------------------


def _convert():
    pytest.importorskip("torch")
    from implementations.openvino import convert

    return convert


def test_converted_torch_sdpa_passes_and_a_missing_output_bias_fails():
    convert = _convert()

    class DropsOutputBias(convert.ConvertTorchSDPA):
        """The converted module without the output projection's bias."""

        name = "bug.openvino.convert_drops_bias"

        def exported(self, p, dtype):
            weights, mask = super().exported(p, dtype)
            del weights._buffers["b_o"]
            return weights, mask

    good = outcome(convert.ConvertTorchSDPA(), "masking", "causal")
    assert good.outcome == "pass", good.reason
    bad = outcome(DropsOutputBias(), "masking", "causal")
    assert bad.outcome == "fail", (bad.outcome, bad.reason)


def test_converted_nn_multihead_attention_passes_a_masked_case():
    convert = _convert()
    out = outcome(convert.ConvertTorchNNSDPA(), "masking", "combined")
    assert out.outcome == "pass", out.reason


def test_unavailable_without_torch(monkeypatch):
    convert = _convert()
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(Unavailable, match="needs torch"):
        convert.ConvertTorchSDPA()


# --- OpenVINO reading the ONNX Attention graphs of implementations.onnx -------------------------


def _onnx():
    pytest.importorskip("onnx")
    from implementations.openvino import onnx

    return onnx


def test_openvino_reads_the_onnx_attention_graph():
    onnx = _onnx()
    for case in ("causal", "valid_lens"):
        out = outcome(onnx.OpenVINOOnnx(), "masking", case)
        assert out.outcome == "pass", out.reason


def test_a_graph_openvino_cannot_read_is_unsupported_in_its_words():
    """The static cache's TensorScatter-24 (no conversion rule in openvino 2026.4.1): an
    unsupported case naming the op, never an error; a release that reads it must pass."""
    onnx = _onnx()
    out = outcome(onnx.OpenVINOOnnx(), "generation", "static_cache")
    if out.outcome == "unsupported":
        assert "No conversion rule" in out.reason and "TensorScatter" in out.reason
    else:
        assert out.outcome == "pass", (out.outcome, out.reason)


def test_usage_events_are_declined_inside_the_block_and_the_environment_restored(monkeypatch):
    """OpenVINO's converter skips its usage events (sent from a forked process) where ``CI``
    is "true": inside the block it is, outside it is what the user had."""
    import os

    from suite.plugins.adapters.runtimes import no_usage_events

    for before in (None, "false", "true"):
        if before is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", before)
        with no_usage_events():
            assert os.environ["CI"] == "true"
        assert os.environ.get("CI") == before
