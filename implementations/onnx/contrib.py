"""onnxruntime's contrib attention ops (domain ``com.microsoft``), run on the CPU.

Each name builds a small ONNX graph with ``onnx.helper`` in the case's dtype: MatMul/Add
projections with the problem's weights (initializers), the contrib node, the output
projection; onnxruntime's CPU execution provider runs it. The canonical problem is posed in
the op's own inputs and never repaired afterwards:

- ``onnxruntime.mha`` (``MultiHeadAttention``): key padding (B,) alone as ``key_padding_mask``
  in its 1-D lengths form (right-padded keys); a causal mask with Lq == Lk as
  ``unidirectional=1``; every other boolean part (with the key padding) as the 3-D
  (B, L, S) 0/1 ``key_padding_mask`` (the op has one per query row, the same for every
  head: a per-head boolean mask is unsupported here); the bias as ``attention_bias``
  (B|1, H|1, L, S). Generation steps: ``past_key``/``past_value`` fed with the previous
  step's ``present_key``/``present_value`` (an empty past first), ``unidirectional=1``
  (aligned at the past's end), a window as each chunk's 3-D key_padding_mask. The op adds
  ``mask_filter_value`` (-10000) to masked logits: see the deviations and known failures.
- ``onnxruntime.mha[kpm2d]``: key padding as the 2-D (B, S) 0/1 ``key_padding_mask``;
  ``onnxruntime.mha[bias]``: every mask part in ``attention_bias`` (-inf where masked), no
  key_padding_mask and no unidirectional. Both must agree with ``onnxruntime.mha``.
- ``onnxruntime.gqa`` (``GroupQueryAttention``): each batch item's query rows sit at their
  positions of a key/value cache: the projected cache slots before them as ``past_key``/
  ``past_value`` (BNSH), their own keys and values as key/value, ``seqlens_k`` = the total
  length - 1 and ``total_sequence_length`` the batch's largest (``query_seqlens`` where
  several causal rows of several items continue a cache; without causality, one run per
  item, as the op takes several rows beside a past for a batch of one only). Causal
  problems are causal=1 at those positions (Lq == Lk and top-left Lq < Lk: a prompt, no
  past; bottom right and the decode form: after a past), right-padded prompts by
  ``seqlens_k``, non-causal problems ``causal=0`` over the keys up to the key padding; a
  sliding window as ``local_window_size`` (the op's window counts the current token: a
  window of n keys is ``local_window_size = n``), ``softcap``, ``head_sink`` for the
  problem's sinks, ``kv_num_heads`` for GQA/MQA; what the op cannot express in those terms
  (boolean masks, the bias) goes into ``attention_bias`` (-inf where masked), indexed by
  absolute key position. Generation steps feed ``present_*`` back as ``past_*`` (a growing
  cache), or give it a buffer of ``cache_len`` slots each step (present as long as past).
  The CPU kernel takes head sizes that are multiples of 8 only: narrower heads get zero
  columns from a Pad node after each projection (scores unchanged, scale given
  explicitly) and the output's padding is sliced off before the output projection; rotary
  embedding, quantized caches and the windowed ``sliding_window_cache`` are left off.
- ``onnxruntime.gqa[bias]``: ``causal=0``, every key read, and the whole mask in
  ``attention_bias``; it must agree with ``onnxruntime.gqa``.

What a graph uses is read from the installed release's own schema of the op (``op_schema``,
once per process), never assumed from the newest: where GroupQueryAttention has no ``causal``
attribute (onnxruntime 1.23: the op is always causal) a problem whose rows see keys after
their position is unsupported with that reason, and where it has no ``query_seqlens`` input
(12 inputs on 1.23) causal rows continuing several items' caches run one item at a time and
generation chunks of several rows for a batch are unsupported.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from suite.plugins.adapters import form_mask, requested_form
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Implementation, Result, Unavailable, Unsupported
from suite.spec.problem import Problem

DOMAIN = "com.microsoft"
NP_DTYPES = {"float32": np.float32, "float16": np.float16}
QUERY_SEQLENS = 16  # GroupQueryAttention's input index of query_seqlens


def _import_runtime() -> Tuple[Any, Any]:
    """(onnx, onnxruntime), or Unavailable with the reason."""
    try:
        import onnx
        import onnxruntime
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise Unavailable(f"onnxruntime's contrib ops need onnx and onnxruntime ({e}); "
                          f"pip install 'mha-suite[onnx]'") from None
    return onnx, onnxruntime


def _ort_version() -> str:
    try:
        import onnxruntime
        return onnxruntime.__version__
    except ImportError:  # pragma: no cover
        return "unknown"


# ------------------------------------------------------------------------------- graphs

class _Graph:
    """An ONNX graph built node by node in one float dtype (``t``: float32 or float16)."""

    def __init__(self, dtype: str) -> None:
        self.onnx, self.ort = _import_runtime()
        self.np_t = NP_DTYPES[dtype]
        tp = self.onnx.TensorProto
        self.elem = tp.FLOAT if dtype == "float32" else tp.FLOAT16
        self.nodes: List[Any] = []
        self.inputs: List[Any] = []
        self.outputs: List[Any] = []
        self.inits: List[Any] = []
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

    def input(self, name: str, rank: int, integer: bool = False) -> str:
        tp = self.onnx.TensorProto
        shape = [f"{name}_d{i}" for i in range(rank)]
        self.inputs.append(self.onnx.helper.make_tensor_value_info(
            name, tp.INT32 if integer else self.elem, shape))
        return name

    def const(self, base: str, a: np.ndarray, integer: bool = False) -> str:
        name = self.name(base)
        a = np.asarray(a, np.int64 if integer else self.np_t)
        self.inits.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(a), name))
        return name

    def node(self, op: str, ins: List[str], n_out: int = 1, domain: str = "",
             **attrs: Any) -> List[str]:
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(self.onnx.helper.make_node(op, ins, outs, domain=domain or None,
                                                     **attrs))
        return outs

    def linear(self, x: str, w: np.ndarray, b: Optional[np.ndarray], role: str) -> str:
        y = self.node("MatMul", [x, self.const(f"w_{role}", w)])[0]
        return y if b is None else self.node("Add", [y, self.const(f"b_{role}", b)])[0]

    def output(self, name: str) -> None:
        self.outputs.append(self.onnx.helper.make_tensor_value_info(name, self.elem, None))

    def session(self) -> Any:
        h = self.onnx.helper
        graph = h.make_graph(self.nodes, "mha", self.inputs, self.outputs, self.inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                                   h.make_opsetid(DOMAIN, 1)])
        model.ir_version = min(model.ir_version, 10)
        so = self.ort.SessionOptions()
        so.log_severity_level = 3  # the runtime's refusals come back as exceptions
        return self.ort.InferenceSession(model.SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])


def _bnsh(g: _Graph, x: str, heads: int, width: int) -> str:
    """(B, S, heads*width) -> (B, heads, S, width)."""
    shape = g.const("shape", np.array([0, 0, heads, width]), integer=True)
    y = g.node("Reshape", [x, shape])[0]
    return g.node("Transpose", [y], perm=[0, 2, 1, 3])[0]


def _run(session: Any, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """One run of the session (the runtime's own errors pass through as they are)."""
    return session.run(None, feeds)


# -------------------------------------------------------------------------- shared core

@dataclasses.dataclass(frozen=True)
class OpSchema:
    """What the installed onnxruntime's schema of a contrib op takes: its attributes' names
    and its number of inputs (the schema's max_input). ``release``: onnxruntime's version,
    for the reasons a plugin gives where an older schema cannot pose a problem."""

    release: str
    attributes: Optional[frozenset]  # None: not known (taken to be every one)
    inputs: int

    def takes(self, attribute: str) -> bool:
        return self.attributes is None or attribute in self.attributes


@functools.cache
def op_schema(op: str) -> Optional[OpSchema]:
    """The installed onnxruntime's schema of ``com.microsoft`` ``op`` (None: it has no such
    op). Read once per process from the runtime's own registry of operator schemas; a
    runtime that does not list its schemas is taken to have the newest (no way to tell)."""
    _, ort = _import_runtime()
    state = getattr(getattr(ort, "capi", None), "onnxruntime_pybind11_state", None)
    get = getattr(state, "get_all_operator_schema", None)
    if get is None:  # pragma: no cover - every release in range lists them
        return OpSchema(ort.__version__, None, 1 << 30)
    found = [s for s in get() if s.domain == DOMAIN and s.name == op]
    if not found:
        return None
    s = max(found, key=lambda s: s.since_version)
    return OpSchema(ort.__version__, frozenset(s.attributes), int(s.max_input))


class _ContribCore(Implementation):
    framework = "onnxruntime"
    memory_model = "quadratic"
    op = ""

    def __init__(self) -> None:
        _, ort = _import_runtime()
        if self.schema() is None:
            raise Unavailable(f"onnxruntime {ort.__version__} has no {DOMAIN} {self.op} op")

    def schema(self) -> Optional[OpSchema]:
        """The installed release's schema of ``op`` (``op_schema``): what a graph may use."""
        return op_schema(self.op)

    def framework_version(self) -> str:
        return _ort_version()

    def dtypes(self, device: str):
        return ("float32", "float16")

    def check(self, problem: Problem, device: str, dtype: str, need_weights: bool,
              grad: bool) -> None:
        if device != "cpu":
            raise ValueError(f"device: expected 'cpu', got {device!r}")
        if dtype not in NP_DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(NP_DTYPES)}, got {dtype!r}")
        if need_weights or grad:
            raise ValueError(f"{self.name}: returns neither attention weights nor gradients")

    def run(self, state: Dict[str, Any]) -> Any:
        return state["compute"]()

    def fetch(self, state: Any, handle: Any) -> Result:
        return Result(np.asarray(handle, dtype=np.float64))


def _cast(a: Optional[np.ndarray], t: Any) -> Optional[np.ndarray]:
    return None if a is None else np.ascontiguousarray(a, dtype=t)


def _bias_feed(allowed: np.ndarray, bias: Optional[np.ndarray], t: Any) -> np.ndarray:
    """The additive attention_bias: the problem's bias where allowed, -inf elsewhere."""
    b = np.zeros(()) if bias is None else np.asarray(bias, np.float64)
    return np.ascontiguousarray(np.where(allowed, b, -np.inf), dtype=t)


def mask_heads_vary(m: Any) -> bool:
    """Whether a boolean part of the mask differs between heads."""
    a = m.allowed
    return a is not None and np.ndim(a) >= 3 and np.shape(a)[-3] > 1 and not (
        np.asarray(a) == np.take(np.asarray(a), [0], axis=-3)).all()


def _reduce_heads(a: np.ndarray) -> np.ndarray:
    """(B, H, ...) -> (B, 1, ...) when it is the same for every head (the op broadcasts)."""
    if a.shape[1] > 1 and (a == a[:, :1]).all():
        return np.ascontiguousarray(a[:, :1])
    return a


# ------------------------------------------------------------------ MultiHeadAttention

class OrtMultiHeadAttention(_ContribCore):
    """``com.microsoft.MultiHeadAttention`` (CPU): key padding as ``key_padding_mask``."""

    name = "onnxruntime.mha"
    op = "MultiHeadAttention"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "scale", "decode", "steps"})
    mask_forms = frozenset({"kv_lengths", "kpm_bool", "causal_flag", "causal_flag+kv_lengths",
                            "causal_flag+kpm_bool", "float_BHLS", "float_B1LS", "float_11LS"})
    deviations = {
        # float32: the same, but the logits rounded at magnitude 1e4 miss the float32 bound
        # (err ~2e-4): a known failure (suite/conformance/known_failures.toml)
        "fully_masked_rows": {"float16": Deviation(
            "unmasked", "key_padding_mask adds mask_filter_value (-10000) to the masked "
                        "logits instead of excluding them: a row with every key masked is "
                        "shifted as a whole, which the softmax cancels (measured, masking/"
                        "fully_masked_valid_lens, lanes/fully_masked_*, float16)")},
        "bias_masked_rows": Deviation(
            "nan", "attention_bias is added to the logits: a row the bias masks with -inf "
                   "everywhere is a softmax of -inf, NaN (measured, special_values/"
                   "neg_inf_bias_rows, tiles/masked_blocks_additive)"),
        "nan_padding": Deviation(
            "confined", "masked keys are not skipped: mask_filter_value or -inf is added to "
                        "their logits, and NaN + -10000 is NaN (measured, masking/nan_padding, "
                        "lanes/nan_padding_*)"),
    }
    # how key padding (B,) is given: "lengths" (B,) int32, "mask2d" (B, S) 0/1, or "bias"
    # (every mask part in attention_bias, -inf where masked; no unidirectional)
    key_padding = "lengths"

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        self.check(problem, device, dtype, need_weights, grad)
        p, t = problem, NP_DTYPES[dtype]
        if p.K != p.H:
            raise Unsupported("MultiHeadAttention has one head count for q, k and v")
        g = _Graph(dtype)
        w = p.weights
        q = g.linear(g.input("query", 3), w.w_q, w.b_q, "q")
        k = g.linear(g.input("key", 3), w.w_k, w.b_k, "k")
        v = g.linear(g.input("value", 3), w.w_v, w.b_v, "v")
        attrs: Dict[str, Any] = {"num_heads": p.H}
        if p.scale is not None:
            attrs["scale"] = float(p.scale)
        if p.steps is not None:
            return self._prepare_steps(p, g, q, k, v, attrs, t)
        feeds = {"query": _cast(p.query, t), "key": _cast(p.key, t), "value": _cast(p.value, t)}
        kpm, causal, bias = self.mask_inputs(p, t)
        ins = [q, k, v, "", "", ""]
        if kpm is not None:
            ins[4] = g.input("key_padding_mask", kpm.ndim, integer=True)
            feeds["key_padding_mask"] = kpm
        if bias is not None:
            ins[5] = g.input("attention_bias", 4)
            feeds["attention_bias"] = bias
        if causal:
            attrs["unidirectional"] = 1
        out = g.node(self.op, ins, domain=DOMAIN, **attrs)[0]
        g.output(g.linear(out, w.w_o, w.b_o, "o"))
        session = g.session()
        return {"compute": lambda: _run(session, feeds)[0], "session": session}

    def mask_inputs(self, p: Problem, t: Any
                    ) -> Tuple[Optional[np.ndarray], bool, Optional[np.ndarray]]:
        """(key_padding_mask, unidirectional, attention_bias) of the canonical mask: key
        padding alone as its lengths (B,) or (B, S) form, a causal mask the flag expresses
        as ``unidirectional``, every other boolean part (with the key padding) as the 3-D
        (B, L, S) 0/1 key_padding_mask, the bias as attention_bias; or, for the bias path,
        everything as attention_bias with -inf where masked."""
        m, B, H, L, S = p.mask, p.B, p.H, p.L, p.S
        form = requested_form(p)
        if form:
            return self.form_inputs(p, form, t)
        if self.key_padding == "bias":
            if m.is_empty():
                return None, False, None
            b = None if m.bias is None else np.broadcast_to(m.bias, (B, H, L, S))
            return None, False, _reduce_heads(_bias_feed(m.dense_allowed(B, H, L, S), b, t))
        rest = dataclasses.replace(m, bias=None)
        causal = False
        if m.causal and m.query_offset is None and L == S:
            # the op's unidirectional: key j <= query i; with Lq != Lk and no past its last
            # query row attends every key (measured; docs/verdicts/runtimes.md), so there the
            # causal part goes into the 3-D key_padding_mask
            causal = True
            rest = dataclasses.replace(rest, causal=False)
        kpm = None
        only_padding = dataclasses.replace(rest, valid_lens=None).is_empty()
        if m.valid_lens is not None and np.ndim(m.valid_lens) == 1 and only_padding:
            lens = np.asarray(m.valid_lens, np.int64)
            kpm = lens.astype(np.int32) if self.key_padding == "lengths" else \
                (np.arange(S)[None, :] < lens[:, None]).astype(np.int32)
        elif not rest.is_empty():
            if mask_heads_vary(rest):
                raise Unsupported("MultiHeadAttention's key_padding_mask is the same for every "
                                  "head; the mask varies over heads (onnxruntime.mha[bias] "
                                  "takes it as attention_bias)")
            kpm = rest.dense_allowed(B, 1, L, S)[:, 0].astype(np.int32)  # (B, L, S), 1 = attend
        bias = None
        if m.bias is not None:
            bias = np.ascontiguousarray(
                np.broadcast_to(np.asarray(m.bias, np.float64), (B, H, L, S)), dtype=t)
            bias = _reduce_heads(bias)
        return kpm, causal, bias

    def form_inputs(self, p: Problem, form: str, t: Any
                    ) -> Tuple[Optional[np.ndarray], bool, Optional[np.ndarray]]:
        """The requested mask form (``mask_forms``) in the op's inputs."""
        f = form_mask(p, form, true_means="attend", fill=-np.inf, dtype=np.float64)
        kpm = None
        if f.kv_lengths is not None:
            kpm = np.asarray(f.kv_lengths, np.int32)
        elif f.key_padding is not None:
            kpm = np.asarray(f.key_padding, np.int32)  # (B, S), 1 = attend
        bias = None
        if f.attn is not None:
            a = np.asarray(f.attn)
            bias = np.ascontiguousarray(a.reshape((1,) * (4 - a.ndim) + a.shape), dtype=t)
        return kpm, "causal_flag" in form.split("+"), bias

    def _prepare_steps(self, p: Problem, g: _Graph, q: str, k: str, v: str,
                       attrs: Dict[str, Any], t: Any) -> Dict[str, Any]:
        """A growing cache: each chunk's keys and values appended by the op to the past it
        is given (its own ``present_*`` of the step before); the chunk's rows causal by
        ``unidirectional`` (aligned at the past's end), any other boolean part as the 3-D
        key_padding_mask of the chunk's rows over the keys so far; the bias path gives
        each chunk's rows of the mask as attention_bias instead."""
        if p.cache_len is not None:
            raise Unsupported("MultiHeadAttention's CPU kernel has no static (shared) buffer")
        w, B, H, L, D, V = p.weights, p.B, p.H, p.L, p.D, p.V
        ins = [q, k, v, "", "", "", g.input("past_key", 4), g.input("past_value", 4)]
        allowed = p.mask.dense_allowed(B, H, L, L)  # (B, H, L, L)
        bias = None if p.mask.bias is None else np.broadcast_to(p.mask.bias, allowed.shape)
        if self.key_padding == "bias":
            full = _reduce_heads(_bias_feed(allowed, bias, t))  # (B, H|1, L, L)
            ins[5] = g.input("attention_bias", 4)
        else:
            if bias is not None or mask_heads_vary(p.mask):
                raise Unsupported("decode steps with a bias or a per-head mask")
            attrs = dict(attrs, unidirectional=1)
            plain = np.array_equal(allowed, np.broadcast_to(np.tril(np.ones((L, L), bool)),
                                                            allowed.shape))
            full = None if plain else allowed[:, 0].astype(np.int32)  # (B, L, L)
            if full is not None:
                ins[4] = g.input("key_padding_mask", 3, integer=True)
        out, pk, pv = g.node(self.op, ins, n_out=3, domain=DOMAIN, **attrs)
        g.output(g.linear(out, w.w_o, w.b_o, "o"))
        g.output(pk)
        g.output(pv)
        session = g.session()
        x = {n: _cast(getattr(p, n), t) for n in ("query", "key", "value")}
        mask_name = None if full is None else \
            "attention_bias" if self.key_padding == "bias" else "key_padding_mask"

        def compute() -> np.ndarray:
            kc = np.zeros((B, H, 0, D), t)
            vc = np.zeros((B, H, 0, V), t)
            outs, start = [], 0
            for n in p.steps:
                end = start + n
                feeds = {"query": x["query"][:, start:end], "key": x["key"][:, start:end],
                         "value": x["value"][:, start:end], "past_key": kc, "past_value": vc}
                if mask_name is not None:
                    feeds[mask_name] = np.ascontiguousarray(full[..., start:end, :end])
                o, pk, pv = _run(session, feeds)
                kc, vc = self.next_past(kc, vc, pk, pv)
                outs.append(o)
                start = end
            return np.concatenate(outs, axis=1)

        return {"compute": compute, "session": session}


    def next_past(self, kc: np.ndarray, vc: np.ndarray, present_k: np.ndarray,
                  present_v: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The past the next step is given: this step's present_key/present_value."""
        return present_k, present_v


class OrtMultiHeadAttentionKpm2d(OrtMultiHeadAttention):
    """Key padding as the 2-D (B, S) 0/1 ``key_padding_mask``."""

    name = "onnxruntime.mha[kpm2d]"
    key_padding = "mask2d"
    mask_forms = frozenset()
    families = frozenset({"masking", "tiles", "special_values", "contracts", "lanes"})
    contracts = (Contract("agrees_with_lengths", "agrees", "onnxruntime.mha",
                          "key padding as a (B, S) 0/1 mask computes what the (B,) lengths "
                          "form does"),)


class OrtMultiHeadAttentionBias(OrtMultiHeadAttention):
    """Every mask part in ``attention_bias`` (-inf where masked), no key_padding_mask and no
    ``unidirectional``."""

    name = "onnxruntime.mha[bias]"
    key_padding = "bias"
    mask_forms = frozenset()
    deviations = {
        "fully_masked_rows": Deviation(
            "nan", "every mask part is -inf in attention_bias, added to the logits: a row "
                   "with no key to attend is a softmax of -inf, NaN (measured, masking/"
                   "fully_masked_*)"),
        "bias_masked_rows": OrtMultiHeadAttention.deviations["bias_masked_rows"],
        "nan_padding": OrtMultiHeadAttention.deviations["nan_padding"],
    }
    families = frozenset({"masking", "tiles", "special_values", "contracts", "decode",
                          "generation", "lanes"})
    contracts = (Contract("agrees_with_native_masks", "agrees", "onnxruntime.mha",
                          "the masks as attention_bias compute what key_padding_mask and "
                          "unidirectional do"),)


# ------------------------------------------------------------------ GroupQueryAttention

@dataclasses.dataclass
class _Pose:
    """A problem in GroupQueryAttention's terms: each batch's rows at offsets ``off`` of a
    cache whose first ``total`` slots the op reads (seqlens_k = total - 1)."""

    off: np.ndarray  # (B,) position of each batch's first query row
    total: np.ndarray  # (B,) keys the op reads per batch
    causal: bool
    window: int  # local_window_size (-1: none)
    bias: Optional[np.ndarray]  # (B|1, H|1, L, T) additive, T = max(total), or None


class OrtGroupQueryAttention(_ContribCore):
    """``com.microsoft.GroupQueryAttention`` (CPU)."""

    name = "onnxruntime.gqa"
    op = "GroupQueryAttention"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale", "decode", "steps", "static_cache",
                          "softcap", "sinks"})
    mask_forms = frozenset({"local_window+causal_flag"})
    deviations = {
        "fully_masked_rows": Deviation(
            "nan", "a mask part the op has no input of its own for goes into attention_bias "
                   "as -inf, added to the logits: a row with no key is a softmax of -inf, NaN "
                   "(measured, lanes/fully_masked_*, tiles/masked_blocks_bool)"),
        "bias_masked_rows": OrtMultiHeadAttention.deviations["bias_masked_rows"],
        "nan_padding": Deviation(
            "confined", "the probabilities of masked keys are zeroed, then multiplied with "
                        "every value the row's total length covers: 0 * NaN is NaN (measured, "
                        "special_values/nan_value_causal, lanes/nan_padding_*)"),
    }
    # "native": causal, key padding and windows in the op's own terms; "bias": causal=0
    # and every mask part in attention_bias
    masks = "native"

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        self.check(problem, device, dtype, need_weights, grad)
        p, t = problem, NP_DTYPES[dtype]
        if p.V != p.D:
            raise Unsupported("GroupQueryAttention has one head size for k and v")
        if p.steps is not None:
            return self._prepare_steps(p, dtype, t)
        pose = self.pose(p)
        g, q, attrs = self._graph(p, dtype, pose.causal, pose.window)
        B, L, K, Dp = p.B, p.L, p.K, self._width(p.D)
        past = bool((pose.off > 0).any())
        T = int(pose.total.max())
        k_new = self._proj(g, g.input("key_new", 3), p, "k")
        v_new = self._proj(g, g.input("value_new", 3), p, "v")
        ins = [q, k_new, v_new, "", "", g.input("seqlens_k", 1, integer=True),
               g.input("total_sequence_length", 0, integer=True), "", "", "", "", ""]
        feeds: Dict[str, np.ndarray] = {
            "query": _cast(p.query, t),
            "seqlens_k": self.seqlens_k(pose.total),
            "total_sequence_length": np.array(T, np.int32)}
        rows = pose.off[:, None] + np.arange(L)[None, :]  # (B, L) the new rows' slots
        take = lambda a: np.take_along_axis(a, rows[:, :, None], axis=1)  # noqa: E731
        feeds["key_new"] = _cast(take(p.key), t)
        feeds["value_new"] = _cast(take(p.value), t)
        if past:  # the cache: every slot's key and value projected, BNSH
            P = int(pose.off.max())
            pk = _bnsh(g, self._proj(g, g.input("key_past", 3), p, "k"), K, Dp)
            pv = _bnsh(g, self._proj(g, g.input("value_past", 3), p, "v"), K, Dp)
            ins[3], ins[4] = pk, pv
            feeds["key_past"] = _cast(p.key[:, :P], t)
            feeds["value_past"] = _cast(p.value[:, :P], t)
        several = past and L > 1 and B > 1  # rows continuing the caches of several items
        per_item = several and not (pose.causal and self._query_seqlens())
        if several and not per_item:
            ins += [""] * (QUERY_SEQLENS - len(ins)) + [g.input("query_seqlens", 1, True)]
            feeds["query_seqlens"] = np.full(B, L, np.int32)
        self._extras(g, p, pose.bias, ins, feeds, t)
        out = g.node(self.op, ins, n_out=3, domain=DOMAIN, **attrs)[0]
        g.output(self._out(g, out, p))
        session = g.session()
        if not per_item:
            return {"compute": lambda: _run(session, feeds)[0], "session": session}
        # query_seqlens needs causal=1 (and a release whose op has it), and without it the
        # op takes several rows beside a past for one batch item only: one run per item, as
        # its own batch of one
        items = []
        for b in range(B):
            n = int(pose.total[b])
            f = {k: a if a.ndim == 0 or a.shape[0] == 1 else a[b:b + 1]
                 for k, a in feeds.items()}
            f["total_sequence_length"] = np.array(n, np.int32)
            f["key_past"], f["value_past"] = (f[k][:, :n - L] for k in ("key_past", "value_past"))
            if "attention_bias" in f:
                f["attention_bias"] = np.ascontiguousarray(f["attention_bias"][..., :n])
            items.append(f)
        return {"compute": lambda: np.concatenate([_run(session, f)[0] for f in items]),
                "session": session}

    # ---- posing ------------------------------------------------------------------------
    def pose(self, p: Problem) -> _Pose:
        m, B, H, L, S = p.mask, p.B, p.H, p.L, p.S
        want = m.dense_allowed(B, H, L, S)  # (B, H, L, S)
        bias = None if m.bias is None else np.broadcast_to(np.asarray(m.bias, np.float64),
                                                           (B, H, L, S))
        lens = None if m.valid_lens is None or np.ndim(m.valid_lens) != 1 else \
            np.asarray(m.valid_lens, np.int64)
        native = self.masks == "native"
        causal = bool(m.causal) and native
        if causal:
            if m.query_offset is not None:
                off = np.asarray(m.query_offset, np.int64)
            elif m.causal_align == "bottom_right" or L == S:
                off = np.full(B, S - L, np.int64)
            else:  # top left with Lq != Lk: the rows sit at 0..L-1
                off = np.zeros(B, np.int64)
            if (off < 0).any() or (off + L > S).any():
                raise Unsupported(f"GroupQueryAttention's rows continue a cache: "
                                  f"{L} causal rows at offsets {off.tolist()} of {S} keys")
            total = off + L
            if lens is not None and L == S and not (off > 0).any():
                total = np.minimum(total, lens)  # the prompt's right padding: seqlens_k
        else:
            total = np.full(B, S, np.int64) if lens is None or not native else lens.copy()
            total = np.maximum(total, L)  # the new rows are slots total - L .. total - 1
            if (total > S).any():
                raise Unsupported(f"GroupQueryAttention's new rows are keys: {L} rows, "
                                  f"{S} keys")
            off = total - L
        if (total < 1).any():
            raise Unsupported("a batch item with no key: GroupQueryAttention takes total "
                              "lengths of at least 1 (seqlens_k >= 0)")
        j = np.arange(S)
        pos = off[:, None] + np.arange(L)[None, :]  # (B, L)
        reads = j[None, None, :] < total[:, None, None]  # (B, L, S)
        frontier = j[None, None, :] <= pos[:, :, None]
        if not causal and not self.schema().takes("causal"):
            if (want & ~frontier[:, None]).any():
                raise Unsupported(self._always_causal())
            causal_op = True  # the op's own causal frontier, which the mask keeps within
        else:
            causal_op = causal
        if causal_op:
            reads = reads & frontier
        reads = reads[:, None]  # (B, 1, L, S)
        if (want & ~reads).any():
            raise Unsupported("the mask lets a row see a key GroupQueryAttention does not read "
                              "from where its rows sit")
        window = -1
        if causal and native and not np.array_equal(want, np.broadcast_to(reads, want.shape)):
            window = self._fit_window(p, want, reads, pos)
            if window >= 0:
                reads = reads & (j[None, None, None, :] > pos[:, None, :, None] - window)
        extra = None
        if bias is not None or not np.array_equal(want, np.broadcast_to(reads, want.shape)):
            T = int(total.max())
            # (B, H|1, L, T): columns are absolute key positions up to the longest total
            extra = _reduce_heads(np.where(want, 0.0 if bias is None else bias, -np.inf)[..., :T])
        return _Pose(off, total, causal, window, extra)

    def _fit_window(self, p: Problem, want: np.ndarray, reads: np.ndarray, pos: np.ndarray
                    ) -> int:
        """local_window_size W whose window is exactly the mask's, else -1 (the mask then
        goes into attention_bias). The op's window holds W keys counting the current one,
        pos - W < j <= pos (measured on 1.32.0; microsoft/onnxruntime#25927 made it count
        the current token, before which it read W + 1 keys)."""
        form = requested_form(p)
        if form and "local_window" in form.split("+"):
            left, right = form_mask(p, form).window
            return left + 1 if right == 0 or "causal_flag" in form.split("+") else -1
        S = p.S
        j = np.arange(S)
        rows = want.any(axis=-1)  # (B, H, L)
        if not rows.all():
            return -1
        first = want.argmax(axis=-1)  # (B, H, L)
        W = int((pos[:, None, :] - first).max()) + 1
        band = reads & (j[None, None, None, :] > pos[:, None, :, None] - W)
        return W if np.array_equal(np.broadcast_to(band, want.shape), want) else -1

    # ---- graph -------------------------------------------------------------------------
    @staticmethod
    def _width(D: int) -> int:
        return -(-D // 8) * 8  # the CPU kernel takes head sizes that are multiples of 8

    def _proj(self, g: _Graph, x: str, p: Problem, role: str) -> str:
        """x @ W + b for ``role`` (q, k, v); heads narrower than the kernel takes are padded
        with zero columns by a Pad node after the projection (no arithmetic on the padding,
        so a NaN or inf input stays where the problem has it)."""
        w = p.weights
        heads = p.H if role == "q" else p.K
        y = g.linear(x, getattr(w, f"w_{role}"), getattr(w, f"b_{role}"), role)
        D, Dp = p.D, self._width(p.D)
        if Dp == D:
            return y
        y = g.node("Reshape", [y, g.const("shape", np.array([0, 0, heads, D]), True)])[0]
        y = g.node("Pad", [y, g.const("pads", np.array([0, 0, 0, 0, 0, 0, 0, Dp - D]), True)])[0]
        return g.node("Reshape", [y, g.const("shape", np.array([0, 0, heads * Dp]), True)])[0]

    def _out(self, g: _Graph, out: str, p: Problem) -> str:
        """The output projection of the op's output (B, L, H*Dp), the padding sliced off."""
        D, Dp, H = p.D, self._width(p.D), p.H
        if Dp != D:
            y = g.node("Reshape", [out, g.const("shape", np.array([0, 0, H, Dp]), True)])[0]
            y = g.node("Slice", [y, g.const("starts", np.array([0]), True),
                                 g.const("ends", np.array([D]), True),
                                 g.const("axes", np.array([3]), True)])[0]
            out = g.node("Reshape", [y, g.const("shape", np.array([0, 0, H * D]), True)])[0]
        return g.linear(out, p.weights.w_o, p.weights.b_o, "o")

    def _graph(self, p: Problem, dtype: str, causal: bool, window: int
               ) -> Tuple[_Graph, str, Dict[str, Any]]:
        g = _Graph(dtype)
        q = self._proj(g, g.input("query", 3), p, "q")
        return g, q, self.attributes(p, causal, window)

    def attributes(self, p: Problem, causal: bool, window: int) -> Dict[str, Any]:
        """The node's attributes: heads, scale, causal, the window, softcap."""
        attrs: Dict[str, Any] = {"num_heads": p.H, "kv_num_heads": p.K}
        if p.scale is not None or self._width(p.D) != p.D:
            attrs["scale"] = float(p.effective_scale)
        if not causal and self.schema().takes("causal"):
            attrs["causal"] = 0
        if window >= 0:
            attrs["local_window_size"] = self.local_window(window)
        if p.softcap is not None:
            attrs["softcap"] = float(p.softcap)
        return attrs

    def _query_seqlens(self) -> bool:
        """Whether this release's op has the query_seqlens input (its 17th)."""
        return self.schema().inputs > QUERY_SEQLENS

    def _always_causal(self) -> str:
        """Why a non-causal problem cannot be posed where the op has no causal attribute."""
        return (f"onnxruntime {self.schema().release}'s GroupQueryAttention has no causal "
                f"attribute (always causal): the mask lets a query row see keys after its "
                f"position, which the op cannot read")

    def seqlens_k(self, total: np.ndarray) -> np.ndarray:
        """seqlens_k of each batch item's total length: total - 1 (the op's definition)."""
        return (np.asarray(total) - 1).astype(np.int32)

    def local_window(self, keys: int) -> int:
        """local_window_size of a window of ``keys`` keys counting the query's own: the
        op's window counts the current token (measured on 1.32.0, as
        microsoft/onnxruntime#25927 made it)."""
        return int(keys)

    def _extras(self, g: _Graph, p: Problem, bias: Optional[np.ndarray], ins: List[str],
                feeds: Dict[str, np.ndarray], t: Any) -> None:
        """attention_bias (input 10) and head_sink (input 11)."""
        if bias is not None:
            ins[10] = g.input("attention_bias", 4)
            feeds["attention_bias"] = np.ascontiguousarray(bias, dtype=t)
        if p.sinks is not None:
            ins[11] = g.const("head_sink", np.asarray(p.sinks))

    def _prepare_steps(self, p: Problem, dtype: str, t: Any) -> Dict[str, Any]:
        """Prefill and decode steps: a growing cache (``present_*`` fed back as ``past_*``)
        or a static buffer of ``cache_len`` slots the op writes each chunk into."""
        if self.masks != "native":
            raise Unsupported("the bias path poses single calls only")
        B, L, H, K, D = p.B, p.L, p.H, p.K, p.D
        Dp = self._width(D)
        want = p.mask.dense_allowed(B, H, L, L)
        causal_only = np.tril(np.ones((L, L), bool))
        window = -1
        if not np.array_equal(want, np.broadcast_to(causal_only, want.shape)):
            pos = np.broadcast_to(np.arange(L)[None, :], (B, L))
            window = self._fit_window(p, want, causal_only[None, None], pos)
            if window < 0:
                raise Unsupported("decode steps with a mask other than causal or a window")
        g, q, attrs = self._graph(p, dtype, True, window)
        k = self._proj(g, g.input("key", 3), p, "k")
        v = self._proj(g, g.input("value", 3), p, "v")
        ins = [q, k, v, g.input("past_key", 4), g.input("past_value", 4),
               g.input("seqlens_k", 1, integer=True),
               g.input("total_sequence_length", 0, integer=True), "", "", "", "", ""]
        feeds: Dict[str, np.ndarray] = {}
        self._extras(g, p, None, ins, feeds, t)
        if B > 1 and any(n > 1 for n in p.steps[1:]):
            if not self._query_seqlens():
                raise Unsupported(f"onnxruntime {self.schema().release}'s GroupQueryAttention "
                                  f"has no query_seqlens input ({self.schema().inputs} inputs):"
                                  f" a chunk of several rows continuing the caches of a batch "
                                  f"of {B} has no input of its own there")
            ins += [""] * (QUERY_SEQLENS - len(ins)) + [g.input("query_seqlens", 1, True)]
        out, pk, pv = g.node(self.op, ins, n_out=3, domain=DOMAIN, **attrs)
        g.output(self._out(g, out, p))
        g.output(pk)
        g.output(pv)
        session = g.session()
        x = {n: _cast(getattr(p, n), t) for n in ("query", "key", "value")}
        static = p.cache_len

        def compute() -> np.ndarray:
            slots = static if static is not None else 0
            kc = np.zeros((B, K, slots, Dp), t)
            vc = np.zeros((B, K, slots, Dp), t)
            outs, start = [], 0
            for n in p.steps:
                end = start + n
                f = dict(feeds, query=x["query"][:, start:end], key=x["key"][:, start:end],
                         value=x["value"][:, start:end], past_key=kc, past_value=vc,
                         seqlens_k=self.seqlens_k(np.full(B, end)),
                         total_sequence_length=np.array(end, np.int32))
                if "query_seqlens" in [i.name for i in g.inputs]:
                    f["query_seqlens"] = np.full(B, n, np.int32)
                o, kc, vc = _run(session, f)
                outs.append(o)
                start = end
            return np.concatenate(outs, axis=1)

        return {"compute": compute, "session": session}


class OrtGroupQueryAttentionBias(OrtGroupQueryAttention):
    """``causal=0``, every key read (seqlens_k = Lk - 1) and the whole mask in
    ``attention_bias``."""

    name = "onnxruntime.gqa[bias]"
    masks = "bias"
    features = OrtGroupQueryAttention.features - {"steps", "static_cache"}
    mask_forms = frozenset()
    families = frozenset({"masking", "shapes", "decode", "tiles", "special_values",
                          "contracts", "variants"})
    contracts = (Contract("agrees_with_native_masks", "agrees", "onnxruntime.gqa",
                          "the masks as attention_bias with causal=0 compute what causal, "
                          "seqlens_k and local_window_size do"),)


__all__ = ["OrtMultiHeadAttention", "OrtMultiHeadAttentionKpm2d", "OrtMultiHeadAttentionBias",
           "OrtGroupQueryAttention", "OrtGroupQueryAttentionBias"]
