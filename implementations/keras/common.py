"""The Keras module core: a Keras 3 layer (projections included) as a plugin, on the backend
of this process, beside ``TorchModuleCore`` and ``JaxModuleCore``.

Keras binds its backend once per process: ``keras/src/backend/config.py`` reads
``KERAS_BACKEND`` (or ``~/.keras/keras.json``) when keras is first imported, and
``keras.config.set_backend`` re-imports the whole package, documenting that objects made
before are no longer usable. So each process measures one backend: ``KERAS_BACKEND`` when
set, else torch (else jax); importing this module picks it.

A subclass writes ``build`` (the layer for a problem, in the run's dtype) and ``call`` (one
forward, as a model calls the layer). The core loads the canonical weights into the
sub-layers named in ``layers`` (each one's ``kernel`` and ``bias``), hands ``call`` the mask
(``module_mask``: ``suite.plugins.adapters.MaskParts`` by default, its arrays as tensors), and reads
gradients back. On torch the layer runs eagerly (Keras's own default there); on jax the call
runs under ``jax.jit`` inside a ``keras.StatelessScope`` with the variables as arguments, as
Keras's ``fit``/``predict`` do on jax, compiled in ``prepare``. On tensorflow it runs
eagerly, forward only (no gradients).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from suite.plugins import adapters
from suite.plugins.interface import Implementation, Result, Unsupported
from suite.spec.problem import Problem, cotangent


def _default_backend() -> str:
    """The backend keras uses here: its own when already imported, else KERAS_BACKEND, else
    torch when installed, else jax."""
    import sys

    keras = sys.modules.get("keras")
    if keras is not None:
        return keras.config.backend()
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    return "torch" if importlib.util.find_spec("torch") is not None else "jax"


# Set while keras is imported (it reads the backend once, at import), then unset again, so
# the process's environment (and what its subprocesses inherit) is the user's.
_CHOSEN = "KERAS_BACKEND" not in os.environ
os.environ.setdefault("KERAS_BACKEND", _default_backend())
try:
    import keras  # noqa: E402
finally:
    if _CHOSEN:
        del os.environ["KERAS_BACKEND"]

BACKEND = keras.config.backend()
DTYPES = ("float32", "float16", "bfloat16")
# The backends whose gradients the core reads back.
GRAD_BACKENDS = ("torch", "jax")


def sublayer(layer: Any, path: str) -> Any:
    """The sub-layer at a dotted attribute path (``"attn.query_dense"``) of ``layer``."""
    node = layer
    for part in path.split("."):
        if not hasattr(node, part):
            raise AttributeError(f"layers: {type(node).__name__} has no attribute {part!r} "
                                 f"(in the path {path!r} of {type(layer).__name__})")
        node = getattr(node, part)
    return node


def _canonical_params(problem: Problem) -> Dict[str, adapters.Param]:
    """role -> Param((in, out), (out,)) of the problem; "qkv": q, k, v side by side."""
    params = adapters.to_conv1d(problem.weights)
    q, k, v = params["q"], params["k"], params["v"]
    params["qkv"] = adapters.Param(
        np.concatenate([q.weight, k.weight, v.weight], axis=1),
        None if q.bias is None else np.concatenate([q.bias, k.bias, v.bias]))
    return params


def _as_in_out(role: str, a: np.ndarray) -> np.ndarray:
    """A kernel as (in, out): q/k/v ``EinsumDense`` (E, H, D) and ``Dense`` (E, H*D) keep
    their first axis, the output's (H, D, E) its last."""
    return a.reshape(-1, a.shape[-1]) if role == "o" else a.reshape(a.shape[0], -1)


class KerasModuleCore(Implementation):
    """A whole Keras layer (projections included) as a plugin, on this process's backend:
    subclasses write ``build`` and ``call``.

    ``layers`` maps the roles q, k, v, o (or "qkv" for one fused projection whose output
    columns are q, then k, then v) to the dotted path of a sub-layer with a ``kernel`` and
    an optional ``bias``: a ``Dense`` (in, out) or an ``EinsumDense`` whose kernel is a
    reshape of it (``MultiHeadAttention``'s (E, H, D) and (H, D, E)). A sub-layer with a bias
    the problem lacks gets zeros; a problem bias the sub-layer lacks is unsupported.

    The mask reaches ``call`` as ``module_mask`` returns it (default: ``MaskParts`` split with
    ``mask_split``, everything in one per-head boolean ``mask``, True = attend), its NumPy
    arrays as tensors (boolean arrays stay boolean, float ones in the compute dtype); a
    library with its own mask arguments may return a dict of keyword arguments instead.
    """

    poses_problem = False  # it computes the handed problem

    framework = "keras"
    array_library = BACKEND  # the sweep's matmul peak and memory method
    features = frozenset({"cross", "grad"} if BACKEND in GRAD_BACKENDS else {"cross"})
    # On jax the jitted call's kernels are XLA's code, as jax.jit's, jax.nn's and Flax's (a
    # compile per shape: CI's selection draws fewer property-based examples of a built-in
    # on it and runs each lanes case on one of its names; suite.conformance.cover)
    compile_path = "XLA" if BACKEND == "jax" else None
    layers: Dict[str, str] = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    mask_split: Dict[str, Any] = {"true_means": "attend", "key_padding": False,
                                  "native_causal": (), "per_head": True}
    # Whether ``call`` returns (output, weights) whatever it is asked (a +weights name).
    returns_weights = False

    def __init__(self) -> None:
        self._compiled: Dict[Tuple, Any] = {}

    def framework_version(self) -> str:
        return keras.__version__

    def devices(self) -> List[str]:
        return ["cpu"]

    def dtypes(self, device: str) -> Sequence[str]:
        return DTYPES

    def fresh(self) -> KerasModuleCore:
        return type(self)()

    # -- what a subclass writes ----------------------------------------------------------

    def build(self, problem: Problem, dtype: str) -> Any:
        """The layer for ``problem`` made with ``dtype=dtype`` (its sizes; the core builds it
        on the inputs when it is not built yet, then loads the weights)."""
        raise NotImplementedError

    def call(self, layer: Any, query, key, value, mask: Any, need_weights: bool):
        """One forward: -> output (B, L, E), or (output, weights (B, H, L, S))."""
        raise NotImplementedError

    def module_mask(self, problem: Problem) -> Any:
        """The mask as ``call`` receives it, in NumPy (the core turns its arrays into
        tensors): ``MaskParts`` (default) or a dict of the layer's keyword arguments."""
        return adapters.split_mask(problem, **self.mask_split)

    # -- weights -------------------------------------------------------------------------

    def load_weights(self, layer: Any, problem: Problem) -> None:
        """The problem's weights into the ``layers``' kernels and biases."""
        params = _canonical_params(problem)
        for role, path in self.layers.items():
            dense, param = sublayer(layer, path), params[role]
            kernel = dense.kernel
            if int(np.prod(kernel.shape)) != param.weight.size:
                raise ValueError(f"layers: {path}.kernel has shape {tuple(kernel.shape)}, which "
                                 f"the {role} weight {param.weight.shape} (in, out) does not "
                                 f"fill")
            kernel.assign(param.weight.reshape(kernel.shape).astype("float32"))
            bias = getattr(dense, "bias", None)
            if param.bias is not None and bias is None:
                raise Unsupported(f"{path} has no bias, the problem has one")
            if bias is not None:
                values = np.zeros(bias.shape) if param.bias is None else param.bias
                bias.assign(np.reshape(values, bias.shape).astype("float32"))

    def read_weights(self, layer: Any) -> Dict[str, np.ndarray]:
        """The weights the layer holds, under canonical names (the inverse of
        ``load_weights``)."""
        return self._by_role(layer, lambda var: _np(var.value))

    def check_wrapper(self, problem: Problem) -> List[str]:
        """The wrapper's own translation, before any verdict on the library: the weights
        read back from the layer built and loaded for ``problem`` (float32) must equal the
        problem's to float32 rounding. Returns what differs (empty: the round trip holds);
        ``Unsupported`` when the wrapper loads its own layout and gives no ``read_weights``."""
        if _overrides(self, "load_weights") and not _overrides(self, "read_weights"):
            raise Unsupported("load_weights is the wrapper's own and it gives no read_weights "
                              "(its inverse)")
        layer = self._built(problem, "float32", self._tensors(problem, "float32"))
        self.load_weights(layer, problem)
        return adapters.weight_differences(problem.weights, self.read_weights(layer),
                                           rtol=1e-6, atol=1e-6)

    def check_mask(self, problem: Problem) -> List[str]:
        """The wrapper's own mask translation: the ``MaskParts`` ``module_mask`` hands to
        ``call``, read back by its convention, must mean the canonical mask of ``problem``
        (``suite.plugins.adapters.mask_differences``); ``Unsupported`` for the library's own keyword
        arguments (a dict)."""
        parts = self.module_mask(problem)
        if not isinstance(parts, adapters.MaskParts):
            raise Unsupported(f"module_mask returns {type(parts).__name__}, not "
                              f"suite.plugins.adapters.MaskParts: the suite cannot read it back")
        return adapters.mask_differences(problem, parts)

    def weight_grads(self, layer: Any, grad_of: Callable[[Any], Any]) -> Dict[str, np.ndarray]:
        """The gradients of the ``layers``' kernels and biases (``grad_of(variable)``) under
        canonical names."""
        return self._by_role(layer, lambda var: _np(grad_of(var)))

    def _by_role(self, layer: Any, pick: Callable[[Any], np.ndarray]) -> Dict[str, np.ndarray]:
        per_role: Dict[str, adapters.Param] = {}
        for role, path in self.layers.items():
            dense = sublayer(layer, path)
            bias = getattr(dense, "bias", None)
            w, b = _as_in_out(role, pick(dense.kernel)), None if bias is None else pick(bias)
            b = None if b is None else b.reshape(-1)
            if role != "qkv":
                per_role[role] = adapters.Param(w, b)
                continue
            width = w.shape[1] // 3  # q, k, v side by side (no GQA in a fused layer)
            for i, r in enumerate("qkv"):
                per_role[r] = adapters.Param(w[:, i * width:(i + 1) * width],
                                             None if b is None else b[i * width:(i + 1) * width])
        return adapters.grads_from_conv1d(per_role)

    # -- the steps -----------------------------------------------------------------------

    def _inputs(self) -> Tuple[str, ...]:
        """The distinct inputs: query, key and value; query and one key/value input
        (``kv_source = "shared"``); or one for all three (``"self"``)."""
        return {"self": ("query",), "shared": ("query", "key")}.get(
            self.kv_source, ("query", "key", "value"))

    def _tensors(self, problem: Problem, dtype: str):
        return [keras.ops.convert_to_tensor(getattr(problem, n), dtype=dtype)
                for n in self._inputs()]

    def _qkv(self, inputs: Sequence[Any]) -> Tuple[Any, Any, Any]:
        """The distinct inputs as (query, key, value)."""
        return (inputs[0], inputs[-1 if len(inputs) < 3 else 1], inputs[-1])

    def _built(self, problem: Problem, dtype: str, inputs, mask: Any = None) -> Any:
        """The layer ``build`` makes, built on the inputs when ``build`` left it unbuilt."""
        with keras.device("cpu"):
            layer = self.build(problem, dtype)
            if not layer.built:
                if mask is None:
                    mask = _to_tensors(self.module_mask(problem), dtype)
                with _no_grad():
                    self.call(layer, *self._qkv(inputs), mask, False)
        return layer

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if device != "cpu":
            raise ValueError(f"device: expected 'cpu', got {device!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
        if grad and BACKEND not in GRAD_BACKENDS:
            raise Unsupported(f"the Keras core reads gradients on {GRAD_BACKENDS}, not on "
                              f"{BACKEND}")
        p = problem
        with keras.device("cpu"):
            x = self._tensors(p, dtype)
            mask = _to_tensors(self.module_mask(p), dtype)
            g = keras.ops.convert_to_tensor(cotangent(p), dtype=dtype) if grad else None
        layer = self._built(p, dtype, x, mask)
        self.load_weights(layer, p)
        if grad and BACKEND == "torch":
            x = [t.requires_grad_(True) for t in x]  # separate leaves, each with its gradient
        state = {"layer": layer, "inputs": x, "mask": mask, "out": None, "compile_s": 0.0,
                 "grad": grad, "cotangent": g, "weights": need_weights or self.returns_weights}
        if BACKEND == "jax":
            self._jit(state, p, dtype)
        return state

    def _jit(self, state: Dict[str, Any], p: Problem, dtype: str) -> None:
        """Compile the call once per shape: the variables, inputs and the mask's arrays are
        the executable's arguments, the mask's other fields static."""
        from implementations.jax.common import compile_once, with_vjp

        layer, weights = state["layer"], state["weights"]
        arrays, rebuild = _split_arrays(state["mask"])
        trainable, non_trainable = layer.trainable_variables, layer.non_trainable_variables
        values = ([v.value for v in trainable], [v.value for v in non_trainable])

        n_inputs = len(state["inputs"])

        def fwd(t_values, n_values, *inputs_arrays):
            *inputs, arrays = inputs_arrays
            mapping = list(zip(trainable, t_values)) + list(zip(non_trainable, n_values))
            with keras.StatelessScope(state_mapping=mapping):
                return self.call(layer, *self._qkv(inputs), rebuild(arrays), weights)

        def output(*a):  # the output alone, without the weights
            res = fwd(*a)
            return res[0] if weights else res

        fn, args = fwd, (*values, *state["inputs"], arrays)
        if state["grad"]:  # w.r.t. the trainable variables and the inputs
            fn, args = with_vjp(output, (0, *range(2, 2 + n_inputs))), (*args, state["cotangent"])
        key = (type(self), dtype, p.B, p.L, p.S, p.E, p.H, p.K, weights, state["grad"],
               _config(layer), tuple(tuple(v.shape) for v in (*trainable, *non_trainable)),
               repr(rebuild({n: None for n in arrays})),
               tuple((n, tuple(a.shape), str(a.dtype)) for n, a in sorted(arrays.items())))
        state["exe"], state["compile_s"] = compile_once(self._compiled, key, fn, args)
        state["args"] = args

    def run(self, state: Dict[str, Any]):
        if "exe" in state:  # jax: the compiled call
            from implementations.jax.common import run_compiled

            return run_compiled(state)
        layer, (q, k, v) = state["layer"], self._qkv(state["inputs"])
        if state["grad"]:  # torch: forward + backward of sum(out * cotangent)
            for t in (*layer.trainable_variables, *state["inputs"]):
                (t.value if hasattr(t, "value") else t).grad = None
            with keras.device("cpu"):  # tensors the layer makes stay on the inputs' device
                res = self.call(layer, q, k, v, state["mask"], state["weights"])
            out = res[0] if state["weights"] else res
            out.backward(state["cotangent"])
            state["out"] = out.detach()
            return state["out"]
        with keras.device("cpu"), _no_grad():
            state["out"] = self.call(layer, q, k, v, state["mask"], state["weights"])
        return state["out"]

    def synchronize(self, state: Dict[str, Any]) -> None:
        if BACKEND == "jax" and state["out"] is not None:
            from implementations.jax.common import block

            block(state)

    def fetch(self, state: Dict[str, Any], handle) -> Result:
        if state["grad"]:
            return self._fetch_grads(state, handle)
        out, weights = handle if isinstance(handle, (tuple, list)) else (handle, None)
        return Result(_np(out), None if weights is None else _np(weights))

    def _fetch_grads(self, state: Dict[str, Any], handle) -> Result:
        layer = state["layer"]
        if BACKEND == "jax":
            out, (g_vars, *g_inputs) = handle
            by_id = {id(v): g for v, g in zip(layer.trainable_variables, g_vars)}

            def grad_of(var):
                return by_id[id(var)]
        else:
            out, g_inputs = handle, [t.grad for t in state["inputs"]]

            def grad_of(var):
                return var.value.grad
        grads = self.weight_grads(layer, grad_of)
        grads.update(zip(self._inputs(), map(_np, g_inputs)))
        return Result(_np(out), None, grads)


def _overrides(impl: Any, method: str) -> bool:
    """Whether ``impl``'s class replaces the core's ``method``."""
    return getattr(type(impl), method) is not getattr(KerasModuleCore, method)


def _np(a) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(a, "float32")), np.float64)


def _no_grad():
    """torch: no autograd graph for a forward-only call (as Keras's predict on torch)."""
    if BACKEND == "torch":
        import torch

        return torch.no_grad()
    import contextlib

    return contextlib.nullcontext()


def _split_arrays(mask: Any) -> Tuple[Dict[str, Any], Callable[[Dict[str, Any]], Any]]:
    """The array fields of a ``MaskParts`` or the array values of a dict, and the function
    that puts (traced) arrays back in their places."""
    if dataclasses.is_dataclass(mask):
        arrays = {f.name: getattr(mask, f.name) for f in dataclasses.fields(mask)
                  if _is_array(getattr(mask, f.name))}
        return arrays, lambda new: dataclasses.replace(mask, **new)
    if isinstance(mask, dict):
        arrays = {n: a for n, a in mask.items() if _is_array(a)}
        return arrays, lambda new: {**mask, **new}
    raise TypeError(f"module_mask: expected MaskParts or a dict, got {type(mask).__name__}")


def _is_array(a: Any) -> bool:
    return a is not None and hasattr(a, "shape") and hasattr(a, "dtype")


def _to_tensors(mask: Any, dtype: str) -> Any:
    """``mask`` with its NumPy arrays as tensors: boolean stays boolean, float in ``dtype``."""
    arrays, rebuild = _split_arrays(mask)
    return rebuild({n: keras.ops.convert_to_tensor(
        np.ascontiguousarray(a), dtype="bool" if a.dtype == bool else dtype)
        for n, a in arrays.items()})


def _config(layer: Any) -> Any:
    """The layer's configuration without its name and seed (one compiled call serves every
    layer of that configuration: a seed only sets the initial state of the layer's
    ``SeedGenerator``, a non-trainable variable and so an argument of the call, so a new
    dropout draw per call does not compile anew), or the layer itself when it has no
    configuration."""
    try:
        config = layer.get_config()
    except NotImplementedError:
        return id(layer)
    return repr(sorted((k, v) for k, v in config.items() if k not in ("name", "seed")))
