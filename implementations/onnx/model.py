"""A model as it is shipped: a user's ONNX file whose attention block the suite checks.

``OnnxModelCore`` makes an exported attention block (``torch.onnx.export``, either exporter,
or any ONNX file whose block takes query, key and value and gives the output) a plugin: the
graph runs as it is, on onnxruntime or on OpenVINO's ONNX reader, with only its projection
weights replaced by each case's. The weights are found by following the graph: the
``MatMul`` that reads the query input with an initializer beside it holds ``w_q`` in the
right-multiply layout the exporters write, the ``Add`` after it ``b_q``; likewise key and
value; the ``MatMul`` (and ``Add``) that end at the output hold ``w_o`` and ``b_o``. A graph
the walk cannot read (a self-attention block with one input, a fused ``Gemm``) names its
initializers in ``weight_names``. The graph's sizes are its own: a case of another width or
head count is unsupported, naming both sizes. Nothing else is changed: what the runtime
computes is the measurement.

A block inside a larger graph is cut out first, with ``onnx.utils.extract_model(path,
out_path, input_names, output_names)`` (its inputs: the hidden states entering the block,
its output: the block's output before the residual).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from suite.plugins.adapters import split_mask
from suite.plugins.interface import Implementation, Result, Unavailable, Unsupported
from suite.spec.problem import Problem

ROLES = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")
RUNTIMES = ("onnxruntime", "openvino")
ONNX_FLOATS = {1: "float32", 10: "float16", 11: "float64"}  # TensorProto data types


def projection_initializers(model: Any, inputs: Mapping[str, str], output: str
                            ) -> Dict[str, str]:
    """role ("w_q", "b_q", ...) -> initializer name, found by following ``model``'s graph
    from its inputs (``inputs``: "query"/"key"/"value" -> graph input name) and back from
    ``output``. Raises ValueError naming what it could not find."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    readers: Dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    producer = {out: node for node in graph.node for out in node.output}

    def weight_of(node: Any, tensor: str) -> Optional[str]:  # the initializer beside tensor
        others = [i for i in node.input if i != tensor and i in inits]
        return others[0] if len(others) == 1 else None

    found: Dict[str, str] = {}
    names = list(inputs.values())
    if len(set(names)) != len(names):
        raise ValueError(f"query, key and value share graph inputs ({dict(inputs)}): name the "
                         f"projections' initializers in weight_names")
    for role, graph_input in inputs.items():
        r = role[0]  # q, k, v
        matmuls = [n for n in readers.get(graph_input, []) if n.op_type == "MatMul"
                   and weight_of(n, graph_input)]
        if len(matmuls) != 1:
            raise ValueError(f"input {graph_input!r} ({role}): expected one MatMul with an "
                             f"initializer, found {len(matmuls)}; name them in weight_names")
        found[f"w_{r}"] = weight_of(matmuls[0], graph_input)
        adds = [n for n in readers.get(matmuls[0].output[0], []) if n.op_type == "Add"
                and weight_of(n, matmuls[0].output[0])]
        if adds:
            found[f"b_{r}"] = weight_of(adds[0], matmuls[0].output[0])
    node = producer.get(output)
    if node is not None and node.op_type == "Add":
        x = [i for i in node.input if i not in inits]
        if len(x) == 1 and x[0] in producer and producer[x[0]].op_type == "MatMul":
            found["b_o"] = weight_of(node, x[0])
            node = producer[x[0]]
    if node is None or node.op_type != "MatMul" or not any(i in inits for i in node.input):
        raise ValueError(f"output {output!r}: not made by a MatMul with an initializer (the "
                         f"output projection); name it in weight_names")
    found["w_o"] = next(i for i in node.input if i in inits)
    return found


class OnnxModelCore(Implementation):
    """A user's ONNX file as a plugin. Set ``model`` (a path, or an ``onnx.ModelProto``),
    ``heads`` (its query heads; ``kv_heads`` when it has fewer key/value heads), ``inputs``
    (the graph's input for each of query, key and value), ``mask_input`` (the graph's mask
    input, if any) with ``mask_true_means`` ("attend" or "masked"; "additive" for a float
    mask of 0 and -inf), and the ``features`` the graph takes. ``runtime``: "onnxruntime"
    (the default) or "openvino"; override ``feeds`` for inputs of another kind."""

    framework = "onnxruntime"
    model: ClassVar[Union[str, os.PathLike, Any, None]] = None
    heads: ClassVar[int] = 0
    inputs: ClassVar[Mapping[str, str]] = {"query": "query", "key": "key", "value": "value"}
    output: ClassVar[Optional[str]] = None  # None: the graph's first output
    mask_input: ClassVar[Optional[str]] = None
    mask_true_means: ClassVar[str] = "attend"
    weight_names: ClassVar[Optional[Mapping[str, str]]] = None  # None: found by the walk
    runtime: ClassVar[str] = "onnxruntime"

    def __init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"{type(self).__name__}.runtime: expected one of {RUNTIMES}, "
                             f"got {self.runtime!r}")
        try:
            import onnx
        except ImportError as exc:
            raise Unavailable(f"onnx is not installed ({exc}); pip install 'mha-suite[onnx]'") from None
        try:
            __import__(self.runtime)
        except ImportError as exc:
            extra = "onnx" if self.runtime == "onnxruntime" else "openvino"
            raise Unavailable(f"{self.runtime} is not installed ({exc}); pip install "
                              f"'mha-suite[{extra}]'") from None
        if self.model is None or self.heads < 1:
            raise ValueError(f"{type(self).__name__}: set model (an ONNX file or ModelProto) "
                             f"and heads (its query heads)")
        self.framework = self.runtime
        self.proto = self.model if isinstance(self.model, onnx.ModelProto) else \
            onnx.load(str(Path(self.model)))
        graph = self.proto.graph
        self.out_name = self.output or graph.output[0].name
        self.weights = dict(self.weight_names) if self.weight_names else \
            projection_initializers(self.proto, self.inputs, self.out_name)
        inits = {t.name: t for t in graph.initializer}
        missing = sorted(r for r in ("w_q", "w_k", "w_v", "w_o") if self.weights.get(r) not in inits)
        if missing:
            raise ValueError(f"{type(self).__name__}: no initializer for {missing} "
                             f"(weight_names: {self.weights})")
        w_q = inits[self.weights["w_q"]]
        self.dtype = ONNX_FLOATS.get(w_q.data_type)
        if self.dtype is None:
            raise Unavailable(f"the graph's weights are of ONNX type {w_q.data_type}, not a "
                              f"float the suite poses")

    def framework_version(self) -> str:
        import importlib.metadata

        return importlib.metadata.version(self.runtime)

    def dtypes(self, device: str) -> Tuple[str, ...]:
        return (self.dtype,)  # the file's own: its graph is run as shipped

    def sizes(self) -> Dict[str, Tuple[int, ...]]:
        from onnx import numpy_helper

        inits = {t.name: t for t in self.proto.graph.initializer}
        return {role: numpy_helper.to_array(inits[name]).shape
                for role, name in self.weights.items()}

    def feeds(self, problem: Problem, query: np.ndarray, key: np.ndarray, value: np.ndarray
              ) -> Dict[str, np.ndarray]:
        """The graph's inputs for ``problem`` (arrays in the graph's dtype)."""
        feeds = {self.inputs["query"]: query, self.inputs["key"]: key,
                 self.inputs["value"]: value}
        if self.mask_input is None:
            return feeds
        additive = self.mask_true_means == "additive"
        parts = split_mask(problem, true_means="attend" if additive else self.mask_true_means,
                           key_padding=False, native_causal=())
        if parts.bias is not None and not additive:
            raise Unsupported("an additive bias; the graph's mask input is boolean")
        B, H, L, S = parts.shape
        if additive:
            keep = np.ones((B, 1, L, S), bool) if parts.mask is None else parts.mask
            bias = 0 if parts.bias is None else parts.bias
            feeds[self.mask_input] = np.where(keep, bias, -np.inf).astype(query.dtype)
        else:
            fill = self.mask_true_means == "attend"
            feeds[self.mask_input] = np.full((B, 1, L, S), fill) if parts.mask is None \
                else parts.mask
        return feeds

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        import onnx
        from onnx import numpy_helper

        if device != "cpu" or dtype != self.dtype:
            raise ValueError(f"device/dtype: expected cpu/{self.dtype}, got {device}/{dtype}")
        if problem.H != self.heads or problem.K != (self.kv_heads or self.heads):
            raise Unsupported(f"the graph has {self.heads} query heads and "
                              f"{self.kv_heads or self.heads} key/value heads; the case "
                              f"{problem.H} and {problem.K}")
        sizes, w = self.sizes(), problem.weights.as_dict()
        for role in ROLES:
            have = w.get(role)
            if role not in self.weights:
                if have is not None:
                    raise Unsupported(f"the graph has no {role}; the case has one (set "
                                      f"projection_bias = False for a graph without biases)")
                continue
            if have is None:  # the case has no biases: the graph's become zeros
                have = np.zeros(sizes[role])
            if np.shape(have) != sizes[role]:
                raise Unsupported(f"the graph's {role} is {sizes[role]}, the case's "
                                  f"{np.shape(have)} (its sizes are fixed)")
        model = onnx.ModelProto()
        model.CopyFrom(self.proto)
        names = {name: role for role, name in self.weights.items()}
        for t in model.graph.initializer:
            if t.name in names:
                array = w.get(names[t.name])
                array = np.zeros(sizes[names[t.name]]) if array is None else array
                t.CopyFrom(numpy_helper.from_array(np.asarray(array, dtype=self.dtype), t.name))
        cast = lambda a: np.ascontiguousarray(a, dtype=self.dtype)  # noqa: E731
        feeds = self.feeds(problem, cast(problem.query), cast(problem.key), cast(problem.value))
        for given in self.proto.graph.input:  # a dimension the export fixed stays fixed
            dims = [d.dim_value if d.HasField("dim_value") else None
                    for d in given.type.tensor_type.shape.dim]
            shape = np.shape(feeds.get(given.name, ()))
            if given.name in feeds and (len(dims) != len(shape) or any(
                    d is not None and d != n for d, n in zip(dims, shape))):
                raise Unsupported(f"the graph's input {given.name!r} is fixed at "
                                  f"{tuple('?' if d is None else d for d in dims)}; the case "
                                  f"gives {shape}")
        return {"run": self.session(model), "feeds": feeds}

    def session(self, model: Any):
        """A callable running ``model`` on this plugin's runtime: feeds -> output."""
        if self.runtime == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.log_severity_level = 3
            sess = ort.InferenceSession(model.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])
            return lambda feeds: sess.run([self.out_name], feeds)[0]
        from suite.plugins.adapters.runtimes import no_usage_events

        with no_usage_events():  # its import sends one from a forked process
            import openvino as ov
        with tempfile.TemporaryDirectory() as tmp:  # the ONNX reader takes a file
            path = Path(tmp) / "model.onnx"
            path.write_bytes(model.SerializeToString())
            compiled = ov.Core().compile_model(ov.Core().read_model(str(path)), "CPU",
                                               {"INFERENCE_PRECISION_HINT": self.dtype.replace(
                                                   "float", "f")})
        port = compiled.output(self.out_name)
        return lambda feeds: compiled(feeds)[port]

    def run(self, state: Dict[str, Any]) -> np.ndarray:
        return state["run"](state["feeds"])

    def fetch(self, state: Dict[str, Any], handle: np.ndarray) -> Result:
        return Result(np.asarray(handle, dtype=np.float64))
