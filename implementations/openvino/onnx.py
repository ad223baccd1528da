"""openvino.onnx: OpenVINO reading the ONNX ``Attention`` graphs the onnxruntime built-ins run.

The graph of each problem is ``implementations.onnx``'s (``OnnxAttentionCore``: projections,
the ONNX-domain ``Attention`` node with ``is_causal``, ``nonpad_kv_seqlen`` and ``attn_mask``
as that module poses them, the output projection), serialized and read by OpenVINO's ONNX
frontend (``ov.Core().read_model(model bytes, b"")``), then compiled for the device with the
inference precision hint of the case's dtype (``sdpa.OpenVINORuntime.compile``) and run with
the same feeds. What OpenVINO's translation of the op computes is the measurement; its
contract says it must agree with onnxruntime on the same graph. A graph with an op the
frontend has no rule for is unsupported in OpenVINO's words (2026.4.1: "No conversion rule
found for operations: TensorScatter-24", the static cache of ``generation/static_cache``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

from implementations.onnx.attention import FEATURES_23, FORMS_23, OnnxAttentionCore
from implementations.openvino.sdpa import NAN_PADDING_CONFINED, OpenVINORuntime, to_bfloat16_bits
from suite.plugins.declarations import Contract
from suite.plugins.interface import Unavailable, Unsupported

ELEMENT_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}


class OpenVINOOnnx(OnnxAttentionCore, OpenVINORuntime):
    """OpenVINO's ONNX frontend and plugin running ``implementations.onnx``'s opset-24 graph."""

    name = "openvino.onnx"
    framework = "openvino"
    deviations = {"nan_padding": NAN_PADDING_CONFINED}
    contracts = (Contract("agrees_with_onnxruntime", "agrees", "onnxruntime.attention",
                          "OpenVINO computes what onnxruntime does on the same ONNX graph"),)

    def __init__(self) -> None:
        try:
            import onnx  # noqa: F401
        except ImportError as exc:
            raise Unavailable(f"{self.name} needs onnx ({exc}); pip install "
                              f"'mha-suite[openvino]'") from None
        OpenVINORuntime.__init__(self)

    def dtypes(self, device: str) -> Sequence[str]:
        return OpenVINORuntime.dtypes(self, device)

    def session(self, model: Any, device: str) -> Any:
        try:
            ov_model = self.core.read_model(model.SerializeToString(), b"")
        except RuntimeError as exc:  # an op this OpenVINO's ONNX frontend has no rule for
            # ("No conversion rule"; 2025.0: "does not support the following ONNX operations:
            # Attention")
            said = [line.strip() for line in str(exc).splitlines()
                    if "No conversion rule" in line
                    or "does not support the following ONNX operations" in line]
            if not said:
                raise
            raise Unsupported(f"openvino {self.ov.get_version()} reads no such graph: "
                              f"{said[0]}") from None
        element = ov_model.inputs[0].get_element_type().get_type_name()
        return self.compile(ov_model, device, ELEMENT_DTYPES.get(element, element))["compiled"]

    def call(self, runnable: Any, inputs: Dict[str, np.ndarray]) -> List[np.ndarray]:
        feeds = {}
        for name, a in inputs.items():
            if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: OpenVINO takes the bits
                a = self.ov.Tensor(to_bfloat16_bits(a.astype(np.float64)), list(a.shape),
                                   self.ov.Type.bf16)
            feeds[name] = a
        request = runnable.create_infer_request()
        request.infer(feeds)
        out = []
        for i in range(len(runnable.outputs)):
            t = request.get_output_tensor(i)
            data = np.array(t.data)
            if t.element_type == self.ov.Type.bf16:
                data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            out.append(data)
        return out


class OpenVINOOnnx23(OpenVINOOnnx):
    """The opset-23 graph (no nonpad_kv_seqlen: key lengths as attn_mask)."""

    name = "openvino.onnx[opset23]"
    opset = 23
    # No policy covers what it does beside masked NaN keys (zero head outputs, not NaN):
    # a known failure (openvino-onnx23-nan-padding-zeroed), not a deviation.
    deviations: dict = {}
    features = FEATURES_23
    mask_forms = FORMS_23
    contracts = (Contract("agrees_with_onnxruntime", "agrees", "onnxruntime.attention[opset23]",
                          "OpenVINO computes what onnxruntime does on the same ONNX graph"),)
