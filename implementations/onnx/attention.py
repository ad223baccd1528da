"""The ONNX-domain ``Attention`` op (opsets 23 and 24), run by onnxruntime and by
``onnx.reference`` (the specification's executable form).

Each name poses the canonical problem as one small graph (``implementations.onnx.common``:
MatMul/Add projections with the problem's weights as initializers, the ``Attention`` node
with 3-D inputs and ``q_num_heads``/``kv_num_heads`` (GQA natively), the output projection),
run in the case's dtype. The mask goes through the op's own inputs where it has one:

- ``is_causal`` for a causal part (the op's frontier is offset-aware: query i sees key
  j <= i + offset, offset 0 without a cache, the past length with ``past_key``, and
  ``nonpad_kv_seqlen - Lq`` with ``nonpad_kv_seqlen``), so a bottom-right causal mask with
  Lq != Lk is ``is_causal`` beside ``nonpad_kv_seqlen = Lk`` (opset 24);
- ``nonpad_kv_seqlen`` (opset 24) for key lengths (B,) and, with ``is_causal``, for the
  decode form (rows at ``valid_lens - Lq``);
- the rest as ``attn_mask``: boolean (True = attend) without a bias, else additive;
- ``scale`` and ``softcap`` as attributes, only where the problem sets them;
- generation (``Problem.steps``): one graph call per chunk, ``past_key``/``past_value`` fed
  with the previous call's ``present_key``/``present_value`` (a zero-length past first),
  ``is_causal`` at the past length; a static cache (opset 24): the chunk written by
  ``TensorScatter`` into a (B, K, C, d) cache at the chunk's start, the op reading the whole
  cache with ``nonpad_kv_seqlen`` = the chunk's end (4-D inputs).

``[mask]`` names pose the whole mask as an explicit ``attn_mask`` (no ``is_causal``, no
``nonpad_kv_seqlen``): a contract holds them to the native path. ``[opset23]`` names build an
opset-23 graph (no ``nonpad_kv_seqlen``: key lengths and the decode form as ``attn_mask``, no
static cache). A plugin never repairs what the runtime computes: where the runtime's answer
differs from the problem's, a deviation (with the spec's words) or a known failure says so.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from implementations.onnx.common import (
    ONNX_TYPES,
    AttentionGraph,
    MaskPose,
    attention_model,
    chunk_pose,
    feeds,
    graph_for,
    numpy_dtype,
    pose_mask,
)
from suite.plugins import cache, probes
from suite.plugins.conditions import Where
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Implementation, Result, Unavailable, Unsupported
from suite.spec.problem import Problem, Weights

# What the op takes natively: attn_mask broadcastable (right-aligned, numpy rules) to
# (B, H, L, S), boolean (True = attend) or additive, in any of these shapes; is_causal; and
# (opset 24) nonpad_kv_seqlen as key lengths. A 3-D mask is (H, L, S) to the op, so the
# head-free (B, L, S) forms are not native; nor is a key axis of 1 (BHL1): the spec pads a
# mask's last axis shorter than the keys with -inf, it does not broadcast it.
ATTN_SHAPES = ("BHLS", "B1LS", "11LS", "B11S", "LS")
FORMS_23 = frozenset({f"{kind}_{shape}" for kind in ("bool", "float") for shape in ATTN_SHAPES}
                     | {"causal_flag", "causal_flag+bool_B11S"})
FORMS_24 = FORMS_23 | {"kv_lengths", "kv_lengths+bool_B1LS", "causal_flag+kv_lengths"}
FEATURES_23 = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                         "cross", "gqa", "scale", "softcap", "value_width", "decode", "steps"})
FEATURES_24 = FEATURES_23 | {"static_cache"}
DTYPES = ("float64", "float32", "float16", "bfloat16")


def nan_padding(runtime: str) -> Deviation:
    """NaN in a masked key reaches the rows beside it: the op adds the mask to the scores."""
    return Deviation("confined", f"{runtime}: a NaN or inf key or value at a position the mask "
                     "hides gives NaN rows, as the spec says it computes: the causal frontier "
                     "and attn_mask are \"composed additively, by summing their attention "
                     "biases\" and the bias is added to Q*K^T (NaN + -inf is NaN), and 0 * NaN "
                     "is NaN in softmax @ V (measured: masking/nan_padding, special_values "
                     "*_causal, lanes/nan_padding_S*)")


@functools.cache
def ort_onnx_opset() -> Optional[int]:
    """The newest ONNX-domain opset the installed onnxruntime reads: the newest version of
    any ONNX-domain op in its own registry of operator schemas (a model importing a newer
    opset is refused at session start), read once per process; None where the runtime does
    not list its schemas."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    get = getattr(state, "get_all_operator_schema", None)
    if get is None:  # pragma: no cover - every release in range lists them
        return None
    return max(s.since_version for s in get() if s.domain in ("", "ai.onnx"))


class OnnxAttentionCore(Implementation):
    """One graph per problem, run by a runtime (``session``/``call``, per subclass)."""

    opset: int = 24
    native: bool = True  # False: the whole mask as attn_mask
    rank: int = 3  # the Attention node's input rank (3-D with head attributes, or 4-D)
    # The op's softmax_precision attribute (a TensorProto element type; None: not set, the
    # spec's default "the same precision as the input of softmax (Q and K)").
    softmax_precision: Optional[int] = None
    # The weights as initializers (constants the runtime may fold and pre-pack) or as inputs.
    weights_as: str = "initializers"
    features = FEATURES_24
    mask_forms = FORMS_24
    families = None

    # ------------------------------------------------------------------ the runtime
    def session(self, model: Any, device: str) -> Any:
        """A runnable of the ModelProto ``model`` on ``device`` (untimed)."""
        raise NotImplementedError

    def call(self, runnable: Any, inputs: Dict[str, np.ndarray]) -> List[np.ndarray]:
        """Every output of one run, in the graph's order."""
        raise NotImplementedError

    def probe_dtypes(self, device: str = "cpu") -> Sequence[str]:
        """The dtypes a tiny graph of this op runs in on ``device`` (cached per library
        versions; why each other one did not is noted for ``mha-suite list``)."""
        def probe() -> List[str]:
            ok = []
            for dtype in DTYPES:
                reason = probes.why_not(f"{self.name} in {dtype} on {device}",
                                        lambda d=dtype: self._tiny(d, device))
                if reason is None:
                    ok.append(dtype)
                else:
                    probes.note(reason)
            return ok

        return tuple(cache.memo(f"onnx attention dtypes:{self.name}:{self.opset}:{device}",
                                probe))

    def _tiny(self, dtype: str, device: str) -> bool:
        from suite.spec.problem import make_problem

        p = make_problem(0, 1, 3, 3, 8, 2)
        g = graph_for(p, dtype, MaskPose(), opset=self.opset, rank=self.rank)
        out = self.call(self.session(attention_model(g, p.weights), device),
                        feeds(g, p.query, p.key, p.value, MaskPose()))[0]
        return bool(np.isfinite(np.asarray(out, np.float64)).all())

    def dtypes(self, device: str) -> Sequence[str]:
        return self.probe_dtypes(device) if device in self.devices() else ()

    # ------------------------------------------------------------------ the four steps
    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if device not in self.devices():
            raise ValueError(f"device: expected one of {self.devices()}, got {device!r}")
        if dtype not in ONNX_TYPES:
            raise ValueError(f"dtype: expected one of {sorted(ONNX_TYPES)}, got {dtype!r}")
        if need_weights or grad:
            raise ValueError(f"{self.name}: the graph returns the output only (no attention "
                             f"weights, no gradients)")
        p = problem
        if p.steps is not None:
            return self._prepare_steps(p, device, dtype)
        pose = self.pose(p)
        g = self.graph(p, dtype, pose)
        runnable = self.session(attention_model(g, self.weights(p)), device)
        return {"steps": None, "run": runnable,
                "feeds": feeds(g, p.query, p.key, p.value, pose, self.weights(p)), "graph": g}

    # One place each for what a graph is made of (a subclass changes one of them).
    def pose(self, p: Problem) -> MaskPose:
        """The problem's mask in the op's inputs (``common.pose_mask``)."""
        return pose_mask(p, native=self.native, nonpad=self.opset >= 24)

    def chunk_pose(self, p: Problem, start: int, end: int, total: int,
                   static: bool) -> MaskPose:
        """The mask of one generation chunk (``common.chunk_pose``)."""
        return chunk_pose(p, start, end, total, native=self.native, static=static)

    def graph(self, p: Problem, dtype: str, pose: MaskPose,
              cache: Optional[str] = None) -> AttentionGraph:
        """The graph's static facts (``common.graph_for``)."""
        more = {} if self.softmax_precision is None else \
            {"attributes": (("softmax_precision", self.softmax_precision),)}
        return graph_for(p, dtype, pose, opset=self.opset, rank=self.rank, cache=cache,
                         weights_as=self.weights_as, **more)

    def weights(self, p: Problem) -> Weights:
        """The weights the graph holds as initializers: the problem's."""
        return p.weights

    def next_cache(self, present: Tuple[Any, Any], past: Tuple[Any, Any]) -> Tuple[Any, Any]:
        """What the next generation chunk is fed as its cache: this call's present_*."""
        return present

    def _prepare_steps(self, p: Problem, device: str, dtype: str) -> Dict[str, Any]:
        """One graph for every chunk: a growing cache (past_key/past_value in, present out)
        or a static one (opset 24: TensorScatter at the chunk's start, nonpad_kv_seqlen at
        its end); the per-chunk inputs built here, the cache fed from call to call."""
        static = p.cache_len is not None
        if static and self.opset < 24:
            raise Unsupported(f"{self.name}: a static cache needs TensorScatter and "
                              f"nonpad_kv_seqlen (opset 24); this graph is opset {self.opset}")
        total = p.cache_len if static else None
        chunks, start = [], 0
        for n in p.steps:
            end = start + n
            chunks.append((start, end, self.chunk_pose(p, start, end, total or end, static)))
            start = end
        g = self.graph(p, dtype, chunks[0][2], cache="static" if static else "past")
        runnable = self.session(attention_model(g, self.weights(p)), device)
        t = numpy_dtype(dtype)
        B, K, D, V = p.B, p.K, p.D, p.V
        slots = total if static else 0
        empty = (np.zeros((B, K, slots, D), t), np.zeros((B, K, slots, V), t))
        per_chunk = []
        for s, e, pose in chunks:
            f = feeds(g, p.query[:, s:e], p.key[:, s:e], p.value[:, s:e], pose,
                      self.weights(p))
            if static:
                f["write_index"] = np.full(B, s, np.int64)
            per_chunk.append(f)
        return {"steps": per_chunk, "run": runnable, "empty": empty, "static": static,
                "graph": g}

    def run(self, s: Dict[str, Any]):
        if s["steps"] is None:
            return self.call(s["run"], s["feeds"])[0]
        names = ("cache_key", "cache_value") if s["static"] else ("past_key", "past_value")
        cache = s["empty"]
        rows = []
        for f in s["steps"]:
            out, kc, vc = self.call(s["run"], {**f, names[0]: cache[0], names[1]: cache[1]})[:3]
            cache = self.next_cache((kc, vc), cache)
            rows.append(out)
        return np.concatenate(rows, axis=1)

    def fetch(self, state: Any, handle: Any) -> Result:
        return Result(np.asarray(handle).astype(np.float64))


# ---------------------------------------------------------------------------- onnxruntime

class OrtAttention(OnnxAttentionCore):
    """onnxruntime's kernel of the ONNX ``Attention`` op (opset 24), the mask through the
    op's own inputs; CPU, and CUDA where this onnxruntime has its execution provider."""

    name = "onnxruntime.attention"
    framework = "onnxruntime"
    deviations = {"nan_padding": nan_padding("onnxruntime")}
    contracts = (Contract("agrees_with_reference", "agrees", "onnx.reference.attention",
                          "onnxruntime's kernel computes what the spec's executable form "
                          "(onnx.reference) does on the same graph"),)

    def __init__(self) -> None:
        try:
            import onnx  # noqa: F401
            import onnxruntime
        except ImportError as exc:
            raise Unavailable(f"{self.name} needs onnx and onnxruntime ({exc})") from None
        self._ort = onnxruntime
        newest = ort_onnx_opset()
        if newest is not None and newest < self.opset:
            raise Unavailable(f"{self.name} builds an ONNX opset {self.opset} graph; onnxruntime "
                              f"{onnxruntime.__version__} reads ONNX opsets up to {newest}")

    def devices(self) -> List[str]:
        out = ["cpu"]
        if "CUDAExecutionProvider" in self._ort.get_available_providers():
            out.append("cuda:0")
        return out

    def dtypes(self, device: str) -> Sequence[str]:
        if device.startswith("cuda"):  # what the CUDA provider runs (probed; not measured here)
            return super().dtypes(device)
        # Not float64: the graph runs, but onnxruntime's CPU Attention computes double inputs
        # at float32 precision (measured, onnxruntime 1.32.0: errors 2e-8 to 1.3e-7 on 125
        # of 141 float64 cases, bound ~1e-12; only near one-hot rows pass), which is no
        # float64 computation; not bfloat16: the CPU provider has no bfloat16 kernels for
        # the op's function body ("Could not find an implementation for Expand(13)").
        return tuple(d for d in super().dtypes(device) if d != "float64")

    def session(self, model: Any, device: str) -> Any:
        ort = self._ort
        options = ort.SessionOptions()
        options.log_severity_level = 3  # warnings of fallbacks are not the user's to read
        providers: List[Any] = ["CPUExecutionProvider"]
        if device.startswith("cuda"):
            index = int(device.split(":")[1]) if ":" in device else 0
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": index}))
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)

    def call(self, runnable: Any, inputs: Dict[str, np.ndarray]) -> List[np.ndarray]:
        return runnable.run(None, inputs)


class OrtAttentionMask(OrtAttention):
    """The same op with the whole mask as an explicit attn_mask (no is_causal, no
    nonpad_kv_seqlen; a generation chunk's causal rows as a boolean mask)."""

    name = "onnxruntime.attention[mask]"
    native = False
    mask_forms = frozenset({f for f in FORMS_24 if f.startswith(("bool_", "float_"))})
    contracts = (Contract("agrees_with_native_inputs", "agrees", "onnxruntime.attention",
                          "is_causal, nonpad_kv_seqlen and the cache inputs compute what the "
                          "same mask given as an explicit attn_mask does"),)


class OrtAttention23(OrtAttention):
    """The opset-23 graph: no nonpad_kv_seqlen (key lengths and the decode form as
    attn_mask), no static cache."""

    name = "onnxruntime.attention[opset23]"
    opset = 23
    features = FEATURES_23
    mask_forms = FORMS_23
    # onnxruntime reads opset-24 graphs from 1.24 on (noxfile's compat matrix; 1.23.0 reads
    # opsets up to 23, measured): before it the other side is unavailable
    contracts = (Contract("agrees_with_opset24", "agrees", "onnxruntime.attention",
                          "opset 23's kernel computes what opset 24's does on every problem "
                          "both pose", where=Where(versions={"onnxruntime": ">=1.24"})),)


class OrtAttention4d(OrtAttention):
    """The node given 4-D (B, heads, L, d) inputs, reshaped and transposed in the graph: no
    q_num_heads/kv_num_heads, the heads read off the shapes (GQA from K's head axis)."""

    name = "onnxruntime.attention[4d]"
    rank = 4
    families = frozenset({"masking", "shapes", "decode", "generation", "variants",
                          "mask_forms", "contracts"})
    contracts = (Contract("agrees_with_3d", "agrees", "onnxruntime.attention",
                          "the op's 4-D inputs compute what its 3-D inputs with head "
                          "attributes do"),)


class OrtAttentionWeightInputs(OrtAttention):
    """The projections' weights fed as graph inputs, not initializers (no constant folding
    or pre-packing of the MatMul weights by the session)."""

    name = "onnxruntime.attention[weight_inputs]"
    weights_as = "inputs"
    families = frozenset({"shapes", "numerics", "generation", "contracts"})
    contracts = (Contract("agrees_with_initializers", "agrees", "onnxruntime.attention",
                          "weights fed as inputs compute what the same weights as "
                          "initializers (folded, pre-packed) do"),)


# ---------------------------------------------------------------------------- onnx.reference

class RefAttention(OnnxAttentionCore):
    """``onnx.reference.ReferenceEvaluator`` running the same graph: the specification's
    executable form (NumPy, CPU only)."""

    name = "onnx.reference.attention"
    framework = "onnx"
    array_library = "numpy"
    deviations = {"nan_padding": nan_padding("onnx.reference")}

    def __init__(self) -> None:
        try:
            import onnx.reference
        except ImportError as exc:
            raise Unavailable(f"{self.name} needs onnx ({exc})") from None
        self._reference = onnx.reference
        newest = onnx.defs.onnx_opset_version()
        if newest < self.opset:
            raise Unavailable(f"{self.name} builds an ONNX opset {self.opset} graph; onnx "
                              f"{onnx.__version__} knows ONNX opsets up to {newest}")

    def session(self, model: Any, device: str) -> Any:
        return self._reference.ReferenceEvaluator(model)

    def call(self, runnable: Any, inputs: Dict[str, np.ndarray]) -> List[np.ndarray]:
        return runnable.run(None, inputs)


class RefAttentionMask(RefAttention):
    name = "onnx.reference.attention[mask]"
    native = False
    mask_forms = OrtAttentionMask.mask_forms
    contracts = (Contract("agrees_with_native_inputs", "agrees", "onnx.reference.attention",
                          "is_causal, nonpad_kv_seqlen and the cache inputs compute what the "
                          "same mask given as an explicit attn_mask does"),)


class RefAttention23(RefAttention):
    name = "onnx.reference.attention[opset23]"
    opset = 23
    features = FEATURES_23
    mask_forms = FORMS_23
    contracts = (Contract("agrees_with_opset24", "agrees", "onnx.reference.attention",
                          "opset 23's reference computes what opset 24's does on every "
                          "problem both pose"),)


class RefAttentionSoftmaxFp32(RefAttention):
    """The reference with ``softmax_precision`` = FLOAT: the softmax of float16/bfloat16
    scores computed (and summed) in float32, then cast back, as the spec's attribute says."""

    name = "onnx.reference.attention[softmax_fp32]"
    softmax_precision = 1  # TensorProto.FLOAT
    # The families the softmax's precision changes the numbers of.
    families = frozenset({"masking", "numerics", "tiles", "lanes", "contracts"})
    contracts = (Contract("closer_to_oracle", "closer_to_oracle", "onnx.reference.attention",
                          "softmax_precision=FLOAT sums the bfloat16 softmax in float32 where "
                          "the default sums it in bfloat16", dtypes=frozenset({"bfloat16"})),)

    def dtypes(self, device: str) -> Sequence[str]:
        return tuple(d for d in super().dtypes(device) if d in ("float16", "bfloat16"))
