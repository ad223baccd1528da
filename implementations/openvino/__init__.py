"""The OpenVINO built-ins (#49): the canonical problem on OpenVINO's own runtime.

- ``sdpa``: OpenVINO's ``ScaledDotProductAttention`` op (opset13) in a graph built with the
  openvino Python op API (projections as ``MatMul``/``Add`` with the problem's weights as
  constants, heads by ``Reshape``/``Transpose``, the op with its causal flag, a boolean or
  additive ``attention_mask`` and an explicit ``scale``, the output projection), compiled
  with ``ov.Core().compile_model``: ``openvino.sdpa`` (the causal flag where the mask is
  top-left causal alone), ``openvino.sdpa[mask]`` (never the flag: every mask as
  ``attention_mask``), ``openvino.sdpa[float_mask]`` (every mask additive);
- ``convert``: ``ov.convert_model`` of the torch built-ins' modules traced with the case's
  shapes (``openvino.convert[torch.nn]``, ``openvino.convert[torch.sdpa]``), each an export
  path of its eager name, with which it must agree (a ``Contract``).

openvino (and torch, for ``convert``) is imported inside the plugins' constructors: a
missing one makes the names unavailable with one line, never an ImportError.
"""
