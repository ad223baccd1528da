"""The ONNX built-ins: the canonical problem as a small ONNX graph (``common``: projections,
the attention node, the output projection, built with ``onnx.helper``), run by onnxruntime and
by ``onnx.reference`` (``attention``: the ONNX-domain ``Attention`` op, opsets 23 and 24).
onnx and onnxruntime are imported inside the modules that need them only."""
