"""openvino.convert[...]: ``ov.convert_model`` of the torch built-ins' modules, run by OpenVINO.

An export is a path of the module it came from (DESIGN, "Deployment runtimes and export
paths"): each name here takes a torch built-in as users reach it, builds its module for the
case exactly as the eager built-in does (its ``build``/``load_weights``/``module_mask`` and
its ``call``, or ``TorchCore.forward`` for a kernel built-in, unchanged), wraps it in a module
whose ``forward(query, key, value, *mask tensors)`` returns the output, and hands that to
``ov.convert_model(module, example_input=...)`` with the case's tensors as example inputs
(TorchScript tracing, OpenVINO's default for an ``nn.Module``; the converted model's input
shapes are dynamic, as a user's are). The model is compiled for the device with the
inference precision hint of the case's dtype (``sdpa.OpenVINORuntime``) and run on the case.
Nothing the converted model computes is changed: where OpenVINO's translation differs from
the eager module, the case says so, and each name's ``Contract`` against its eager name
checks that the two agree.

- ``openvino.convert[torch.nn]``: ``torch.nn.MultiheadAttention`` called as ``torch.nn``
  calls it (``need_weights=True``, the module's default: its explicit softmax);
- ``openvino.convert[torch.nn[sdpa]]``: the same module with ``need_weights=False`` (its
  ``F.scaled_dot_product_attention`` path, ``torch.nn[sdpa]``);
- ``openvino.convert[torch.sdpa]``: the projections and ``F.scaled_dot_product_attention`` of
  ``torch.sdpa`` (``TorchCore.forward``: ``is_causal`` for a causal-only mask, else an
  additive ``attn_mask``, ``enable_gqa`` for GQA), its weights held by the module.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Dict, List, Tuple

import numpy as np

from implementations.openvino.sdpa import VERSIONS, OpenVINORuntime
from suite.plugins.adapters.runtimes import no_usage_events
from suite.plugins.conditions import Where
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Unavailable, Unsupported
from suite.spec.problem import Problem

TORCH_TYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


class ConvertedTorch(OpenVINORuntime):
    """A torch built-in's module converted with ``ov.convert_model`` (see the module
    docstring); subclasses name the built-in (``eager``: "module:Class")."""

    eager: str = ""
    # The families this export path runs: the fixed masking, shapes, numerics and special
    # values cases and its contract with the eager name. Each case converts and compiles a
    # model (about 4 s on a 2-core CPU), so the long families (tiles, lanes, the property-based
    # ones) and those whose features it lacks (variants, layouts, gradients, dropout, the
    # wrapper's own checks) are the eager name's.
    families = frozenset({"masking", "shapes", "numerics", "special_values", "contracts"})
    compiles_per_shape = True  # a conversion and a compilation per case
    compile_path = "openvino.convert_model, compiled for the CPU"  # whatever module it converts

    def __init__(self) -> None:
        super().__init__()
        try:
            import torch
        except ImportError as exc:
            raise Unavailable(f"{self.name} needs torch ({exc}); pip install "
                              f"'mha-suite[torch]'") from None
        self.torch = torch
        module, _, cls = self.eager.partition(":")
        self.eager_impl = getattr(importlib.import_module(module), cls)()

    def devices(self) -> List[str]:
        return [d for d in super().devices() if d == "cpu"]  # the torch module is traced on CPU

    def exported(self, p: Problem, dtype: Any) -> Tuple[Any, Any]:
        """(the module to convert, the mask as the eager built-in hands it to its call)."""
        raise NotImplementedError

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if need_weights or grad:
            raise Unsupported(f"{self.name} returns no attention weights and no gradients")
        torch, p = self.torch, problem
        t = getattr(torch, TORCH_TYPES[dtype])
        module, mask = self.exported(p, t)
        names = mask_inputs(mask)
        wrapper = Exported(module, self.forward_of(p), mask, names)

        def put(a: np.ndarray) -> Any:
            return torch.tensor(np.ascontiguousarray(a)).to(t)

        example = [put(p.query), put(p.key), put(p.value)] + [field(mask, n) for n in names]
        with torch.no_grad(), no_usage_events():
            model = self.ov.convert_model(wrapper.eval(), example_input=tuple(example))
        state = {"p": p, **self.compile(model, device, dtype)}
        n_inputs = len(state["compiled"].inputs)
        if n_inputs != len(example):
            raise RuntimeError(f"the converted model has {n_inputs} inputs, the module "
                               f"{len(example)} (query, key, value, {', '.join(names)})")
        arrays = [p.query, p.key, p.value] + [as_array(field(mask, n)) for n in names]
        self.set_inputs(state, arrays, dtype)
        return state

    def forward_of(self, p: Problem) -> Any:
        """The eager built-in's forward: (module, query, key, value, mask) -> output."""
        raise NotImplementedError


class Exported:  # a torch.nn.Module subclass, made when torch is there (``_module_class``)
    def __new__(cls, module: Any, forward: Any, mask: Any, names: Tuple[str, ...]) -> Any:
        return _module_class()(module, forward, mask, names)


def _module_class() -> type:
    import torch

    class ExportedModule(torch.nn.Module):
        """``forward(query, key, value, *mask tensors)`` -> the eager built-in's output, the
        mask tensors put back where the eager built-in's mask holds them."""

        def __init__(self, module: Any, forward: Any, mask: Any, names: Tuple[str, ...]):
            super().__init__()
            self.inner = module
            self._forward = forward
            self._mask = mask
            self._names = names

        def forward(self, query, key, value, *masks):
            mask = with_fields(self._mask, dict(zip(self._names, masks)))
            return self._forward(self.inner, query, key, value, mask)

    return ExportedModule


def _is_tensor(a: Any) -> bool:
    return type(a).__module__.startswith("torch") and hasattr(a, "dtype")


def mask_inputs(mask: Any) -> Tuple[str, ...]:
    """The names of the tensors in the eager built-in's mask (a dict of keyword arguments or a
    dataclass), which become the converted model's inputs after query, key and value."""
    if isinstance(mask, dict):
        return tuple(n for n, a in mask.items() if _is_tensor(a))
    if dataclasses.is_dataclass(mask):
        wanted = getattr(mask, "traced_fields", None) or [f.name for f in dataclasses.fields(mask)]
        return tuple(n for n in wanted if _is_tensor(getattr(mask, n)))
    return ()


def field(mask: Any, name: str) -> Any:
    return mask[name] if isinstance(mask, dict) else getattr(mask, name)


def with_fields(mask: Any, values: Dict[str, Any]) -> Any:
    if not values:
        return mask
    if isinstance(mask, dict):
        return {**mask, **values}
    return dataclasses.replace(mask, **values)


def as_array(t: Any) -> np.ndarray:
    """A mask tensor as NumPy: bool stays bool, a float mask (already in the case's dtype)
    as float64, which the run rounds back to the same values."""
    import torch

    return t.numpy() if t.dtype == torch.bool else t.to(torch.float64).numpy()


class ConvertedModule(ConvertedTorch):
    """A ``TorchModuleCore`` built-in (nn.MultiheadAttention): its module as it builds it."""

    def exported(self, p: Problem, dtype: Any) -> Tuple[Any, Any]:
        torch, eager = self.torch, self.eager_impl
        if eager.image_input or not eager.batch_first:
            raise Unsupported(f"{self.name}: the eager module takes another input layout")
        module = eager.build_for(p, shared_input=False).to("cpu", dtype).eval()
        with torch.no_grad():
            eager.load_weights(module, p)
        return module, eager.module_mask(p, torch.device("cpu"), dtype)

    def forward_of(self, p: Problem) -> Any:
        eager = self.eager_impl

        def forward(module, query, key, value, mask):
            out, _ = eager.call(module, query, key, value, mask, False)
            return out

        return forward


class ConvertedCore(ConvertedTorch):
    """A ``TorchCore`` kernel built-in (torch.sdpa): its ``forward`` (projections, heads,
    ``attend``), with the problem's weights held by the module."""

    def exported(self, p: Problem, dtype: Any) -> Tuple[Any, Any]:
        from implementations.torch.common import translate_mask

        torch = self.torch
        weights = torch.nn.Module()
        for n, a in p.weights.as_dict().items():
            if a is not None:
                weights.register_buffer(n, torch.tensor(np.ascontiguousarray(a)).to(dtype))
        mask = translate_mask(p, torch.device("cpu"), dtype)
        # The additive mask is the one input SDPA reads (bias, -inf where masked); the
        # boolean parts the kernel does not read stay out of the graph.
        mask = mask.replace(allowed=None, dead_keys=None)
        if mask.causal_only:  # is_causal alone: no mask tensor reaches SDPA
            mask = mask.replace(bias=None)
        return weights, mask

    def forward_of(self, p: Problem) -> Any:
        eager = self.eager_impl

        def forward(weights, query, key, value, mask):
            tensors = {"query": query, "key": key, "value": value,
                       **{n: getattr(weights, n, None) for n in
                          ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")}}
            state = {"p": p, "tensors": tensors, "mask": mask, "need_weights": False,
                     "pages": None}
            out, _ = eager.forward(state)
            return out

        return forward


_EXPORT_REASON = "ov.convert_model of the module computes what the eager module does"
NAN_PADDING = Deviation(
    "confined", "NaN in a masked key or value position gives NaN rows, as in the eager module: "
                "the mask is added to q.k^T (NaN + -inf is NaN) and 0 * NaN is NaN in "
                "weights @ v (measured, openvino 2026.4.1, torch 2.13.0, CPU, float32: "
                "masking/nan_padding*)", where=Where(versions=VERSIONS))
# The SDPA paths: OpenVINO's PyTorch frontend turns aten::scaled_dot_product_attention into
# its own ScaledDotProductAttention op, whose spec masks with -inf: the eager module's zero
# rows (torch >= 2.5) become NaN in the export. Measured, not repaired.
SDPA_EXPORT_FULLY_MASKED = Deviation(
    "nan", "the converted model gives NaN where the eager module (torch >= 2.5) gives a zero "
           "head output, for a query row with no key to attend: OpenVINO's PyTorch frontend "
           "translates aten::scaled_dot_product_attention into its ScaledDotProductAttention "
           "op (one in the converted model), whose spec masks with -inf "
           "('Select(LogicalNot(attn_mask), ConvertLike(-inf, query), ...)', then "
           "'Softmax(attn_weight, axis=-1)') (measured, openvino 2026.4.1, torch 2.13.0, CPU, "
           "float32: masking/fully_masked*, causal_bottom_right_long_query)",
    where=Where(versions=VERSIONS))


class ConvertTorchNN(ConvertedModule):
    name = "openvino.convert[torch.nn]"
    eager = "implementations.torch.nn:TorchNN"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross"})
    contracts = (Contract("agrees_with_eager", "agrees", "torch.nn", _EXPORT_REASON),)
    deviations = {
        "fully_masked_rows": Deviation(
            "nan", "a query row with no key to attend gives NaN, as the eager torch.nn does "
                   "(need_weights=True: its explicit softmax, declared there): the converted "
                   "model's Softmax of a row of -inf is NaN (measured, openvino 2026.4.1, torch "
                   "2.13.0, CPU, float32: masking/fully_masked*)",
            where=Where(versions=VERSIONS)),
        "nan_padding": NAN_PADDING}


class ConvertTorchNNSDPA(ConvertTorchNN):
    name = "openvino.convert[torch.nn[sdpa]]"
    eager = "implementations.torch.nn:TorchNNSDPA"
    contracts = (Contract("agrees_with_eager", "agrees", "torch.nn[sdpa]", _EXPORT_REASON),)
    deviations = {"fully_masked_rows": SDPA_EXPORT_FULLY_MASKED, "nan_padding": NAN_PADDING}


class ConvertTorchSDPA(ConvertedCore):
    name = "openvino.convert[torch.sdpa]"
    eager = "implementations.torch.sdpa:TorchSDPA"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale", "value_width", "decode", "packed"})
    contracts = (Contract("agrees_with_eager", "agrees", "torch.sdpa", _EXPORT_REASON),)
    deviations = {"fully_masked_rows": SDPA_EXPORT_FULLY_MASKED, "nan_padding": NAN_PADDING}
