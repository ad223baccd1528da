"""The canonical problem as a small ONNX graph, for every runtime that reads ONNX.

``problem_model(problem, dtype, ...)`` returns the ``onnx.ModelProto`` of one problem: the
q/k/v projections (``MatMul`` + ``Add`` with the problem's weights as initializers, or as
graph inputs), one attention node, then the output projection. What the node is and how the
mask reaches it are parameters (``AttentionGraph``), so onnxruntime's contrib ops and OpenVINO
reading the same graphs reuse this module:

- ``AttentionGraph``: the graph's static facts (sizes, dtype, opset, the node's attributes,
  which optional inputs it has: attn_mask, past_key/past_value with present_* outputs,
  nonpad_kv_seqlen, a static cache written by ``TensorScatter``; 3-D inputs with
  ``q_num_heads``/``kv_num_heads`` or 4-D (B, heads, L, d) inputs);
- ``attention_model(graph, weights)``: the ModelProto of a graph;
- ``MaskPose``/``pose_mask(problem, ...)``: the canonical mask in the op's own inputs
  (``is_causal``, ``nonpad_kv_seqlen``, the rest as a boolean (True = attend) or additive
  ``attn_mask``), or everything as an explicit ``attn_mask``;
- ``feeds(...)``: the input arrays of one call, by input name (``INPUT_NAMES``).

Nothing here imports onnxruntime; onnx is imported inside the functions that build graphs.
Letters: B batch, L query rows, S keys, E model width, H query heads, K kv heads, D q/k head
width, V value head width, C static cache slots.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from suite.plugins.adapters import causal_allowed, form_mask, form_parts, requested_form, split_mask
from suite.plugins.interface import Unsupported
from suite.spec.problem import Problem, Weights

# The ONNX tensor element type of each suite dtype (onnx.TensorProto's names).
ONNX_TYPES = {"float64": "DOUBLE", "float32": "FLOAT", "float16": "FLOAT16",
              "bfloat16": "BFLOAT16"}
# The graph's input and output names (one place, for runtimes that feed by name).
INPUT_NAMES = ("query", "key", "value", "attn_mask", "past_key", "past_value",
               "nonpad_kv_seqlen", "cache_key", "cache_value", "write_index")
OUTPUT_NAMES = ("output", "present_key", "present_value")
WEIGHT_NAMES = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")


def numpy_dtype(dtype: str) -> Any:
    """The NumPy dtype of a suite dtype (bfloat16: ml_dtypes', as onnx reads it)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


@dataclasses.dataclass(frozen=True)
class MaskPose:
    """The canonical mask in an attention op's own terms.

    is_causal: the op's causal attribute (ONNX ``Attention``: offset-aware, query i sees key
        j <= i + offset, offset 0 without a cache, ``past_sequence_length`` with ``past_key``,
        ``nonpad_kv_seqlen - L`` with ``nonpad_kv_seqlen``);
    nonpad_kv_seqlen: int64 (B,) key lengths, or None;
    attn_mask: the rest, bool (True = attend) or float64 additive (the bias, -inf where
        masked), 4-D (B|1, H|1, L, S) as ``split_mask`` leaves it (or the requested form's
        own shape), or None.
    """

    is_causal: bool = False
    nonpad_kv_seqlen: Optional[np.ndarray] = None
    attn_mask: Optional[np.ndarray] = None

    @property
    def mask_kind(self) -> Optional[str]:
        """"bool", "float" or None: the attn_mask input the graph needs."""
        if self.attn_mask is None:
            return None
        return "bool" if self.attn_mask.dtype == bool else "float"


def _rest(problem: Problem, **drop: Any) -> Problem:
    """``problem`` with mask fields set as ``drop`` says (the parts posed elsewhere)."""
    return dataclasses.replace(problem, mask=dataclasses.replace(problem.mask, **drop))


def _as_attn_mask(problem: Problem) -> Optional[np.ndarray]:
    """Everything of the canonical mask as one attn_mask (B, H|1, L, S): boolean (True =
    attend) without a bias, else additive (the bias where attended, -inf elsewhere)."""
    parts = split_mask(problem, key_padding=False, native_causal=())
    if parts.is_empty:
        return None
    if parts.bias is None:
        return np.ascontiguousarray(parts.allowed())
    return parts.additive()


def pose_mask(problem: Problem, *, native: bool = True, nonpad: bool = True) -> MaskPose:
    """The canonical mask of ``problem`` as an ONNX ``Attention`` node takes it.

    native: pose each part through the op's own inputs where it has one: a top-left causal
        part as ``is_causal`` (offset 0: no cache), a bottom-right one with Lq != Lk as
        ``is_causal`` beside ``nonpad_kv_seqlen`` = S (the op's offset S - L), key lengths (B,)
        as ``nonpad_kv_seqlen`` (not beside a top-left causal flag: it moves the causal
        frontier to ``nonpad_kv_seqlen - L``), the decode form (rows at ``valid_lens - L``)
        as ``is_causal`` beside ``nonpad_kv_seqlen``; the rest as ``attn_mask``.
        False: the whole mask as ``attn_mask``.
    nonpad: whether the op has ``nonpad_kv_seqlen`` (opset 24 on).
    A requested mask form (``requested_form``) is posed as it names its parts.
    """
    form = requested_form(problem)
    if form is not None:
        return _pose_form(problem, form)
    m, L, S = problem.mask, problem.L, problem.S
    if m.is_empty():
        return MaskPose()
    if not native:
        return MaskPose(attn_mask=_as_attn_mask(problem))
    lens = None if m.valid_lens is None or np.ndim(m.valid_lens) != 1 else \
        np.asarray(m.valid_lens, np.int64)
    if m.query_offset is not None:  # the decode form: rows at per-batch offsets
        if nonpad and m.causal and lens is not None and np.array_equal(
                np.asarray(m.query_offset), lens - L):
            rest = _rest(problem, causal=False, valid_lens=None, query_offset=None)
            return MaskPose(True, lens, _as_attn_mask(rest))
        return MaskPose(attn_mask=_as_attn_mask(problem))
    if m.causal and (m.causal_align == "top_left" or L == S):
        rest = _rest(problem, causal=False)
        return MaskPose(True, None, _as_attn_mask(rest))
    if m.causal and nonpad and lens is None:  # bottom right, Lq != Lk: a full external cache
        rest = _rest(problem, causal=False)
        return MaskPose(True, np.full(problem.B, S, np.int64), _as_attn_mask(rest))
    if lens is not None and nonpad:
        rest = _rest(problem, valid_lens=None)
        return MaskPose(False, lens, _as_attn_mask(rest))
    return MaskPose(attn_mask=_as_attn_mask(problem))


def _pose_form(problem: Problem, form: str) -> MaskPose:
    """A mask form (``MASK_FORMS``) in the op's inputs: ``causal_flag`` as ``is_causal``,
    ``kv_lengths`` as ``nonpad_kv_seqlen``, a ``bool_*``/``float_*`` part as ``attn_mask``
    in its own shape (the op broadcasts it, right-aligned, to (B, H, L, S))."""
    parts = form_parts(form)
    got = form_mask(problem, form)
    lens = None if got.kv_lengths is None else np.asarray(got.kv_lengths, np.int64)
    if got.key_padding is not None or got.query_mask is not None or got.q_lengths is not None:
        raise Unsupported(f"mask form {form}: the ONNX Attention op has no key padding or "
                          f"query mask input of its own")
    return MaskPose("causal_flag" in parts, lens, got.attn)


@dataclasses.dataclass(frozen=True)
class AttentionGraph:
    """The static facts of one graph: sizes, dtype, opset, the node and its optional inputs.

    node: the attention node's (domain, op type): ("", "Attention") by default; another
        op (a contrib op) sets its own attributes through ``attributes``.
    rank: 3 (q/k/v (B, L, heads*d) with ``q_num_heads``/``kv_num_heads``) or 4 (q/k/v
        reshaped and transposed in the graph to (B, heads, L, d); no head attributes).
    mask: None, "bool" or "float": an ``attn_mask`` input of ``mask_rank`` dims.
    cache: None; "past" (``past_key``/``past_value`` (B, K, P, d) inputs, ``present_key``/
        ``present_value`` outputs: the op appends the chunk's keys); or "static" (a
        (B, K, C, d) cache input the chunk is written into by ``TensorScatter`` at
        ``write_index`` (B,), the written cache the op's K/V and the graph's present_*
        outputs; rank 4, with ``nonpad_kv_seqlen``).
    weights_as: "initializers" (the problem's weights in the model) or "inputs" (fed).
    """

    E: int
    H: int
    K: int
    D: int
    V: int
    dtype: str = "float32"
    opset: int = 24
    node: Tuple[str, str] = ("", "Attention")
    scale: Optional[float] = None
    softcap: Optional[float] = None
    is_causal: bool = False
    mask: Optional[str] = None
    mask_rank: int = 4
    nonpad: bool = False
    cache: Optional[str] = None
    rank: int = 3
    biases: Tuple[bool, bool, bool, bool] = (True, True, True, True)  # q, k, v, o
    weights_as: str = "initializers"
    attributes: Tuple[Tuple[str, Any], ...] = ()  # more node attributes (name, value)

    def node_attributes(self) -> Dict[str, Any]:
        """The attention node's attributes: heads (3-D inputs), is_causal, scale, softcap
        (each only where the problem sets it: the op's defaults are part of what is
        measured), and ``attributes``."""
        out: Dict[str, Any] = {}
        if self.rank == 3:
            out.update(q_num_heads=self.H, kv_num_heads=self.K)
        if self.is_causal:
            out["is_causal"] = 1
        if self.scale is not None:
            out["scale"] = float(self.scale)
        if self.softcap is not None:
            out["softcap"] = float(self.softcap)
        out.update(dict(self.attributes))
        return out


def graph_for(problem: Problem, dtype: str, pose: MaskPose, *, opset: int = 24,
              cache: Optional[str] = None, rank: int = 3, weights_as: str = "initializers",
              **more: Any) -> AttentionGraph:
    """The ``AttentionGraph`` of ``problem`` posed as ``pose`` (``more``: other fields)."""
    w = problem.weights
    fields: Dict[str, Any] = dict(
        E=problem.E, H=problem.H, K=problem.K, D=problem.D, V=problem.V, dtype=dtype,
        opset=opset, scale=problem.scale, softcap=problem.softcap, is_causal=pose.is_causal,
        mask=pose.mask_kind, mask_rank=4 if pose.attn_mask is None else pose.attn_mask.ndim,
        nonpad=pose.nonpad_kv_seqlen is not None or cache == "static", cache=cache,
        rank=4 if cache == "static" else rank,
        biases=tuple(b is not None for b in (w.b_q, w.b_k, w.b_v, w.b_o)),
        weights_as=weights_as)
    fields.update(more)
    return AttentionGraph(**fields)


def _weight_arrays(g: AttentionGraph, weights: Weights) -> Dict[str, np.ndarray]:
    t = numpy_dtype(g.dtype)
    return {n: np.ascontiguousarray(np.asarray(a, np.float64).astype(t))
            for n, a in weights.as_dict().items() if a is not None}


def attention_model(g: AttentionGraph, weights: Optional[Weights] = None) -> Any:
    """The ``onnx.ModelProto`` of graph ``g``: inputs query (B, L, E), key and value
    (B, S, E), then the optional inputs in ``INPUT_NAMES`` order; outputs ``output`` (B, L, E)
    and, with a cache, ``present_key``/``present_value``. ``weights``: the problem's (needed
    when ``g.weights_as`` is "initializers"), cast to ``g.dtype``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = getattr(TensorProto, ONNX_TYPES[g.dtype])
    nodes: List[Any] = []
    inputs: List[Any] = []
    inits: List[Any] = []
    E, H, K, D, V = g.E, g.H, g.K, g.D, g.V
    shapes = {"w_q": [E, H * D], "w_k": [E, K * D], "w_v": [E, K * V], "w_o": [H * V, E],
              "b_q": [H * D], "b_k": [K * D], "b_v": [K * V], "b_o": [E]}
    present = [n for n, on in zip(WEIGHT_NAMES, (True, g.biases[0], True, g.biases[1], True,
                                                 g.biases[2], True, g.biases[3])) if on]
    if g.weights_as == "initializers":
        if weights is None:
            raise ValueError("weights: expected the problem's Weights for weights_as="
                             "'initializers', got None")
        arrays = _weight_arrays(g, weights)
        inits += [numpy_helper.from_array(arrays[n], n) for n in present]
    elif g.weights_as == "inputs":
        inputs += [helper.make_tensor_value_info(n, elem, shapes[n]) for n in present]
    else:
        raise ValueError(f"weights_as: expected 'initializers' or 'inputs', got {g.weights_as!r}")

    def value(name: str, dims: List[Any], kind: int = elem) -> Any:
        return helper.make_tensor_value_info(name, kind, dims)

    inputs += [value("query", ["B", "L", E]), value("key", ["B", "S", E]),
               value("value", ["B", "S", E])]

    def project(x: str, role: str) -> str:
        nodes.append(helper.make_node("MatMul", [x, f"w_{role}"], [f"{role}_mm"]))
        if f"b_{role}" not in present:
            return f"{role}_mm"
        nodes.append(helper.make_node("Add", [f"{role}_mm", f"b_{role}"], [f"{role}_proj"]))
        return f"{role}_proj"

    q, k, v = project("query", "q"), project("key", "k"), project("value", "v")
    if g.rank == 4:  # (B, L, heads*d) -> (B, heads, L, d) in the graph
        def heads_first(x: str, heads: int, width: int) -> str:
            shape = f"{x}_shape"
            inits.append(numpy_helper.from_array(np.array([0, 0, heads, width], np.int64), shape))
            nodes.append(helper.make_node("Reshape", [x, shape], [f"{x}_4d"]))
            nodes.append(helper.make_node("Transpose", [f"{x}_4d"], [f"{x}_bhld"],
                                          perm=[0, 2, 1, 3]))
            return f"{x}_bhld"

        q, k, v = heads_first(q, H, D), heads_first(k, K, D), heads_first(v, K, V)
    elif g.rank != 3:
        raise ValueError(f"rank: expected 3 or 4, got {g.rank!r}")
    optional = {"attn_mask": "", "past_key": "", "past_value": "", "nonpad_kv_seqlen": ""}
    outputs = [value("output", ["B", "L", E])]
    attn_out = ["attn"]
    if g.mask is not None:
        kind = TensorProto.BOOL if g.mask == "bool" else elem
        inputs.append(value("attn_mask", [f"m{i}" for i in range(g.mask_rank)], kind))
        optional["attn_mask"] = "attn_mask"
    if g.cache == "past":
        inputs += [value("past_key", ["B", K, "P", D]), value("past_value", ["B", K, "P", V])]
        optional.update(past_key="past_key", past_value="past_value")
        attn_out += ["present_key", "present_value"]
        outputs += [value("present_key", ["B", K, "T", D]),
                    value("present_value", ["B", K, "T", V])]
    elif g.cache == "static":
        if g.rank != 4:
            raise ValueError("cache='static': the op reads the whole (B, K, C, d) cache, so "
                             "the graph's inputs are 4-D (rank=4)")
        inputs += [value("cache_key", ["B", K, "C", D]), value("cache_value", ["B", K, "C", V]),
                   value("write_index", ["B"], TensorProto.INT64)]
        for name, x in (("present_key", k), ("present_value", v)):
            nodes.append(helper.make_node("TensorScatter", [f"cache_{name[8:]}", x,
                                                            "write_index"], [name]))
        k, v = "present_key", "present_value"
        outputs += [value("present_key", ["B", K, "C", D]),
                    value("present_value", ["B", K, "C", V])]
    elif g.cache is not None:
        raise ValueError(f"cache: expected None, 'past' or 'static', got {g.cache!r}")
    if g.nonpad:
        inputs.append(value("nonpad_kv_seqlen", ["B"], TensorProto.INT64))
        optional["nonpad_kv_seqlen"] = "nonpad_kv_seqlen"
    node_in = [q, k, v] + list(optional.values())
    while node_in and node_in[-1] == "":  # trailing optional inputs left out
        node_in.pop()
    domain, op = g.node
    nodes.append(helper.make_node(op, node_in, attn_out, domain=domain or None,
                                  **g.node_attributes()))
    y = "attn"
    if g.rank == 4:  # (B, H, L, V) -> (B, L, H*V)
        inits.append(numpy_helper.from_array(np.array([0, 0, H * V], np.int64), "y_shape"))
        nodes.append(helper.make_node("Transpose", [y], ["attn_blhv"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", ["attn_blhv", "y_shape"], ["attn_3d"]))
        y = "attn_3d"
    nodes.append(helper.make_node("MatMul", [y, "w_o"], ["out_mm" if g.biases[3] else "output"]))
    if g.biases[3]:
        nodes.append(helper.make_node("Add", ["out_mm", "b_o"], ["output"]))
    graph = helper.make_graph(nodes, "mha", inputs, outputs, initializer=inits)
    opsets = [helper.make_opsetid("", g.opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="mha-suite")
    model.ir_version = min(model.ir_version, 10)  # what runtimes in range read
    onnx.checker.check_model(model)
    return model


def problem_model(problem: Problem, dtype: str = "float32", *, opset: int = 24,
                  native: bool = True, rank: int = 3, weights_as: str = "initializers") -> Any:
    """The ``onnx.ModelProto`` of ``problem`` (one call, no cache) in ``dtype``: its mask
    posed by ``pose_mask`` (``native``), the ONNX ``Attention`` op of ``opset``; feed it
    with ``feeds(graph, ..., pose_mask(problem, ...))``. A generation problem's graphs are
    per chunk (``chunk_pose``, ``graph_for(..., cache="past"|"static")``)."""
    pose = pose_mask(problem, native=native, nonpad=opset >= 24)
    g = graph_for(problem, dtype, pose, opset=opset, rank=rank, weights_as=weights_as)
    return attention_model(g, problem.weights)


def feeds(g: AttentionGraph, query: np.ndarray, key: np.ndarray, value: np.ndarray,
          pose: MaskPose, weights: Optional[Weights] = None,
          **cache: np.ndarray) -> Dict[str, np.ndarray]:
    """The input arrays of one call of ``g``, in its dtype, by input name: the inputs, the
    pose's attn_mask and nonpad_kv_seqlen, the cache arrays (``past_key``/``past_value``, or
    ``cache_key``/``cache_value``/``write_index``) and, with ``weights_as="inputs"``, the
    weights."""
    t = numpy_dtype(g.dtype)

    def cast(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(a, np.float64).astype(t))

    out = {"query": cast(query), "key": cast(key), "value": cast(value)}
    if g.mask is not None:
        a = pose.attn_mask
        out["attn_mask"] = np.ascontiguousarray(a) if a.dtype == bool else cast(a)
    if g.nonpad:
        out["nonpad_kv_seqlen"] = np.asarray(pose.nonpad_kv_seqlen, np.int64)
    for name, a in cache.items():
        out[name] = np.asarray(a, np.int64) if name == "write_index" else cast(a)
    if g.weights_as == "inputs":
        if weights is None:
            raise ValueError("weights: expected the problem's Weights for weights_as='inputs', "
                             "got None")
        out.update(_weight_arrays(g, weights))
    return out


def chunk_pose(problem: Problem, start: int, end: int, total: int, *, native: bool,
               static: bool) -> MaskPose:
    """The mask of one chunk (rows start..end-1) of a generation problem (``Problem.steps``:
    causal self-attention, maybe with a boolean part) over a cache of ``total`` slots.

    native: the causal part through the op (``is_causal``: its offset is the past length, or
        ``nonpad_kv_seqlen - n`` = start for a static cache), the boolean part as attn_mask
        (slots past ``end`` False); False: the whole mask (causal and slots past ``end``)
        as a boolean attn_mask."""
    B, H, L = problem.B, problem.H, problem.L
    allowed = np.ones((1, 1, L, L), bool) if problem.mask.allowed is None else \
        np.asarray(problem.mask.allowed, bool)
    if not native:
        allowed = allowed & causal_allowed(L, L)
    heads = 1 if allowed.ndim < 3 or allowed.shape[-3] == 1 else H
    rows = np.broadcast_to(allowed, allowed.shape[:-2] + (L, L))[..., start:end, :end]
    rows = np.broadcast_to(rows, (rows.shape[0] if rows.ndim == 4 else 1, heads, end - start,
                                  end))
    mask = np.zeros(rows.shape[:-1] + (total,), bool)
    mask[..., :end] = rows
    lens = np.full(B, end, np.int64) if static else None
    if native and problem.mask.allowed is None:
        return MaskPose(True, lens, None)
    return MaskPose(native, lens, mask)
