"""keras.mha: ``keras.layers.MultiHeadAttention`` (Keras 3) on the backend of this process.

Keras binds its backend once per process: ``keras/src/backend/config.py`` reads
``KERAS_BACKEND`` (or ``~/.keras/keras.json``) when keras is first imported, and
``keras.config.set_backend`` re-imports the whole package, documenting that objects made
before are no longer usable; the layer's code also imports keras modules lazily at call
time, so a layer of one backend would run code of another. So each process measures one
backend: ``KERAS_BACKEND`` when set, else torch (else jax). The other backends' names are
listed as unavailable with the command that measures them, e.g.
``KERAS_BACKEND=jax mha-suite check --impl 'keras.mha*'``.

Names: ``keras.mha[BACKEND]`` calls the layer as a model does (fused path:
``ops.dot_product_attention``, the backend's SDPA); ``keras.mha[BACKEND]+weights`` asks for
``return_attention_scores=True``, which takes the layer's explicit einsum + masked softmax
path instead. On torch the layer runs eagerly (Keras's own default there); on jax its
``stateless_call`` runs under ``jax.jit``, as Keras's ``fit``/``predict`` do on jax,
compiled in ``prepare``.

Translation: the canonical weights go into the ``EinsumDense`` kernels (E, H, D) and
(H, D, E); the mask becomes ``attention_mask`` (B, L, S), True = attend, head-free, and
top-left causal alone becomes ``use_causal_mask=True``. Keras has no per-head mask, no
additive bias, no GQA and no scale argument (always 1/sqrt(key_dim)); ``use_bias`` is all
or nothing, so a problem with only some biases is refused.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from suite import adapters, probes
from suite.plugin import Deviation, Implementation, Result, Unsupported
from suite.problem import Problem, cotangent


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
BACKENDS = ("torch", "jax", "tensorflow")
FEATURES = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "cross",
                      "grad"})
DTYPES = ("float32", "float16", "bfloat16")


def build_layer(p: Problem, dtype: str, **options: Any):
    """A built ``MultiHeadAttention`` holding the canonical weights (EinsumDense layouts);
    ``options``: more constructor arguments (``attention_axes``, ``dropout``...), over the
    ones the problem sets."""
    w = p.weights
    present = [b is not None for b in (w.b_q, w.b_k, w.b_v, w.b_o)]
    if any(present) and not all(present):
        raise Unsupported("Keras's use_bias is all or nothing: the problem has only some biases")
    layer = keras.layers.MultiHeadAttention(**{
        "num_heads": p.H, "key_dim": p.D, "value_dim": p.D, "use_bias": all(present),
        "dtype": dtype, **options})
    layer.build((p.B, p.L, p.E), (p.B, p.S, p.E), (p.B, p.S, p.E))
    kernels = adapters.to_einsum(w, p.H)  # q/k/v (E, H, D), o (H, D, E)
    for role, dense in zip("qkvo", (layer.query_dense, layer.key_dense, layer.value_dense,
                                    layer.output_dense)):
        dense.kernel.assign(kernels[role].weight.astype("float32"))
        if all(present):
            dense.bias.assign(kernels[role].bias.astype("float32"))
    return layer


# Mask forms the layer takes: ``attention_mask`` (B, L, S) (True = attend), ``use_causal_mask``
# beside it or alone (alone it takes the backend's fused causal kernel), ``value_mask`` (B, S)
# and ``query_mask`` (B, L), the masks Keras's masking carries on its inputs.
MASK_FORMS = frozenset({"bool_BLS", "causal_flag", "causal_flag+bool_BLS", "kpm_bool",
                        "kpm_bool+bool_BLS", "causal_flag+kpm_bool", "qpm_bool",
                        "qpm_bool+kpm_bool"})


def call_kwargs(p: Problem) -> Dict[str, Any]:
    """The canonical mask as the layer's ``attention_mask`` (B, L, S) and ``use_causal_mask``
    (for a requested mask form: its parts as the layer's own keywords)."""
    if adapters.requested_form(p):
        form = adapters.form_mask(p)
        kw = {"attention_mask": form.attn,
              "use_causal_mask": "causal_flag" in adapters.form_parts(p.mask_form)}
        if form.key_padding is not None:
            kw["value_mask"] = form.key_padding  # (B, S), True = attend
        if form.query_mask is not None:
            kw["query_mask"] = form.query_mask  # (B, L), True = the row attends
        return kw
    parts = adapters.split_mask(p, true_means="attend", key_padding=False,
                                native_causal=("top_left",), per_head=False)
    if parts.bias is not None:
        raise Unsupported("keras.layers.MultiHeadAttention takes no additive bias")
    return {"attention_mask": parts.mask, "use_causal_mask": parts.causal == "top_left"}


# How the fused path (ops.dot_product_attention) masks, per backend (read in keras's
# backend/*/nn.py, confirmed by the conformance cases).
_FUSED_MASKING = {
    "torch": "the torch backend turns the boolean mask into an additive -0.7 * max-float mask "
             "for F.scaled_dot_product_attention, so a fully masked row's logits are all equal",
    "jax": "the jax backend passes the mask to jax.nn.dot_product_attention, which gives such "
           "a row uniform weights",
}
_NAN_PADDING = Deviation(
    "confined", "NaN in a masked key or value position gives NaN rows: a NaN logit stays NaN "
                "under the mask and 0 * NaN is NaN in weights @ v "
                f"(measured, keras {keras.__version__}, {BACKEND} backend)")


class KerasMHA(Implementation):
    """The layer on this process's backend: the fused path, or with ``need_weights`` (always,
    for the +weights name) the explicit one."""

    name = f"keras.mha[{BACKEND}]"
    framework = "keras"
    array_library = BACKEND  # the sweep's matmul peak and memory method
    features = FEATURES
    mask_forms = MASK_FORMS
    with_weights = False
    # More constructor arguments for the layer: a subclass sets one option, e.g.
    # ``layer_kwargs = {"attention_axes": (1,)}`` (the weights still go in canonically).
    layer_kwargs: Dict[str, Any] = {}
    deviations: Dict[str, Deviation] = {
        "fully_masked_rows": Deviation(
            "mean_values", "a query row with no key to attend gives the mean of the values, not "
                           f"a zero head output: {_FUSED_MASKING.get(BACKEND, '')} (measured, "
                           f"keras {keras.__version__}, {BACKEND} backend)"),
        "nan_padding": _NAN_PADDING,
    }

    def __init__(self) -> None:
        self._compiled: Dict[Tuple, Any] = {}

    def framework_version(self) -> str:
        return keras.__version__

    def devices(self) -> List[str]:
        return ["cpu"]

    def dtypes(self, device: str) -> Sequence[str]:
        return [t for t in DTYPES if _usable(t, self.with_weights)]

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if device != "cpu":
            raise ValueError(f"device: expected 'cpu', got {device!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
        p = problem
        kw = call_kwargs(p)
        # The +weights name always takes the weights path, so a sweep (which asks for no
        # weights) times the path its name says.
        kw["return_attention_scores"] = need_weights or self.with_weights
        with keras.device("cpu"):
            layer = build_layer(p, dtype, **self.layer_kwargs)
            x = [keras.ops.convert_to_tensor(a, dtype=dtype) for a in (p.query, p.key, p.value)]
            for name in ("attention_mask", "value_mask", "query_mask"):
                if kw.get(name) is not None:
                    kw[name] = keras.ops.convert_to_tensor(kw[name])
            g = keras.ops.convert_to_tensor(cotangent(p), dtype=dtype) if grad else None
        if grad and BACKEND == "torch":
            x = [t.requires_grad_(True) for t in x]  # separate leaves, each with its gradient
        state = {"layer": layer, "inputs": x, "kwargs": kw, "out": None, "compile_s": 0.0,
                 "grad": grad, "cotangent": g}
        if BACKEND == "jax":
            self._jit(state, p, dtype)
        return state

    def _jit(self, state: Dict[str, Any], p: Problem, dtype: str) -> None:
        """Compile ``stateless_call`` once per shape; the variables are its arguments."""
        from implementations.jax_common import compile_once, with_vjp

        layer, kw = state["layer"], state["kwargs"]
        masks = {n: kw.pop(n) for n in ("attention_mask", "value_mask", "query_mask") if n in kw}
        variables = ([v.value for v in layer.trainable_variables],
                     [v.value for v in layer.non_trainable_variables])
        key = (dtype, p.B, p.L, p.S, p.E, p.H, len(variables[0]), state["grad"],
               tuple((n, None if m is None else tuple(m.shape)) for n, m in masks.items()),
               tuple(sorted(kw.items())))

        def fwd(trainable, non_trainable, q, k, v, masks):
            out, _ = layer.stateless_call(trainable, non_trainable, q, v, key=k, **masks, **kw)
            return out

        def output(*a):  # the output alone, without the weights
            res = fwd(*a)
            return res[0] if kw["return_attention_scores"] else res

        fn, args = fwd, (*variables, *state["inputs"], masks)
        if state["grad"]:  # w.r.t. the trainable variables and the inputs
            fn, args = with_vjp(output, (0, 2, 3, 4)), (*args, state["cotangent"])
        state["exe"], state["compile_s"] = compile_once(self._compiled, key, fn, args)
        state["args"] = args

    def run(self, state: Dict[str, Any]):
        if "exe" in state:  # jax: the compiled stateless_call
            from implementations.jax_common import run_compiled

            return run_compiled(state)
        q, k, v = state["inputs"]
        if state["grad"]:  # torch: forward + backward of sum(out * cotangent)
            for t in (*state["layer"].trainable_variables, *state["inputs"]):
                (t.value if hasattr(t, "value") else t).grad = None
            with keras.device("cpu"):  # tensors the layer makes stay on the inputs' device
                res = state["layer"](q, v, key=k, **state["kwargs"])
            out = res[0] if isinstance(res, (tuple, list)) else res
            out.backward(state["cotangent"])
            state["out"] = out.detach()
            return state["out"]
        with keras.device("cpu"), _no_grad():
            state["out"] = state["layer"](q, v, key=k, **state["kwargs"])
        return state["out"]

    def synchronize(self, state: Dict[str, Any]) -> None:
        if BACKEND == "jax" and state["out"] is not None:
            from implementations.jax_common import block

            block(state)

    def fetch(self, state: Dict[str, Any], handle) -> Result:
        if state["grad"]:
            return self._fetch_grads(state, handle)
        out, weights = handle if isinstance(handle, (tuple, list)) else (handle, None)
        return Result(_np(out), None if weights is None else _np(weights))

    def _fetch_grads(self, state: Dict[str, Any], handle) -> Result:
        """Gradients of the EinsumDense kernels and biases, mapped to the canonical names."""
        layer = state["layer"]
        trainable = list(layer.trainable_variables)
        if BACKEND == "jax":
            out, (g_vars, *g_inputs) = handle
            def grad_of(var):
                return next(g for v, g in zip(trainable, g_vars) if v is var)
        else:
            out, g_inputs = handle, [t.grad for t in state["inputs"]]
            def grad_of(var):
                return var.value.grad
        dense = (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)
        grads = adapters.grads_from_einsum({
            role: adapters.Param(_np(grad_of(d.kernel)),
                                 None if d.bias is None else _np(grad_of(d.bias)))
            for role, d in zip("qkvo", dense)})
        grads.update(zip(("query", "key", "value"), map(_np, g_inputs)))
        return Result(_np(out), None, grads)

    def fresh(self) -> KerasMHA:
        return type(self)()


def _np(a) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(a, "float32")), np.float64)


def _no_grad():
    """torch: no autograd graph for a forward-only call (as Keras's predict on torch)."""
    if BACKEND == "torch":
        import torch

        return torch.no_grad()
    import contextlib

    return contextlib.nullcontext()


class KerasMHAWeights(KerasMHA):
    name = f"keras.mha[{BACKEND}]+weights"
    features = FEATURES | {"weights"}
    with_weights = True
    # The explicit path's masked Softmax zeroes masked weights after the softmax, so a fully
    # masked row gives the spec's zero head output; NaN padding still reaches weights @ v.
    deviations = {"nan_padding": _NAN_PADDING}


def _usable(dtype: str, need_weights: bool) -> bool:
    """Whether a tiny call runs in this dtype (probed once per process, cached on disk)."""
    def probe() -> None:
        from suite.problem import make_problem

        impl = KerasMHAWeights() if need_weights else KerasMHA()
        p = make_problem(0, B=1, L=3, E=8, H=2)
        impl.fetch(s := impl.prepare(p, "cpu", dtype, need_weights=need_weights), impl.run(s))

    # a failure is kept with the exception it caught: the reason an empty dtype list shows
    return probes.usable(f"keras.mha[{BACKEND}] dtype:{dtype}:{need_weights}",
                         f"a {dtype} keras.layers.MultiHeadAttention call", probe)


def _unavailable_reason(backend: str) -> str:
    if backend == "tensorflow" and importlib.util.find_spec("tensorflow") is None:
        return "tensorflow is not installed (Keras's tensorflow backend needs it)"
    return (f"Keras binds one backend per process and this one uses {BACKEND}: run with "
            f"KERAS_BACKEND={backend} (e.g. KERAS_BACKEND={backend} mha-suite check --impl "
            f"'keras.mha*')")


# Names of the other backends, listed as unavailable with the reason (read by the registry).
DROPPED = {f"keras.mha[{b}]{suffix}": _unavailable_reason(b)
           for b in BACKENDS if b != BACKEND for suffix in ("", "+weights")}


def variants() -> List[type]:
    """The fused and the weights path on this process's backend."""
    return [KerasMHA, KerasMHAWeights]
