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
path instead. Both are built on ``implementations.keras.common.KerasModuleCore``: on torch
the layer runs eagerly (Keras's own default there); on jax its call runs under ``jax.jit``
in a ``keras.StatelessScope``, as Keras's ``fit``/``predict`` do on jax, compiled in
``prepare``.

Translation: the canonical weights go into the ``EinsumDense`` kernels (E, H, D) and
(H, D, E); the mask becomes ``attention_mask`` (B, L, S), True = attend, head-free, and
top-left causal alone becomes ``use_causal_mask=True``. Keras has no per-head mask, no
additive bias, no GQA and no scale argument (always 1/sqrt(key_dim)); ``use_bias`` is all
or nothing, so a problem with only some biases is refused.

Training mode (``Problem.dropout``, feature ``dropout``): the layer is made with
``dropout=p`` and called with ``training=True``; a layer with dropout > 0 always takes the
explicit path (its ``_compute_attention``), whose ``Dropout`` sub-layer drops the softmax's
weights with the layer's ``SeedGenerator``. Each call is a new layer, so its ``seed`` is the
draw's own (``dropout_seed``: the problem's digest and the draw's index), so successive
calls draw new masks and a run replays them. On jax the generator's state is one of the
layer's non-trainable variables, an argument of the compiled call (one executable for
every draw); on torch it seeds a ``torch.Generator`` per call.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Dict, List

from implementations.keras.common import BACKEND, KerasModuleCore, keras
from suite.plugins import adapters, probes
from suite.plugins.adapters import dropout_seed
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Unsupported
from suite.spec.problem import Problem

BACKENDS = ("torch", "jax", "tensorflow")
FEATURES = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "cross",
                      "grad", "dropout"})
DTYPES = ("float32", "float16", "bfloat16")


def build_layer(p: Problem, dtype: str, **options: Any):
    """A built ``MultiHeadAttention`` of the problem's sizes (the core loads the canonical
    weights into its ``EinsumDense`` kernels); ``options``: more constructor arguments
    (``attention_axes``, ``dropout``...), over the ones the problem sets."""
    w = p.weights
    present = [b is not None for b in (w.b_q, w.b_k, w.b_v, w.b_o)]
    if any(present) and not all(present):
        raise Unsupported("Keras's use_bias is all or nothing: the problem has only some biases")
    layer = keras.layers.MultiHeadAttention(**{
        "num_heads": p.H, "key_dim": p.D, "value_dim": p.D, "use_bias": all(present),
        "dtype": dtype, **options})
    layer.build((p.B, p.L, p.E), (p.B, p.S, p.E), (p.B, p.S, p.E))
    return layer


# Mask forms the layer takes: ``attention_mask`` (B, L, S) (True = attend), ``use_causal_mask``
# beside it or alone (alone it takes the backend's fused causal kernel), ``value_mask`` (B, S)
# and ``query_mask`` (B, L), the masks Keras's masking carries on its inputs.
MASK_FORMS = frozenset({"bool_BLS", "causal_flag", "causal_flag+bool_BLS", "kpm_bool",
                        "kpm_bool+bool_BLS", "causal_flag+kpm_bool", "qpm_bool",
                        "qpm_bool+kpm_bool"})




def call_kwargs(p: Problem) -> Dict[str, Any]:
    """The canonical mask as the layer's ``attention_mask`` (B, L, S) and ``use_causal_mask``
    (for a requested mask form: its parts as the layer's own keywords), and ``training=True``
    in training mode (``p.dropout`` set)."""
    training = {} if p.dropout is None else {"training": True}
    return {**_mask_kwargs(p), **training}


def _mask_kwargs(p: Problem) -> Dict[str, Any]:
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


class KerasMHA(KerasModuleCore):
    """The layer on this process's backend: the fused path, or with ``need_weights`` (always,
    for the +weights name) the explicit one."""

    name = f"keras.mha[{BACKEND}]"
    features = FEATURES
    mask_forms = MASK_FORMS
    layers = {"q": "query_dense", "k": "key_dense", "v": "value_dense", "o": "output_dense"}
    contracts = (Contract("agrees_with_weights_path", "agrees", {"returns_weights": True},
                          "the fused path computes what the explicit path "
                          "(return_attention_scores=True) does"),)
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

    def dtypes(self, device: str) -> List[str]:
        return [t for t in DTYPES if _usable(t, self.returns_weights)]

    def build(self, problem: Problem, dtype: str):
        p = problem
        # Training mode: the layer's dropout, its Dropout sub-layer seeded per draw.
        dropout = {} if p.dropout is None else {"dropout": p.dropout,
                                                "seed": dropout_seed(self, p)}
        return build_layer(p, dtype, **{**dropout, **self.layer_kwargs})

    def module_mask(self, problem: Problem) -> Dict[str, Any]:
        return call_kwargs(problem)

    def call(self, layer, query, key, value, mask: Dict[str, Any], need_weights: bool):
        # The +weights name always takes the weights path, so a sweep (which asks for no
        # weights) times the path its name says.
        return layer(query, value, key=key, return_attention_scores=need_weights, **mask)


class KerasMHAWeights(KerasMHA):
    name = f"keras.mha[{BACKEND}]+weights"
    features = FEATURES | {"weights"}
    contracts = ()
    returns_weights = True
    # The explicit path's masked Softmax zeroes masked weights after the softmax, so a fully
    # masked row gives the spec's zero head output; NaN padding still reaches weights @ v.
    deviations = {"nan_padding": _NAN_PADDING}


def _usable(dtype: str, need_weights: bool) -> bool:
    """Whether a tiny call runs in this dtype (probed once per process, cached on disk)."""
    def probe() -> None:
        from suite.spec.problem import make_problem

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
