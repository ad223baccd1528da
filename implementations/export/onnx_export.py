"""export.onnx[SOURCE]: a torch plugin's module exported to ONNX and run by onnxruntime.

An export is a path of the module it came from (DESIGN.md, "Deployment runtimes and export
paths"): ``exported(Source)`` makes a plugin that, for each problem, builds the module
exactly as the torch plugin ``Source`` builds it (``Source.prepare``: the same module, the
same weights loaded, the same mask arguments), exports the one call the plugin makes
(``Source.forward``: ``call(module, query, key, value, mask, need_weights)`` for a
``TorchModuleCore``, the projections and ``attend`` for a ``TorchCore`` kernel) with
``torch.onnx.export`` and runs the graph with onnxruntime's CPU execution provider on the
case's inputs. Nothing is repaired: the graph's outputs go back through ``Source.fetch``.

Exporters (``exporter``): ``"dynamo"`` (``torch.onnx.export(dynamo=True)``, torch.export and
onnxscript: the default since torch 2.9) and ``"torchscript"`` (``dynamo=False``, the
deprecated TorchScript tracer, still in torch 2.13 with a DeprecationWarning).

What becomes a graph input: every tensor of the plugin's prepared state (query, key and
value, one input where the plugin passes one tensor for all three; a ``TorchCore``'s
weights; each tensor of the mask object the plugin hands its module: ``attn_mask``,
``key_padding_mask``, a boolean mask, a bias) and the parameters and buffers of the built
module (swapped in for the call, as ``torch.func.functional_call`` does), so one graph
serves every problem of its shapes.
What is baked into the graph: everything else the call reads in Python (flags such as
``is_causal``, the scale, the steps of a generation, NumPy arrays the mask object carries).
The graph is cached per process under a key of the input shapes and dtypes and a digest of
everything baked (``graph_key``): one export per (shapes, mask kind, dtype), not per case.

A problem the eager module refuses (its plugin's ``Unsupported``, checked by one eager call
of the same state before the export) is unsupported; an exporter that raises on a case is
that case's error (``ExportError``, naming the exporter and its first line), as is an
onnxruntime that cannot load or run the graph (``RuntimeFailure``).

Each name declares ``contracts/agrees_with_eager``: on the contract problems the graph's
output and the eager module's (the same class with ``exporter=None``: the source's own
prepare, run and fetch) are within the sum of their agreement-rule bounds. Its families are
those an export can change (``EXPORT_FAMILIES``: masks, mask forms, shapes, numerics,
variants, decode and generation steps); gradients, dropout and paged caches are not exported
(``DROPPED_FEATURES``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import importlib
import io
import sys
import threading
import time
import warnings
from collections import OrderedDict
from typing import Any, ClassVar, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np
import torch

from implementations.torch.common import TorchCore
from implementations.torch.sdpa import TorchSDPA
from suite.plugins.declarations import Contract
from suite.plugins.interface import Unavailable, Unsupported
from suite.spec.problem import Problem

# exporter -> the call it makes, in words
EXPORTERS: Dict[str, str] = {
    "dynamo": "torch.onnx.export(dynamo=True)",
    "torchscript": "torch.onnx.export(dynamo=False)",
    "executorch": "torch.export + executorch to_edge + to_executorch",
}
# exporter -> the registry prefix of its names
PREFIXES: Dict[str, str] = {"dynamo": "export.onnx", "torchscript": "export.onnx-ts",
                            "executorch": "export.executorch"}
# exporter -> the runtime that runs its graphs, in words
RUNTIMES: Dict[str, str] = {"dynamo": "onnxruntime (CPU)", "torchscript": "onnxruntime (CPU)",
                            "executorch": "the ExecuTorch runtime (portable kernels)"}
# The families an export can change: how masks, mask forms, shapes, dtypes, score variants
# and cached steps are traced and run. (Properties, tiles, lanes, layouts and special values
# run the same graph ops as these; gradients and dropout are not exported.)
EXPORT_FAMILIES: FrozenSet[str] = frozenset({
    "masking", "mask_forms", "shapes", "numerics", "variants", "decode", "generation",
    "contracts"})
# Features an exported graph does not have: it is an inference graph in eval mode.
DROPPED_FEATURES: FrozenSet[str] = frozenset({"grad", "dropout", "paged"})
# onnxruntime's CPU execution provider runs the float32 graphs; its float16/bfloat16 kernels
# cover few ops.
EXPORT_DTYPES: Tuple[str, ...] = ("float32",)
# State entries that are not the call's inputs (the problem itself is described apart).
_NOT_INPUTS = frozenset({"p", "device", "grad", "cotangent", "compile_s"})
# Exported graphs kept per process (an entry: a loaded session, or the exporter's error).
CACHE_SIZE = 64


class ExportError(RuntimeError):
    """The exporter raised on this case: its first line, and the exporter's name."""


class RuntimeFailure(RuntimeError):
    """onnxruntime could not load or run the exported graph."""


def requirements(exporter: str) -> None:
    """``Unavailable`` (one line) when a package the exporter or the runtime needs is
    missing (onnx and onnxruntime, and onnxscript for the dynamo exporter; executorch) or
    installed outside the range mha-suite's extras declare for it."""
    needs = {"dynamo": ["onnx", "onnxruntime", "onnxscript"],
             "torchscript": ["onnx", "onnxruntime"],
             "executorch": ["executorch"]}[exporter]
    hint = {"dynamo": "pip install 'mha-suite[export]'",
            "torchscript": "pip install 'mha-suite[onnx]'",
            "executorch": "pip install 'mha-suite[executorch]'"}[exporter]
    from suite.plugins.registry import outside_declared_range

    for module in needs:
        try:
            importlib.import_module(module)
        except ImportError:
            raise Unavailable(f"{module} is not installed ({PREFIXES[exporter]} needs it: "
                              f"{hint})") from None
        # a release outside the extra's range (executorch 1.1-1.3 import beside torch 2.13
        # and fail in every case): unavailable with the range, not errors read as findings
        outside = outside_declared_range(module)
        if outside:
            raise Unavailable(f"{PREFIXES[exporter]}: {outside}")


# --- the state as graph inputs ------------------------------------------------------------
class _Slot:
    """Where graph input ``index`` goes back into a structure."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<input {self.index}>"


def split(obj: Any, tensors: List[torch.Tensor], seen: Dict[int, int]) -> Any:
    """``obj`` with each tensor replaced by a ``_Slot`` (appended to ``tensors``; one object
    met twice, as one tensor passed as query, key and value, is one slot). Walks dicts,
    lists, tuples, named tuples and dataclass instances; anything else stays as it is."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen[id(obj)] = len(tensors)
            tensors.append(obj)
        return _Slot(seen[id(obj)])
    if isinstance(obj, dict):
        return type(obj)((k, split(v, tensors, seen)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(split(v, tensors, seen) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(split(v, tensors, seen) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        new = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(new, f.name, split(getattr(obj, f.name), tensors, seen))
        return new
    return obj


def fill(template: Any, inputs: Sequence[Any]) -> Any:
    """The inverse of ``split``: each ``_Slot`` replaced by ``inputs[slot.index]``."""
    if isinstance(template, _Slot):
        return inputs[template.index]
    if isinstance(template, dict):
        return type(template)((k, fill(v, inputs)) for k, v in template.items())
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*(fill(v, inputs) for v in template))
    if isinstance(template, (list, tuple)):
        return type(template)(fill(v, inputs) for v in template)
    if dataclasses.is_dataclass(template) and not isinstance(template, type):
        new = copy.copy(template)
        for f in dataclasses.fields(template):
            object.__setattr__(new, f.name, fill(getattr(template, f.name), inputs))
        return new
    return template


def slot_paths(template: Any, prefix: str, paths: Dict[int, str]) -> None:
    """Each slot's first path in ``template`` (``tensors.query``, ``mask.attn_mask``,
    ``mask.form.attn``): the graph inputs' names."""
    if isinstance(template, _Slot):
        paths.setdefault(template.index, prefix)
        return
    if isinstance(template, dict):
        items = [(str(k), v) for k, v in template.items()]
    elif isinstance(template, (list, tuple)):
        items = list(zip(getattr(template, "_fields", None) or map(str, range(len(template))),
                         template))
    elif dataclasses.is_dataclass(template) and not isinstance(template, type):
        items = [(f.name, getattr(template, f.name)) for f in dataclasses.fields(template)]
    else:
        return
    for k, v in items:
        slot_paths(v, f"{prefix}.{k}" if prefix else k, paths)


def describe(obj: Any, tensors: Sequence[torch.Tensor] = (), shape_only: bool = False) -> str:
    """What of ``obj`` a graph bakes in, as text: graph inputs by shape and dtype, NumPy
    arrays by their bytes (by shape and dtype only with ``shape_only``: arrays that reach
    the graph as inputs), everything else by ``repr``."""
    if isinstance(obj, _Slot):
        t = tensors[obj.index]
        return f"<in{obj.index} {tuple(t.shape)} {t.dtype}>"
    if isinstance(obj, torch.Tensor):
        return f"<tensor {tuple(obj.shape)} {obj.dtype}>"
    if isinstance(obj, np.ndarray):
        if shape_only:
            return f"<array {obj.shape} {obj.dtype}>"
        data = hashlib.blake2b(np.ascontiguousarray(obj).tobytes(), digest_size=8).hexdigest()
        return f"<array {obj.shape} {obj.dtype} {data}>"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v, tensors, shape_only)}"
                               for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return f"{type(obj).__name__}(" + ", ".join(describe(v, tensors, shape_only)
                                                    for v in obj) + ")"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return f"{type(obj).__name__}(" + ", ".join(
            f"{f.name}={describe(getattr(obj, f.name), tensors, shape_only)}"
            for f in dataclasses.fields(obj)) + ")"
    return repr(obj)


# Problem fields whose arrays reach a graph as inputs (by the plugin's own translation):
# their shapes are part of a graph's key, their values are not.
_INPUT_FIELDS = frozenset({"query", "key", "value", "weights", "mask", "grad_output"})


def problem_key(p: Problem) -> str:
    """What of the problem a graph may bake in: its sizes and every field that is not an
    input array (the scale, the variants, the steps, the mask's kinds), by value."""
    return ", ".join(f"{f.name}={describe(getattr(p, f.name), shape_only=f.name in _INPUT_FIELDS)}"
                     for f in dataclasses.fields(p))


class _Runner(torch.nn.Module):
    """The plugin's one call (``forward(state)``) on graph inputs: the state's tensors
    replaced by the inputs, the modules' parameters by the inputs ``swapped`` in."""

    def __init__(self, impl: Any, state: Dict[str, Any], template: Dict[str, Any],
                 modules: Dict[str, torch.nn.Module]) -> None:
        super().__init__()
        self._impl, self._state, self._template = impl, state, template
        self.mods = torch.nn.ModuleDict(modules)
        self.outputs: Any = None  # the structure of forward's result (``split``)

    def forward(self, *data: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        state = {**self._state, **fill(self._template, data), **dict(self.mods.items())}
        result = self._impl.forward(state)
        flat: List[torch.Tensor] = []
        self.outputs = split(result, flat, {})
        return tuple(flat)


class _Graph(torch.nn.Module):
    """What is exported: data inputs, then the modules' parameters and buffers as inputs."""

    def __init__(self, runner: _Runner, n_data: int, param_names: Sequence[str]) -> None:
        super().__init__()
        object.__setattr__(self, "_runner", runner)  # not a submodule: no lifted weights
        self._n, self._names = n_data, list(param_names)

    def forward(self, *inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        data, params = inputs[:self._n], inputs[self._n:]
        with swapped(self._runner, dict(zip(self._names, params))):
            return self._runner(*data)


@contextlib.contextmanager
def swapped(module: torch.nn.Module, tensors: Dict[str, torch.Tensor]):
    """``module``'s parameters and buffers named in ``tensors`` (dotted paths) replaced by
    those tensors for the duration (put back after): what ``torch.func.functional_call``
    does, written out because the TorchScript tracer refuses that stateless API ("can't be
    used with Jitted modules")."""
    kept = []
    try:
        for path, t in tensors.items():
            owner_path, _, leaf = path.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            table = owner._parameters if leaf in owner._parameters else owner._buffers
            kept.append((table, leaf, table[leaf]))
            table[leaf] = t
        yield
    finally:
        for table, leaf, original in reversed(kept):
            table[leaf] = original


@dataclasses.dataclass
class Graph:
    """An exported graph loaded in onnxruntime, or the error its export raised."""

    session: Any = None  # .run(feeds) -> list of arrays
    input_names: Tuple[str, ...] = ()
    outputs: Any = None  # the structure of the plugin's result (``split`` of forward's)
    seconds: float = 0.0  # export and load
    error: Optional[BaseException] = None
    opset: Optional[int] = None


_GRAPHS: OrderedDict[str, Graph] = OrderedDict()
_LOCK = threading.Lock()


def clear_cache() -> None:
    """Drop every exported graph of this process (``fresh``: the next call exports anew)."""
    with _LOCK:
        _GRAPHS.clear()


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _root_cause(exc: BaseException) -> BaseException:
    seen = exc
    for _ in range(12):
        nxt = seen.__cause__ or seen.__context__
        if not isinstance(nxt, BaseException):
            break
        seen = nxt
    return seen


def _unsupported_within(exc: BaseException) -> Optional[Unsupported]:
    seen: Optional[BaseException] = exc
    for _ in range(12):
        if isinstance(seen, Unsupported):
            return seen
        if seen is None:
            break
        seen = seen.__cause__ or seen.__context__
    return None


def export_graph(graph: torch.nn.Module, args: Sequence[torch.Tensor], names: Sequence[str],
                 exporter: str, opset: Optional[int] = None) -> bytes:
    """The ONNX model (serialized) ``exporter`` makes of ``graph`` called on ``args``."""
    chatter = io.StringIO()  # the exporters print progress and optimizer notes
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            program = torch.onnx.export(graph, tuple(args), dynamo=True, input_names=list(names),
                                        opset_version=opset, verbose=False)
            return program.model_proto.SerializeToString()
        buf = io.BytesIO()
        torch.onnx.export(graph, tuple(args), buf, dynamo=False, input_names=list(names),
                          opset_version=opset)
        return buf.getvalue()


class OrtSession:
    """An onnxruntime session of an ONNX model on the CPU execution provider, with torch's
    thread count (fixed, as every timed library's): ``run(feeds)`` -> the outputs."""

    def __init__(self, model: bytes) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, torch.get_num_threads())
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.opset = _opset(model)

    def run(self, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
        return self.session.run(None, feeds)


def _opset(model: bytes) -> Optional[int]:
    import onnx

    proto = onnx.load_from_string(model)
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


class ExportPath:
    """The export machinery, put before a torch plugin class in a subclass (``exported``).
    ``exporter = None`` is the source itself, run eagerly (the other side of its contract)."""

    exporter: ClassVar[Optional[str]] = "dynamo"
    source_name: ClassVar[str] = ""
    opset: ClassVar[Optional[int]] = None  # None: the exporter's default
    compiles_per_shape = True  # each (shape, mask kind) exports anew: seconds a case

    def __init__(self) -> None:
        if self.exporter is not None:  # (None: the eager source, which needs none of them)
            requirements(self.exporter)
        super().__init__()

    def devices(self) -> List[str]:
        return ["cpu"]  # onnxruntime's CPU execution provider

    def dtypes(self, device: str) -> Sequence[str]:
        if device != "cpu":
            return ()
        own = super().dtypes(device)  # type: ignore[misc]
        return tuple(d for d in EXPORT_DTYPES if d in own)

    def fresh(self) -> Any:
        clear_cache()
        return type(self)()

    # -- hooks a planted test (or a user) may override --------------------------------------
    def graph_inputs(self, state: Dict[str, Any]) -> Tuple[Dict[str, Any], List[torch.Tensor],
                                                          List[str]]:
        """(template, tensors, names): the state's inputs with each tensor a slot, the
        tensors in slot order and their graph input names."""
        tensors: List[torch.Tensor] = []
        seen: Dict[int, int] = {}
        template = {key: split(value, tensors, seen) for key, value in state.items()
                    if key not in _NOT_INPUTS and not isinstance(value, torch.nn.Module)}
        paths: Dict[int, str] = {}
        slot_paths(template, "", paths)
        names = [paths[i] for i in range(len(tensors))]
        return template, tensors, names

    def graph_key(self, state: Dict[str, Any], template: Dict[str, Any],
                  tensors: Sequence[torch.Tensor]) -> str:
        """The cache key of the graph for this state: what it bakes in."""
        modules = {k: v for k, v in state.items() if isinstance(v, torch.nn.Module)}
        shapes = {k: [(n, tuple(t.shape), str(t.dtype)) for n, t in
                      (*m.named_parameters(), *m.named_buffers())]
                  for k, m in modules.items()}
        text = "|".join([type(self).__qualname__, str(id(type(self))), str(self.exporter),
                         str(self.opset), describe(template, tensors), problem_key(state["p"]),
                         repr(shapes)])
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    # -- the four steps ---------------------------------------------------------------------
    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if grad:
            raise Unsupported("an exported graph is an inference graph: no gradients")
        state = super().prepare(problem, device, dtype,  # type: ignore[misc]
                                need_weights=need_weights, grad=False)
        if self.exporter is None:  # the source, eagerly
            return state
        template, tensors, names = self.graph_inputs(state)
        modules = {k: v for k, v in state.items() if isinstance(v, torch.nn.Module)}
        params = [(f"mods.{k}.{n}", t) for k, m in modules.items()
                  for n, t in (*m.named_parameters(), *m.named_buffers())]
        key = self.graph_key(state, template, tensors)
        with _LOCK:
            graph = _GRAPHS.get(key)
            if graph is not None:
                _GRAPHS.move_to_end(key)
        fresh = graph is None
        if fresh:
            graph = self._export(state, template, tensors, names, modules, params)
            with _LOCK:
                _GRAPHS[key] = graph
                while len(_GRAPHS) > CACHE_SIZE:
                    _GRAPHS.popitem(last=False)
        if graph.error is not None:
            raise graph.error
        values = {n: t for n, t in zip(names, tensors)}
        values.update({n.replace(".", "_"): t for n, t in params})
        feeds = {}
        for n in graph.input_names:
            if n not in values:
                raise RuntimeFailure(f"the exported graph asks for an input {n!r} the call has "
                                     f"none of")
            feeds[n] = values[n].detach().cpu().numpy()
        return {"source": state, "graph": graph, "feeds": feeds,
                "compile_s": graph.seconds if fresh else 0.0, "exported_now": fresh}

    def _export(self, state: Dict[str, Any], template: Dict[str, Any],
                tensors: List[torch.Tensor], names: List[str],
                modules: Dict[str, torch.nn.Module],
                params: List[Tuple[str, torch.Tensor]]) -> Graph:
        runner = _Runner(self, state, template, modules).eval()
        with torch.no_grad():  # the eager call first: a problem the module refuses
            runner(*tensors)  # is unsupported (its plugin's words), not an export error
        outputs = runner.outputs
        graph = _Graph(runner, len(tensors), [n for n, _ in params])
        param_inputs = [n.replace(".", "_") for n, _ in params]
        start = time.perf_counter()
        try:
            model = self.export_model(graph, [*tensors, *[t.detach() for _, t in params]],
                                      [*names, *param_inputs])
        except Exception as exc:  # noqa: BLE001 - the exporter's error is the case's
            inner = _unsupported_within(exc)
            if inner is not None:
                raise inner from None
            root = _root_cause(exc)
            said = f"{type(root).__name__}: {_first_line(root)}" if root is not exc else ""
            error = ExportError(f"{EXPORTERS[self.exporter]} raised {type(exc).__name__}: "
                                f"{_first_line(exc)}" + (f" (cause: {said})" if said else ""))
            error.__cause__ = exc
            return Graph(error=error, seconds=time.perf_counter() - start)
        try:
            session = self.load(model, [*names, *param_inputs])
        except Exception as exc:  # noqa: BLE001
            error = RuntimeFailure(f"{RUNTIMES[self.exporter]} cannot load the graph "
                                   f"{EXPORTERS[self.exporter]} made: {type(exc).__name__}: "
                                   f"{_first_line(exc)}")
            error.__cause__ = exc
            return Graph(error=error, seconds=time.perf_counter() - start)
        return Graph(session, session.input_names, outputs, time.perf_counter() - start,
                     opset=getattr(session, "opset", None))

    def export_model(self, graph: torch.nn.Module, args: Sequence[torch.Tensor],
                     names: Sequence[str]) -> bytes:
        """The serialized model the exporter makes of ``graph`` called on ``args``."""
        return export_graph(graph, args, names, self.exporter, self.opset)

    def load(self, model: bytes, names: Sequence[str]) -> Any:
        """The runtime's loaded ``model``: ``.run(feeds)`` and ``.input_names``."""
        return OrtSession(model)

    def run(self, state: Dict[str, Any]) -> Any:
        if self.exporter is None:
            return super().run(state)  # type: ignore[misc]
        try:
            return state["graph"].session.run(state["feeds"])
        except Exception as exc:  # noqa: BLE001
            raise RuntimeFailure(f"{RUNTIMES[self.exporter]} cannot run the graph {EXPORTERS[self.exporter]} "
                                 f"made: {type(exc).__name__}: {_first_line(exc)}") from exc

    def synchronize(self, state: Dict[str, Any]) -> None:
        if self.exporter is None:
            super().synchronize(state)  # type: ignore[misc]

    def fetch(self, state: Dict[str, Any], handle: Any) -> Any:
        if self.exporter is None:
            return super().fetch(state, handle)  # type: ignore[misc]
        outputs = [torch.from_numpy(np.asarray(a)) for a in handle]
        return super().fetch(state["source"],  # type: ignore[misc]
                             fill(state["graph"].outputs, outputs))


def exported(source: type, exporter: str = "dynamo", *, name: Optional[str] = None,
             families: Optional[FrozenSet[str]] = EXPORT_FAMILIES,
             opset: Optional[int] = None, module: Optional[str] = None) -> type:
    """A plugin class: ``source`` (a torch plugin class: ``TorchModuleCore`` or ``TorchCore``)
    with its module exported by ``exporter`` ("dynamo" or "torchscript": run by onnxruntime;
    "executorch": torch.export and ExecuTorch's runtime), named ``name`` (default
    ``export.onnx[SOURCE]``, ``export.onnx-ts[SOURCE]``, ``export.executorch[SOURCE]``),
    running ``families`` (None: every family), declaring that it agrees with ``source``
    run eagerly (``contracts/agrees_with_eager``). The class belongs to ``module`` (default:
    the caller's module, so a plugin file that makes it registers it)."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter: expected one of {sorted(EXPORTERS)}, got {exporter!r}")
    if not (isinstance(source, type) and issubclass(source, TorchCore)):
        raise TypeError(f"exported: expected a torch plugin class (a subclass of "
                        f"implementations.torch.common.TorchCore or TorchModuleCore), got "
                        f"{source!r}")
    if issubclass(source, ExportPath):
        raise TypeError(f"exported: {source.__name__} is already an export path")
    base = source.name or source.__name__
    name = name or f"{PREFIXES[exporter]}[{base}]"
    own = getattr(source, "families", None)
    runs = None if families is None else frozenset(families) if own is None \
        else frozenset(families) & frozenset(own) | {"contracts"}
    reason = (f"the graph {EXPORTERS[exporter]} makes of {base}'s call, run by "
              f"{RUNTIMES[exporter]}, computes what {base} computes eagerly")
    attrs = {
        "name": name, "exporter": exporter, "source_name": base, "opset": opset,
        "features": frozenset(source.features) - DROPPED_FEATURES,
        "families": runs,
        "contracts": (Contract("agrees_with_eager", "agrees", {"exporter": None}, reason),),
        # one exporter at one opset, one runtime: the same path whatever module it exports
        "compile_path": f"{EXPORTERS[exporter]} (opset {opset or 'default'}), run by "
                        f"{RUNTIMES[exporter]}",
        "replaces_builtin": False,
        "__module__": module or _caller_module() or source.__module__,
        "__doc__": f"{base} exported by {EXPORTERS[exporter]}, run by {RUNTIMES[exporter]}.",
    }
    cls_name = "Export_" + "".join(c if c.isalnum() else "_" for c in name)
    path: type = ExportPath
    if exporter == "executorch":
        from implementations.export.executorch import ExecuTorchPath as path
    return type(cls_name, (path, source), attrs)


def _caller_module() -> Optional[str]:
    """The module that called ``exported`` (outside this package): the made class belongs to
    it, so ``--plugin that_file.py`` registers it (the registry takes a file's own classes)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("implementations.export"):
            return name
        frame = frame.f_back
    return None


# --- the built-in names --------------------------------------------------------------------
def _builtin(source_path: str, exporter: str) -> type:
    module, cls = source_path.split(":")
    source = getattr(importlib.import_module(module), cls)
    return exported(source, exporter, module=__name__)


ExportOnnxTorchNN = _builtin("implementations.torch.nn:TorchNN", "dynamo")
ExportOnnxTorchNNSDPA = _builtin("implementations.torch.nn:TorchNNSDPA", "dynamo")
ExportOnnxTorchSDPA = _builtin("implementations.torch.sdpa:TorchSDPA", "dynamo")
# opset 23: the dynamo exporter translates SDPA into the ONNX Attention op (one node), which
# onnxruntime runs with its own Attention kernel (at the default opset 20: MatMul, Softmax, ...)
ExportOnnx23TorchSDPA = exported(TorchSDPA, "dynamo", opset=23, module=__name__,
                                 name="export.onnx-opset23[torch.sdpa]")
ExportOnnxTsTorchNN = _builtin("implementations.torch.nn:TorchNN", "torchscript")
ExportOnnxTsTorchSDPA = _builtin("implementations.torch.sdpa:TorchSDPA", "torchscript")
# ExecuTorch's names are made in implementations.export.executorch, after its ExecuTorchPath:
# made here, importing that module first would reach this line before the class exists.


# Hugging Face models through the dynamo exporter: a decoder's causal mask pipeline and an
# encoder's padding mask, each through transformers' sdpa attention (one name each keeps the
# covering check's cost down; ``exported`` wraps any other ``hf.model.*`` class the same way).
HF_MODEL_SOURCES = ("hf.model.llama[sdpa]", "hf.model.bert[sdpa]")


def hf_model_variants() -> List[type]:
    """``export.onnx[hf.model.MODEL[sdpa]]`` for each of ``HF_MODEL_SOURCES`` (transformers
    imported here: without it the family is unavailable)."""
    from implementations.hf.model import variants

    return [exported(cls, "dynamo", module=__name__) for cls in variants()
            if cls.name in HF_MODEL_SOURCES]
