"""flax.mha: ``flax.nnx.MultiHeadAttention`` under ``jax.jit``.

Names: ``flax.mha`` calls the module as a model does; with its default ``attention_fn``
(``nnx.dot_product_attention``), no dropout and no weights to sow, that is the fused
``jax.nn.dot_product_attention``. ``flax.mha+weights`` calls it with ``sow_weights=True``,
which takes flax's explicit path instead (``dot_product_attention_weights``: einsum,
``jnp.where(mask, logits, finfo.min)``, softmax) and sows the weights into
``nnx.Intermediate`` ``attention_weights``, read back through ``nnx.capture``.

Translation: ``in_features = out_features = E``, ``qkv_features = H*D``, ``num_kv_heads = K``
(GQA), ``decode=False``, ``dropout_rate=0``, ``deterministic=True``, ``normalize_qk=False``;
the ``LinearGeneral`` kernels (E, H, D), (E, K, D) and (H, D, E) take the canonical weights;
the mask becomes ``mask`` broadcastable to (B, H, L, S), True = attend, and top-left causal
alone ``is_causal=True``. It has no additive bias and no scale argument (1/sqrt(D) always);
``use_bias`` is all or nothing. The module's ``dtype`` and ``param_dtype`` are the dtype
measured; the module, split by ``nnx.split`` into its graph (static) and its state (the
parameters) and merged again inside the traced call, runs on ``JaxModuleCore``.

Training mode (``Problem.dropout``, feature ``dropout``, every name here):
``dropout_rate=p``, ``deterministic=False`` and a ``dropout`` PRNG key per call from the
problem's digest and the draw's index (``dropout_seed``), so successive calls draw new
masks and a run replays them: nnx keeps it in the module's ``rngs`` (its state, an argument
of the compiled call: one executable for every draw), linen takes it in ``apply(rngs=)``
(carried beside the parameters). A rate above 0 takes flax's explicit path
(``dot_product_attention_weights``), which drops the softmax's weights. Both set
``broadcast_dropout=False``: flax's default (True) draws one (L, S) mask shared by every
batch item and head, which the spec's dropout (independent per batch item, head, query and
key) is not; that is the translation of the spec, as a mask's convention is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from implementations.jax.common import EINSUM_LAYERS, JAX_DTYPES, JaxModuleCore, _np, tf32_on_gpu
from suite.plugins import adapters, cache, probes
from suite.plugins.adapters import dropout_seed
from suite.plugins.conditions import Where
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Unsupported
from suite.spec.problem import Problem

cache.enable_compile_caches()  # executables persist in the user's cache: compile once

FEATURES = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "cross",
                      "gqa", "grad", "dropout"})
# Where linen's dropout key rides beside its parameters (popped before ``apply``).
DROPOUT_KEY = "dropout_rng"




def dropout_options(impl: Any, p: Problem) -> Dict[str, Any]:
    """The constructor arguments of training mode (none in eval mode): the problem's rate,
    not deterministic, a mask per batch item and head (``broadcast_dropout=False``)."""
    if p.dropout is None:
        return {}
    return {"dropout_rate": p.dropout, "deterministic": False, "broadcast_dropout": False}


# Mask forms the module's ``mask`` takes: boolean, broadcastable to (B, H, L, S) (its
# docstring's shape; the fused path hands it to jax.nn, the explicit one broadcasts it in
# jnp.where), and is_causal beside it.
MASK_FORMS = frozenset({"bool_BHLS", "bool_B1LS", "bool_11LS", "bool_B11S", "bool_BHL1",
                        "causal_flag", "causal_flag+bool_B11S"})


def build_module(p: Problem, dtype: str, **options: Any) -> nnx.MultiHeadAttention:
    """An ``nnx.MultiHeadAttention`` holding the canonical weights (LinearGeneral layouts);
    ``options``: more constructor arguments (``precision``, ``attention_fn``...), over the
    ones the problem sets."""
    w = p.weights
    present = [b is not None for b in (w.b_q, w.b_k, w.b_v, w.b_o)]
    if any(present) and not all(present):
        raise Unsupported("flax's use_bias is all or nothing: the problem has only some biases")
    t = JAX_DTYPES[dtype]
    mha = nnx.MultiHeadAttention(**{
        "num_heads": p.H, "in_features": p.E, "qkv_features": p.H * p.D, "out_features": p.E,
        "num_kv_heads": p.K, "dtype": t, "param_dtype": t, "use_bias": all(present),
        "dropout_rate": 0.0, "deterministic": True, "decode": False, "normalize_qk": False,
        "rngs": nnx.Rngs(0), **options})
    kernels = adapters.to_einsum(w, p.H, p.K)  # q (E, H, D), k/v (E, K, D), o (H, D, E)
    for role, dense in zip("qkvo", (mha.query, mha.key, mha.value, mha.out)):
        dense.kernel[...] = jnp.asarray(kernels[role].weight, t)
        if all(present):
            dense.bias[...] = jnp.asarray(kernels[role].bias, t)
    return mha


class FlaxMHA(JaxModuleCore):
    name = "flax.mha"
    compile_path = "XLA"  # its kernels are XLA's code, as jax.jit's, jax.nn's and Flax's
    framework = "flax"
    array_library = "jax"  # the sweep's matmul peak and memory method
    features = FEATURES
    mask_forms = MASK_FORMS
    # The +weights name always sows, so a sweep (which asks for no weights) times the path
    # its name says.
    returns_weights = False
    contracts = (Contract("agrees_with_weights_path", "agrees", {"returns_weights": True},
                          "the fused path computes what the explicit path (sow_weights=True) "
                          "does"),)
    # More constructor arguments for the module: a subclass sets one option, e.g.
    # ``module_kwargs = {"precision": jax.lax.Precision.HIGHEST}`` (the weights still go in
    # canonically).
    module_kwargs: Dict[str, Any] = {}
    deviations = {
        "fully_masked_rows": Deviation(
            "mean_values", "a query row with no key to attend gives the mean of the values "
                           "(uniform weights), not a zero head output: the fused path is "
                           "jax.nn.dot_product_attention's, the explicit path fills masked "
                           f"logits with finfo.min (measured, flax {flax.__version__})"),
        "nan_padding": Deviation(
            "confined", "NaN in a masked value position gives NaN rows: the masked weight is "
                        f"0 and 0 * NaN is NaN in weights @ v (measured, flax {flax.__version__})"),
        "float32_dots": tf32_on_gpu("the module's float32 dots (projections and attention)"),
    }

    def framework_version(self) -> str:
        return flax.__version__

    def dtypes(self, device: str) -> Sequence[str]:
        return [t for t in JAX_DTYPES
                if t != "float64" and _usable(device, t, self.returns_weights)]

    def module_mask(self, problem: Problem) -> adapters.MaskParts:
        """``mask`` (B, H|1, L, S), True = attend, and top-left causal as ``is_causal``; a
        requested mask form as the module takes it."""
        p = problem
        parts = adapters.split_mask(p, true_means="attend", key_padding=False,
                                    native_causal=("top_left",), per_head=True)
        if parts.bias is not None:
            raise Unsupported("nnx.MultiHeadAttention takes no additive bias")
        if adapters.requested_form(p):  # the mask form asked for, as the module takes it
            causal = "causal_flag" in adapters.form_parts(p.mask_form)
            parts = dataclasses.replace(parts, mask=adapters.form_mask(p).attn,
                                        causal="top_left" if causal else None)
        return parts

    def build(self, problem: Problem, dtype: str) -> Tuple[Any, Any]:
        """The module split into its graph (static) and its state (the parameters; in
        training mode also its ``dropout`` rng stream, seeded for this draw)."""
        p, train = problem, dropout_options(self, problem)
        if train:
            train["rngs"] = nnx.Rngs(0, dropout=dropout_seed(self, p))
        return nnx.split(build_module(p, dtype, **{**train, **self.module_kwargs}))

    def read_weights(self, params) -> Dict[str, np.ndarray]:
        """The ``LinearGeneral`` kernels and biases of the state ``build`` made -> canonical
        names (the inverse of ``build_module``'s loading)."""
        return self.weight_grads(params)

    def call(self, graphdef, params, query, key, value, mask, need_weights):
        mha = nnx.merge(graphdef, params)
        causal = mask.causal == "top_left"
        if not need_weights:
            return mha(query, key, value, mask=mask.mask, is_causal=causal)
        # nnx.capture collects what the module sows (flax's way to read intermediates).
        out, sown = nnx.capture(mha, nnx.Intermediate)(query, key, value, mask=mask.mask,
                                                       is_causal=causal, sow_weights=True)
        (weights,) = sown["attention_weights"].get_value()  # sown once: (B, H, L, S)
        return out, weights

    def weight_grads(self, grads) -> Dict[str, np.ndarray]:
        """``LinearGeneral`` kernel and bias gradients -> canonical names."""
        return adapters.grads_from_einsum({
            role: adapters.Param(_np(grads[attr]["kernel"].get_value()),
                                 _np(grads[attr]["bias"].get_value())
                                 if "bias" in grads[attr] else None)
            for role, attr in zip("qkvo", ("query", "key", "value", "out"))})


class FlaxMHAWeights(FlaxMHA):
    name = "flax.mha+weights"
    features = FEATURES | {"weights"}
    contracts = ()
    returns_weights = True


class FlaxLinenFp32Softmax(JaxModuleCore):
    """``flax.linen.MultiHeadDotProductAttention(force_fp32_for_softmax=True)``: linen's
    explicit path (``dot_product_attention_weights``: einsum, ``finfo.min`` fill, softmax),
    with the softmax computed in float32 where the module's dtype is narrower. The option
    exists in flax.linen only (nnx's attention functions do not take it); flax 0.8.3-0.8.4
    accepted it and ignored it, so its contract runs the module with it off beside it on the
    same problems. No causal flag (the causal mask is folded into ``mask``), no GQA, no
    bias input; ``use_bias`` is all or nothing."""

    name = "flax.linen[fp32_softmax]"
    compile_path = "XLA"  # its kernels are XLA's code, as jax.jit's, jax.nn's and Flax's
    layers = EINSUM_LAYERS  # DenseGeneral kernels: read back by read_weights
    framework = "flax"
    array_library = "jax"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "cross",
                          "dropout"})
    force_fp32_for_softmax = True
    deviations = FlaxMHA.deviations
    # A path of linen's explicit attention: the families its softmax changes (dropout
    # follows that softmax), and the contract that the option changes it.
    families = frozenset({"masking", "numerics", "shapes", "contracts", "dropout"})
    contracts = (Contract(
        "fp32_softmax", "closer_to_oracle", {"force_fp32_for_softmax": False},
        "force_fp32_for_softmax=True: the softmax of bfloat16 or float16 logits runs in "
        "float32 (flax 0.8.3-0.8.4 accepted the option and ignored it)",
        dtypes=frozenset({"bfloat16", "float16"}), where=Where(versions={"flax": ">=0.8.3"})),)

    def framework_version(self) -> str:
        return flax.__version__

    def dtypes(self, device: str) -> Sequence[str]:
        return [t for t in JAX_DTYPES if t != "float64" and probes.usable(
            f"flax.linen dtype:{self.name}:{device}:{t}", f"a {t} {self.name} call on {device}",
            lambda t=t: _probe(type(self)(), device, t))]

    def build(self, problem: Problem, dtype: str) -> Tuple[Any, Any]:
        import flax.linen as linen

        p, w, t = problem, problem.weights, JAX_DTYPES[dtype]
        if p.K != p.H:
            raise Unsupported("linen's MultiHeadDotProductAttention has no GQA")
        present = [b is not None for b in (w.b_q, w.b_k, w.b_v, w.b_o)]
        if any(present) and not all(present):
            raise Unsupported("flax's use_bias is all or nothing: the problem has only some "
                              "biases")
        module = linen.MultiHeadDotProductAttention(**{
            "num_heads": p.H, "qkv_features": p.H * p.D, "out_features": p.E, "dtype": t,
            "param_dtype": t, "use_bias": all(present), "dropout_rate": 0.0,
            "deterministic": True, "force_fp32_for_softmax": self.force_fp32_for_softmax,
            **dropout_options(self, p)})
        params = self.einsum_params(p, dtype)  # q/k/v (E, H, D), o (H, D, E)
        if p.dropout is not None:  # this draw's key: an argument of the compiled call
            params[DROPOUT_KEY] = jax.random.key(dropout_seed(self, p))
        return module, params

    def call(self, module, params, query, key, value, mask, need_weights):
        params = dict(params)
        rng = params.pop(DROPOUT_KEY, None)
        return module.apply({"params": params}, query, key, value, mask=mask.mask,
                            rngs=None if rng is None else {"dropout": rng})


def _probe(impl: Any, device: str, dtype: str) -> None:
    from suite.spec.problem import make_problem

    impl.run(impl.prepare(make_problem(0, B=1, L=3, E=8, H=2), device, dtype))


def _usable(device: str, dtype: str, sow_weights: bool) -> bool:
    """Whether a tiny call runs in this dtype (the fused path has no float16 dot on the CPU
    in XLA); probed once per process and cached on disk per library versions."""
    def probe() -> None:
        from suite.spec.problem import make_problem

        impl = FlaxMHAWeights() if sow_weights else FlaxMHA()
        state = impl.prepare(make_problem(0, B=1, L=3, E=8, H=2), device, dtype,
                             need_weights=sow_weights)
        impl.run(state)
        impl.synchronize(state)

    return probes.usable(f"flax.mha dtype:{device}:{dtype}:{sow_weights}",
                         f"a {dtype} flax MultiHeadDotProductAttention call on {device}", probe)
