"""openvino.sdpa: OpenVINO's own ``ScaledDotProductAttention`` op (opset13), compiled for a device.

The graph of one problem, built with the openvino Python op API (``openvino.opset13``):
parameters ``query`` (B, L, E), ``key`` and ``value`` (B, S, E) in the case's dtype; the
projections as ``MatMul`` (+ ``Add``) with the problem's weights as constants; heads by
``Reshape`` (B, L, H, D) and ``Transpose`` (B, H, L, D); the op with its ``causal`` attribute,
an ``attention_mask`` parameter (boolean, True = attend, or additive in the dtype: the bias
with -inf where masked) and an explicit ``scale`` constant (only when the problem sets one:
the op's default 1/sqrt(D) is a code path too); then heads merged and the output projection.
It is compiled with ``ov.Core().compile_model(model, device, {"INFERENCE_PRECISION_HINT":
...})`` and run through one ``InferRequest`` whose inputs are set in ``prepare`` (untimed).

Inference precision: OpenVINO's CPU plugin runs a float32 model in bfloat16 where the CPU
has it (its default hint), and may run float16/bfloat16 models in float32 where it has not.
The hint is always set to the case's dtype (``f32`` for float32, so a float32 case is really
float32), a dtype is declared on a device only where its ``OPTIMIZATION_CAPABILITIES`` list it
(``FP16``, ``BF16``), and a compiled model that reports another precision than the hint set is
refused (``Unsupported``, both named), never run as if it were the case's dtype.

Code paths, one name each (the op's causal flag and its mask are two paths, which must agree,
``Contract``): ``openvino.sdpa`` gives a mask that is top-left causal alone as the ``causal``
attribute (the op ignores ``attention_mask`` then, so any other mask goes in as the mask with
the causal part folded in), a boolean ``attention_mask`` otherwise, an additive one where
the problem has a bias; ``openvino.sdpa[mask]`` never sets the flag; ``openvino.sdpa[float_mask]``
gives every mask additive (the op's ``Select`` of a boolean mask vs its ``Add``).

GQA: the op takes no kv head count (opset13 shape inference refuses key (B, K, S, D) beside
query (B, H, L, D): "key_input_correctness"), but its batch dimensions broadcast, so query
heads go in as (B, K, G, L, D) beside key and value (B, K, 1, S, D): query head h = k*G + g
reads kv head h // G, as the spec groups them, with nothing repeated.

OpenVINO's documented convention differs from the spec where a query row has no key to
attend: the op's pseudo-code masks with -inf (``Select(LogicalNot(attn_mask), -inf, 0)``)
and takes ``Softmax`` of the row, so the row is NaN: declared as ``fully_masked_rows=nan``.
Devices: ``cpu``, and the OpenVINO GPU plugin as ``gpu`` (``gpu:N`` for ``GPU.N``) only where
``ov.Core().available_devices`` lists it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from suite.plugins.adapters import form_mask, form_parts, requested_form, split_mask
from suite.plugins.adapters.runtimes import no_usage_events
from suite.plugins.conditions import Where
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Implementation, Result, Unavailable, Unsupported
from suite.spec.problem import Problem

# The suite's dtypes OpenVINO runs, as element-type names and inference precision hints.
OV_TYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
# The OPTIMIZATION_CAPABILITIES entry that says a device runs a dtype natively.
CAPABILITIES = {"float16": "FP16", "bfloat16": "BF16"}
# Where the declarations below hold: the range the extra allows (openvino>=2025.0); measured on
# openvino 2026.4.1 and 2025.0.0 (an additive -inf mask's empty row is NaN on both).
VERSIONS = {"openvino": ">=2025.0"}

FULLY_MASKED_NAN = Deviation(
    "nan", "OpenVINO's ScaledDotProductAttention spec (opset13) masks with -inf "
           "('attn_bias = Select(LogicalNot(attn_mask), ConvertLike(-inf, query), "
           "ConvertLike(0, query))', then 'Softmax(attn_weight, axis=-1)'): a query row with no "
           "key to attend is NaN, not a zero head output (measured, openvino 2026.4.1, CPU, "
           "float32: boolean and additive -inf masks alike)", where=Where(versions=VERSIONS))
NAN_PADDING_CONFINED = Deviation(
    "confined", "NaN in a masked key or value position gives NaN rows: the spec's pseudo-code "
                "adds the mask to 'MatMul(query, Transpose(key, [-2, -1])) * scale' (NaN + -inf "
                "is NaN) and multiplies the weights by the values (0 * NaN is NaN) (measured, "
                "openvino 2026.4.1, CPU, float32: masking/nan_padding*)",
    where=Where(versions=VERSIONS))

# Mask forms the op takes natively: attention_mask (B|1, H|1, L|1, S), boolean (True =
# attend) or additive, and the causal flag alone (the op ignores attention_mask beside it).
SDPA_FORMS = frozenset({f"{kind}_{shape}" for kind in ("bool", "float")
                        for shape in ("BHLS", "B1LS", "11LS", "B11S")} | {"causal_flag"})


def import_openvino() -> Any:
    """The ``openvino`` module, or ``Unavailable`` in one line."""
    try:
        with no_usage_events():
            import openvino
    except ImportError as exc:
        raise Unavailable(f"openvino is not installed ({exc}); pip install "
                          f"'mha-suite[openvino]'") from None
    return openvino


def ov_device(device: str) -> str:
    """The suite's device name as OpenVINO's: cpu -> CPU, gpu -> GPU, gpu:1 -> GPU.1."""
    kind, _, index = device.partition(":")
    return kind.upper() + (f".{index}" if index else "")


def suite_device(name: str) -> Optional[str]:
    """OpenVINO's device name as the suite's (CPU -> cpu, GPU.1 -> gpu:1), None for others."""
    kind, _, index = name.partition(".")
    if kind not in ("CPU", "GPU"):
        return None
    return kind.lower() + (f":{index}" if index else "")


def to_bfloat16_bits(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bfloat16 (to nearest even, from float64 directly), as uint16 bits."""
    try:
        import ml_dtypes
    except ImportError as exc:
        raise Unsupported(f"bfloat16 inputs need ml_dtypes ({exc})") from None
    return np.ascontiguousarray(np.asarray(a, np.float64).astype(ml_dtypes.bfloat16)
                                ).view(np.uint16)


class OpenVINORuntime(Implementation):
    """What every OpenVINO built-in shares: devices, dtypes with their precision hints,
    compiling, one InferRequest per prepared case (inputs set untimed), reading back."""

    framework = "openvino"

    def __init__(self) -> None:
        self.ov = import_openvino()
        self.core = self.ov.Core()

    def devices(self) -> List[str]:
        found = [suite_device(d) for d in self.core.available_devices]
        return [d for d in found if d is not None]

    def dtypes(self, device: str) -> Sequence[str]:
        try:
            caps = self.core.get_property(ov_device(device), "OPTIMIZATION_CAPABILITIES")
        except RuntimeError:
            caps = []
        return ("float32", *[d for d, cap in CAPABILITIES.items() if cap in caps])

    def element_type(self, dtype: str) -> Any:
        if dtype not in OV_TYPES:
            raise ValueError(f"dtype: expected one of {sorted(OV_TYPES)}, got {dtype!r}")
        return getattr(self.ov.Type, OV_TYPES[dtype])

    def tensor(self, a: np.ndarray, dtype: str) -> Any:
        """An ``ov.Tensor`` of ``a`` in ``dtype`` (bool arrays stay boolean)."""
        a = np.asarray(a)
        if a.dtype == bool:
            return self.ov.Tensor(np.ascontiguousarray(a))
        if dtype == "bfloat16":
            return self.ov.Tensor(to_bfloat16_bits(a), list(a.shape), self.ov.Type.bf16)
        return self.ov.Tensor(np.ascontiguousarray(a, dtype=np.dtype(dtype)))

    def constant(self, a: np.ndarray, dtype: str) -> Any:
        """A constant node holding ``a`` rounded once to ``dtype``."""
        return self.ov.op.Constant(self.tensor(a, dtype))

    def compile(self, model: Any, device: str, dtype: str) -> Dict[str, Any]:
        """``model`` compiled for ``device`` with the inference precision of ``dtype``; the
        hint set and the precision the compiled model reports, and one InferRequest."""
        if device not in self.devices():
            raise ValueError(f"device: expected one of {self.devices()}, got {device!r}")
        if dtype not in self.dtypes(device):
            raise Unsupported(f"{ov_device(device)} does not list "
                              f"{CAPABILITIES.get(dtype, dtype)} in its OPTIMIZATION_CAPABILITIES: "
                              f"it would run a {dtype} model in another precision")
        hint = self.element_type(dtype)
        compiled = self.core.compile_model(model, ov_device(device),
                                           {"INFERENCE_PRECISION_HINT": hint})
        got = compiled.get_property("INFERENCE_PRECISION_HINT")
        if got != hint:
            raise Unsupported(f"INFERENCE_PRECISION_HINT {hint} was set, the compiled model "
                              f"reports {got}: the case would not run in {dtype}")
        return {"compiled": compiled, "request": compiled.create_infer_request(),
                "precision_hint": str(hint.get_type_name()),
                "inference_precision": str(got.get_type_name())}

    def set_inputs(self, state: Dict[str, Any], arrays: Sequence[np.ndarray], dtype: str) -> None:
        """The compiled model's inputs, in order, as tensors held by the state (untimed)."""
        tensors = [self.tensor(a, dtype) for a in arrays]
        for i, t in enumerate(tensors):
            state["request"].set_input_tensor(i, t)
        state["inputs"] = tensors  # the request reads their memory: keep them alive

    def run(self, state: Dict[str, Any]) -> Any:
        state["request"].infer()  # synchronous: done when it returns
        return state["request"]

    def fetch(self, state: Dict[str, Any], handle: Any) -> Result:
        out = handle.get_output_tensor(0)
        data = np.array(out.data)
        if out.element_type == self.ov.Type.bf16:  # NumPy sees the bits as float16
            data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return Result(data.astype(np.float64))


@dataclasses.dataclass(frozen=True)
class Pose:
    """The canonical mask in the op's own inputs: its ``causal`` attribute and the
    ``attention_mask`` (bool True = attend, or float64 additive with -inf), 4-D
    (B|1, H|1, L|1, S), or None."""

    causal: bool = False
    mask: Optional[np.ndarray] = None


class OpenVINOSDPA(OpenVINORuntime):
    name = "openvino.sdpa"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale", "value_width", "decode", "packed"})
    deviations = {"fully_masked_rows": FULLY_MASKED_NAN, "nan_padding": NAN_PADDING_CONFINED}
    mask_forms = SDPA_FORMS
    # The op's causal attribute where the whole mask is top-left causal (False: always a mask).
    causal_flag = True
    # Every mask as an additive float attention_mask (False: boolean unless there is a bias).
    float_mask = False

    def pose(self, p: Problem) -> Pose:
        """The canonical mask of ``p`` in the op's inputs (see the module docstring)."""
        form = requested_form(p)
        if form:  # the mask_forms family: the form as the op takes it
            return Pose("causal_flag" in form_parts(form), form_mask(p).attn)
        native = ("top_left",) if self.causal_flag else ()
        parts = split_mask(p, true_means="attend", key_padding=False, native_causal=native)
        if parts.causal is not None and not parts.only_causal:  # the flag ignores the mask
            parts = split_mask(p, true_means="attend", key_padding=False, native_causal=())
        if parts.is_empty:
            return Pose()
        if parts.only_causal:
            return Pose(causal=True)
        if parts.bias is not None or self.float_mask:
            return Pose(mask=parts.additive())  # (B, H|1, L, S): the bias, -inf where masked
        return Pose(mask=parts.mask)  # (B, H|1, L, S) bool, True = attend

    def build(self, p: Problem, dtype: str, pose: Pose) -> Any:
        """The problem's graph: ``ov.Model`` with inputs query, key, value[, attention_mask]."""
        from openvino import opset13 as op

        T = self.element_type(dtype)
        B, L, S, E, H, K, D, V = p.B, p.L, p.S, p.E, p.H, p.K, p.D, p.V
        w = p.weights
        params = [op.parameter([B, L, E], T, name="query"),
                  op.parameter([B, S, E], T, name="key"),
                  op.parameter([B, S, E], T, name="value")]

        def shape(*dims: int) -> Any:
            return op.constant(np.array(dims, np.int64))

        def proj(x: Any, weight: np.ndarray, bias: Optional[np.ndarray]) -> Any:
            y = op.matmul(x, self.constant(weight, dtype), False, False)
            return y if bias is None else op.add(y, self.constant(bias, dtype))

        def heads(x: Any, n: int, length: int, width: int) -> Any:  # -> (B, n, length, width)
            return self.split_heads(op, x, shape(B, length, n, width))

        q = heads(proj(params[0], w.w_q, w.b_q), H, L, D)  # (B, H, L, D)
        k = heads(proj(params[1], w.w_k, w.b_k), K, S, D)  # (B, K, S, D)
        v = heads(proj(params[2], w.w_v, w.b_v), K, S, V)  # (B, K, S, V)
        mask = None
        if pose.mask is not None:
            m = pose.mask
            mask = op.parameter(list(m.shape), self.ov.Type.boolean if m.dtype == bool else T,
                                name="attention_mask")
            params.append(mask)
        G = H // K
        if K != H:  # batch dimensions broadcast: (B, K, G, ...) beside (B, K, 1, ...)
            q = op.reshape(q, shape(B, K, G, L, D), False)
            k = op.reshape(k, shape(B, K, 1, S, D), False)
            v = op.reshape(v, shape(B, K, 1, S, V), False)
            if mask is not None:
                b, h, rows, s = pose.mask.shape
                mask = op.reshape(mask, shape(b, K, G, rows, s) if h == H
                                  else shape(b, 1, 1, rows, s), False)
        scale = None if p.scale is None else self.constant(np.float64(p.scale), dtype)
        out = self.attention(op, q, k, v, mask, scale, pose.causal)
        out = op.reshape(out, shape(B, H, L, V), False)
        out = op.reshape(op.transpose(out, shape(0, 2, 1, 3)), shape(B, L, H * V), False)
        out = proj(out, w.w_o, w.b_o)  # (B, L, E)
        return self.ov.Model([out.output(0)], params, self.name)

    def split_heads(self, op: Any, x: Any, to: Any) -> Any:
        """(B, length, n*width) -> (B, n, length, width): Reshape to ``to`` (B, length, n,
        width), then Transpose."""
        return op.transpose(op.reshape(x, to, False),
                            op.constant(np.array([0, 2, 1, 3], np.int64)))

    def attention(self, op: Any, q: Any, k: Any, v: Any, mask: Any, scale: Any,
                  causal: bool) -> Any:
        """The ScaledDotProductAttention node."""
        return op.scaled_dot_product_attention(q, k, v, mask, scale, causal=causal)

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if need_weights or grad:
            raise Unsupported(f"{self.name} returns no attention weights and no gradients")
        p = problem
        pose = self.pose(p)
        state = {"p": p, "pose": pose, **self.compile(self.build(p, dtype, pose), device, dtype)}
        arrays = [p.query, p.key, p.value] + ([] if pose.mask is None else [pose.mask])
        self.set_inputs(state, arrays, dtype)
        return state


class OpenVINOSDPAMask(OpenVINOSDPA):
    """Never the causal attribute: every mask goes in as the op's attention_mask."""

    name = "openvino.sdpa[mask]"
    causal_flag = False
    mask_forms = SDPA_FORMS - {"causal_flag"}
    families = frozenset({"masking", "tiles", "lanes", "special_values", "decode", "packed",
                          "mask_forms", "contracts"})
    contracts = (Contract("agrees_with_causal_flag", "agrees", "openvino.sdpa",
                          "the op's causal attribute and the same causal mask given as its "
                          "attention_mask compute one thing"),)


class OpenVINOSDPAFloatMask(OpenVINOSDPA):
    """Every mask additive (the bias, -inf where masked), never boolean, never the flag."""

    name = "openvino.sdpa[float_mask]"
    causal_flag = False
    float_mask = True
    mask_forms = frozenset()
    families = OpenVINOSDPAMask.families - {"mask_forms"}
    contracts = (Contract("agrees_with_bool_mask", "agrees", "openvino.sdpa[mask]",
                          "an additive 0/-inf attention_mask computes what the boolean one "
                          "does"),)
