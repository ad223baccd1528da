"""The "Testing an exported model" recipe (docs/own-module/exported.md): a user's ONNX file
as a plugin (implementations.onnx.model.OnnxModelCore), its projection weights found by
following the graph and replaced by each case's, run on onnxruntime and OpenVINO.

The verdicts are the runtimes' on the exporters' graphs (torch 2.13): the dynamo export
gives rows with no key the mean of the values (its mask is an additive finfo.min), the
TorchScript export zeros; a plugin that maps the graph wrongly fails."""

from __future__ import annotations

import onnx
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

from examples.export_my_attention import exported  # noqa: E402
from implementations.onnx.model import OnnxModelCore, projection_initializers  # noqa: E402
from suite.conformance import catalog  # noqa: E402
from suite.conformance.judge import run_case  # noqa: E402
from suite.plugins.declarations import Deviation  # noqa: E402

FEATURES = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "cross"})


def plugin(dynamo: bool, **attrs) -> OnnxModelCore:
    base = {"name": "mine.onnx", "model": exported(dynamo=dynamo), "heads": 4,
            "mask_input": "mask", "features": FEATURES}
    return type("Exported", (OnnxModelCore,), {**base, **attrs})()


def outcome(impl, family: str, case: str):
    return run_case(impl, impl.name, "cpu", "float32", catalog.get(family, case))


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_the_walk_finds_the_projections_of_both_exporters(dynamo):
    found = projection_initializers(onnx.load(exported(dynamo=dynamo)),
                                    {"query": "query", "key": "key", "value": "value"}, "out")
    assert sorted(found) == ["b_k", "b_o", "b_q", "b_v", "w_k", "w_o", "w_q", "w_v"]
    assert len(set(found.values())) == 8  # eight distinct initializers


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_exports_pass_where_they_compute_the_spec(runtime):
    if runtime == "openvino":
        pytest.importorskip("openvino")
    for dynamo in (True, False):
        impl = plugin(dynamo, runtime=runtime)
        for case in ("none", "valid_lens", "causal", "bool_mask_broadcast"):
            got = outcome(impl, "masking", case)
            assert got.outcome == "pass", (dynamo, case, got.reason)


def test_the_dynamo_export_gives_rows_with_no_key_the_mean_of_the_values():
    # measured: the eager module and the TorchScript export give zeros there
    assert outcome(plugin(False), "masking", "fully_masked_valid_lens").outcome == "pass"
    undeclared = outcome(plugin(True), "masking", "fully_masked_valid_lens")
    assert undeclared.outcome == "fail", undeclared.reason
    declared = plugin(True, deviations={"fully_masked_rows": Deviation(
        "mean_values", "the mask becomes an additive finfo.min")})
    got = outcome(declared, "masking", "fully_masked_valid_lens")
    assert got.outcome == "deviation", got.reason


def test_a_plugin_that_maps_the_graph_wrongly_fails():
    names = projection_initializers(onnx.load(exported(dynamo=True)),
                                    {"query": "query", "key": "key", "value": "value"}, "out")
    swapped = plugin(True, weight_names={**names, "w_k": names["w_v"], "w_v": names["w_k"]})
    assert outcome(swapped, "masking", "none").outcome == "fail"
    flipped = plugin(True, mask_true_means="masked")  # the mask's polarity reversed
    assert outcome(flipped, "masking", "valid_lens").outcome in ("fail", "error")


def test_the_files_sizes_are_its_own():
    got = outcome(plugin(True), "shapes", "one_head")
    assert got.outcome == "unsupported" and "4 query heads" in got.reason, got.reason


def test_a_graph_the_walk_cannot_follow_is_refused_when_the_plugin_loads(tmp_path):
    model = onnx.load(exported(dynamo=True))
    for node in model.graph.node:  # the key projection reads the query input: one input
        node.input[:] = ["query" if i == "key" else i for i in node.input]
    path = tmp_path / "self.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ValueError, match="input .query.*found 2.*weight_names"):
        plugin(True, model=str(path))
