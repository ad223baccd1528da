"""The JAX adapter: device placement, projections, mask translation, jit + compile, gradients.

JAX dispatches asynchronously (on CPU too), so ``run`` keeps its output in the
state and ``synchronize`` blocks on it: a timer that skipped it would time the
dispatch only. Compilation happens in ``prepare`` (``jit(...).lower(...).compile()``)
and its seconds go to ``state["compile_s"]``; executables are cached per shape.

A JAX kernel that only computes attention subclasses ``JaxCore`` and writes
``attend`` (traced under jit), with the signature the NumPy and torch cores share::

    import jax, jax.numpy as jnp
    from implementations.jax.common import JaxCore

    class MyKernel(JaxCore):
        name = "mine.jax"

        def attend(self, q, k, v, mask, scale, need_weights):
            # q (B, H, L, D); k, v (B, H, S, D); mask: a suite.plugins.adapters.AttendMask of jax
            # arrays, mask.bias (B, H|1, L, S) with -inf where masked, or None.
            s = q @ k.swapaxes(-1, -2) * scale
            if mask.bias is not None:
                s = s + mask.bias
            return jax.nn.softmax(s, axis=-1) @ v, None  # heads (B, H, L, D), no weights

A whole JAX module (a Flax, Equinox or plain-function module with its own projections)
subclasses ``JaxModuleCore`` and writes ``build`` (its static part and parameters for a
problem) and ``call`` (one forward, traced); both cores and the flax and keras-on-jax
built-ins compile through ``compile_once`` and ``with_vjp``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from suite.plugins import adapters, cache, probes
from suite.plugins.adapters import AttendMask, attend_mask
from suite.plugins.conditions import Where
from suite.plugins.declarations import Deviation
from suite.plugins.interface import Implementation, Result, Unsupported
from suite.spec.paging import paged_cache
from suite.spec.problem import Problem, cotangent

cache.enable_compile_caches()  # executables persist in the user's cache: compile once

JAX_DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16,
              # only in JAX's 64-bit mode (JAX_ENABLE_X64=1); otherwise JAX makes it float32
              "float64": jnp.float64}


def tf32_on_gpu(what: str = "its float32 dots") -> Deviation:
    """float32_dots=tf32 on a CUDA device: JAX's default precision (no
    ``jax_default_matmul_precision`` set) runs float32 dots there on TF32 operands."""
    return Deviation("tf32", f"on a GPU {what} run at JAX's default precision, which takes the "
                             "operands as TF32 (measured on an NVIDIA H200, jax 0.11.2: each "
                             "float32 case's error equals the TF32 naive's)",
                     Where(device=frozenset({"cuda"})))


def jax_device(device: str):
    """'cpu', 'cpu-interpret' (a Pallas kernel interpreted), 'cuda:i' or 'tpu:i' -> a jax device."""
    if device in ("cpu", "cpu-interpret"):
        return jax.devices("cpu")[0]
    if device.startswith("cuda:"):
        return jax.devices("gpu")[int(device.split(":")[1])]
    if device.startswith("tpu:"):
        return jax.devices("tpu")[int(device.split(":")[1])]
    raise ValueError(f"device: expected 'cpu' or 'cuda:i', got {device!r}")


def gpu_count() -> int:
    try:
        return len(jax.devices("gpu"))
    except RuntimeError as exc:  # no GPU backend: kept, should a dtype list come back empty
        probes.failed("jax.devices('gpu')", exc)
        return 0


def zero_dead_values(v, dead):
    """Zero value rows no query may attend (0 * NaN is NaN); v may have K < H heads."""
    if dead is None:
        return v
    if dead.shape[1] not in (1, v.shape[1]):
        B, H, S, _ = dead.shape
        dead = dead.reshape(B, v.shape[1], H // v.shape[1], S, 1).all(axis=2)  # (B, K, S, 1)
    return jnp.where(dead, 0, v)


def compile_once(cache: Dict[Tuple, Any], key: Tuple, fn: Callable, args: Sequence[Any]
                 ) -> Tuple[Any, float]:
    """``jax.jit(fn)`` lowered and compiled for ``args`` (untimed, in ``prepare``), kept in
    ``cache`` under ``key``: (the executable, seconds spent compiling, 0.0 when cached)."""
    if key in cache:
        return cache[key], 0.0
    start = time.perf_counter()
    cache[key] = jax.jit(fn).lower(*args).compile()
    return cache[key], time.perf_counter() - start


def with_vjp(output: Callable, argnums: Sequence[int]) -> Callable:
    """``fn(*args, g)`` -> (``output(*args)``, the gradients of sum(output * g) w.r.t.
    ``args[i]`` for i in ``argnums``, a tuple in that order): forward and backward in one
    executable; the other arguments are held constant."""
    def fn(*args_g):
        *args, g = args_g

        def f(*diff):
            full = list(args)
            for i, d in zip(argnums, diff):
                full[i] = d
            return output(*full)

        out, vjp = jax.vjp(f, *(args[i] for i in argnums))
        return out, vjp(g)

    return fn


def run_compiled(state: Dict[str, Any]):
    """Start the executable ``prepare`` compiled on its arguments; the output is kept for
    ``block`` (JAX dispatches asynchronously)."""
    state["out"] = state["exe"](*state["args"])
    return state["out"]


def block(state: Dict[str, Any]) -> None:
    """Wait for the output of ``run_compiled`` (a timer that skipped it would time the
    dispatch only)."""
    jax.block_until_ready(state["out"])


class _Compiled(Implementation):
    """What every JAX adapter shares: devices and dtypes, a per-instance executable cache,
    and ``run``/``synchronize`` on the executable ``prepare`` compiled. JAX dispatches
    asynchronously, so ``run`` keeps its output and ``synchronize`` blocks on it."""

    framework = "jax"

    def __init__(self) -> None:
        self._cache: Dict[Tuple, Any] = {}

    # The array library, shown beside the framework's version ("flax 0.12.8 on jax").
    array_library = "jax"

    def framework_version(self) -> str:
        # a subclass naming another framework (flax, keras, ...) reports that library's version
        return jax.__version__ if self.framework == "jax" else super().framework_version()

    def fresh(self):
        jax.clear_caches()  # a repeated run traces and compiles again
        return type(self)()

    def devices(self) -> List[str]:
        return ["cpu", *(f"cuda:{i}" for i in range(gpu_count()))]

    def dtypes(self, device: str) -> Sequence[str]:
        return ("float32", "float16", "bfloat16")

    def run(self, state: Dict[str, Any]):
        return run_compiled(state)

    def synchronize(self, state: Dict[str, Any]) -> None:
        block(state)


class JaxCore(_Compiled):
    """Projections and heads in jnp under jax.jit; subclasses supply ``attend``."""

    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale", "grad"})
    repeat_kv = True  # False: ``attend`` takes K kv heads itself

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        """q (B, H, L, D), k/v (B, H, S, D) -> (heads (B, H, L, D), weights or None)."""
        raise NotImplementedError

    def attend_in_steps(self, q, k, v, mask: AttendMask, p: Problem):
        """The rows chunk by chunk (``p.steps``, feature ``steps``), each chunk's keys and
        values put in a cache first (appended, or written into a static cache of
        ``p.cache_len`` slots) and its rows given to ``attend_chunk`` with the cache and the
        mask's rows over it (slots not yet written masked): heads (B, H, L, D)."""
        def empty(slots: int):
            return (jnp.zeros(k.shape[:2] + (slots, k.shape[3]), k.dtype),
                    jnp.zeros(v.shape[:2] + (slots, v.shape[3]), v.dtype))

        def append(kc, vc, ks, vs):
            return jnp.concatenate([kc, ks], axis=2), jnp.concatenate([vc, vs], axis=2)

        def write(kc, vc, ks, vs, start: int):
            end = start + ks.shape[2]
            return kc.at[:, :, start:end].set(ks), vc.at[:, :, start:end].set(vs)

        heads = []
        for start, end, kc, vc in adapters.cached_chunks(p, k, v, empty, append, write):
            slots = kc.shape[2]
            allowed = jnp.zeros(mask.allowed.shape[:2] + (end - start, slots), bool)
            allowed = allowed.at[..., :end].set(mask.allowed[:, :, start:end, :end])
            bias = jnp.full(mask.bias.shape[:2] + (end - start, slots), -jnp.inf,
                            mask.bias.dtype).at[..., :end].set(mask.bias[:, :, start:end, :end])
            dead = ~allowed.any(axis=-2)[..., None]  # (B, H|1, slots, 1)
            rows = mask.replace(bias=bias, allowed=allowed, dead_keys=dead, causal_only=False)
            heads.append(self.attend_chunk(q[:, :, start:end], kc, vc, rows,
                                           p.effective_scale, start, end))
        return jnp.concatenate(heads, axis=2)  # (B, H, L, D)

    def attend_chunk(self, q, k, v, mask: AttendMask, scale: float, start: int, end: int):
        """One chunk of ``attend_in_steps``: rows start..end-1 (q (B, H, n, D)) against a cache
        (k, v (B, H|K, slots, D)) whose first ``end`` slots are written; ``mask`` holds those
        rows over the cache. Default: ``attend`` with that mask. -> heads (B, H, n, D)."""
        return self.attend(q, k, v, mask, scale, False)[0]

    def attend_paged(self, q, k_pages, v_pages, block_table, lengths, mask: AttendMask,
                     scale: float, S: int):
        """A paged cache (``suite.spec.paging``, feature ``paged``): q (B, H, L, D), the projected
        pool k_pages/v_pages (N, P, K, D), block_table (B, T) and lengths (B,) int32, S the
        logical cache's slots -> heads (B, H, L, D). Default: the logical cache gathered
        through the table, then ``attend``; a paged kernel reads the pool itself."""
        B, H = q.shape[:2]

        def logical(pages):  # (N, P, K, D) -> (B, K, S, D)
            rows = pages[block_table]  # (B, T, P, K, D)
            rows = rows.reshape(B, -1, *pages.shape[2:])[:, :S]  # (B, S, K, D)
            return rows.transpose(0, 2, 1, 3)

        k, v = logical(k_pages), logical(v_pages)
        if self.repeat_kv and k.shape[1] != H:  # query head h reads kv head h // (H // K)
            k, v = jnp.repeat(k, H // k.shape[1], axis=1), jnp.repeat(v, H // v.shape[1], axis=1)
        return self.attend(q, k, v, mask, scale, False)[0]

    def forward(self, x: Dict[str, Any], mask: AttendMask, shape: Tuple, scale: float,
                problem: Optional[Problem] = None):
        B, L, S, H, K, D = shape

        def proj(inp, w, b):
            y = inp @ w
            return y if b is None else y + b

        q = proj(x["query"], x["w_q"], x["b_q"]).reshape(B, L, H, D).transpose(0, 2, 1, 3)
        if "key_pages" in x:  # a paged cache: the pool's blocks projected (per token)
            N, P = x["key_pages"].shape[:2]
            k_pages = proj(x["key_pages"], x["w_k"], x["b_k"]).reshape(N, P, K, D)
            v_pages = proj(x["value_pages"], x["w_v"], x["b_v"]).reshape(N, P, K, D)
            heads = self.attend_paged(q, k_pages, v_pages, x["block_table"], x["lengths"],
                                      mask, scale, S)  # (B, H, L, D)
            concat = heads.transpose(0, 2, 1, 3).reshape(B, L, H * D)  # (B, L, H*D)
            return proj(concat, x["w_o"], x["b_o"])  # (B, L, E)
        k = proj(x["key"], x["w_k"], x["b_k"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)
        v = proj(x["value"], x["w_v"], x["b_v"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)
        if self.repeat_kv and K != H:  # query head h reads kv head h // (H // K)
            k = jnp.repeat(k, H // K, axis=1)  # (B, H, S, D)
            v = jnp.repeat(v, H // K, axis=1)  # (B, H, S, D)
        if problem is not None and problem.steps is not None:  # chunk by chunk, a cache
            heads = self.attend_in_steps(q, k, v, mask, problem)  # (B, H, L, D)
        else:
            heads, _ = self.attend(q, k, v, mask, scale, False)  # (B, H, L, D)
        concat = heads.transpose(0, 2, 1, 3).reshape(B, L, H * D)  # (B, L, H*D)
        return proj(concat, x["w_o"], x["b_o"])  # (B, L, E)

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if dtype not in JAX_DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(JAX_DTYPES)}, got {dtype!r}")
        p, dev, t = problem, jax_device(device), JAX_DTYPES[dtype]

        def put(a, kind=t):
            return None if a is None else jax.device_put(np.asarray(a).astype(kind), dev)

        x = {"query": put(p.query), "key": put(p.key), "value": put(p.value),
             **{k: put(v) for k, v in p.weights.as_dict().items()}}
        if p.paging is not None:  # a paged cache: the pool and its table replace key and value
            if grad:
                raise Unsupported("gradients through a paged cache: the pool is not the "
                                  "problem's key and value inputs")
            cache = paged_cache(p)
            x.update(key=None, value=None, key_pages=put(cache.key_pages),
                     value_pages=put(cache.value_pages),
                     block_table=put(cache.block_table, np.int32),
                     lengths=put(cache.lengths, np.int32))
        mask = attend_mask(p, put_float=put, put_bool=lambda a: put(a, bool))
        shape = (p.B, p.L, p.S, p.H, p.K, p.D)
        scale = p.effective_scale
        g = put(cotangent(p)) if grad else None
        # The arrays go through jit as arguments; the rest of the mask is static.
        static = {k: getattr(mask, k) for k in ("causal_only", "kinds", "causal_align",
                                                "form_name")}
        dyn_mask = {k: getattr(mask, k) for k in ("bias", "allowed", "dead_keys", "form")}
        # A form's sizes (a window, a chunk) are Python ints the library takes statically.
        form_static = () if mask.form is None else mask.form.static()
        if mask.form is not None:
            dyn_mask["form"] = mask.form._replace(**{n: None for n, _ in form_static})

        def fwd(x, dyn):
            m = AttendMask(**dyn, **static)
            return self.forward(x, m.replace(form=m.form._replace(**dict(form_static)))
                                if form_static else m, shape, scale, p)

        # With gradients: forward + backward of sum(out * g) w.r.t. the inputs and weights x.
        fn, args = (with_vjp(fwd, (0,)), (x, dyn_mask, g)) if grad else (fwd, (x, dyn_mask))
        # (the cap: a kernel that takes one bakes it into its trace, as it does the scale)
        key = (type(self), device, dtype, shape, p.steps, p.cache_len, scale, p.softcap, grad,
               tuple(sorted(static["kinds"])),
               static["causal_align"], static["form_name"], form_static,
               tuple((k, None if v is None else v.shape) for k, v in sorted(dyn_mask.items())
                     if k != "form"),
               tuple((k, None if v is None else v.shape) for k, v in sorted(x.items())))
        exe, compile_s = compile_once(self._cache, key, fn, args)
        return {"exe": exe, "args": args, "grad": grad, "out": None, "compile_s": compile_s}

    def fetch(self, state: Dict[str, Any], handle) -> Result:
        if state["grad"]:
            out, (grads,) = handle
            return Result(_np(out), None, {n: _np(g) for n, g in grads.items() if g is not None})
        return Result(_np(handle))


# linen.MultiHeadDotProductAttention's (and nnx's) projection names (``einsum_params``).
EINSUM_LAYERS = {"q": "query", "k": "key", "v": "value", "o": "out"}


class JaxModuleCore(_Compiled):
    """A whole JAX module (projections included) as a plugin: subclasses write ``build``
    (the module's static part and its parameters for a problem, the canonical weights in
    them) and ``call`` (one forward, traced under ``jax.jit``). Inputs, masks and
    parameters go in as arguments of one executable, compiled in ``prepare``; with
    gradients it also runs the backward of sum(out * cotangent) (``with_vjp``).

    By default the parameters are ``{layers[role]: {"kernel": (in, out), "bias": (out,)}}``
    for the roles q, k, v, o (the layout of Flax's ``nn.Dense``, the canonical one; no
    "bias" entry when the problem has none), and ``weight_grads`` maps gradients of that
    tree back to the canonical names; override both for other layouts.

    The mask reaches ``call`` as ``suite.plugins.adapters.MaskParts`` split with ``mask_split``
    (default: everything in one per-head boolean ``mask``, True = attend) or as
    ``module_mask`` returns it, its arrays as jax arrays (``bias`` in the compute dtype).
    """

    poses_problem = False  # it computes the handed problem

    features = frozenset({"cross", "grad"})  # declare what the module really handles
    layers: Dict[str, str] = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    mask_split: Dict[str, Any] = {"true_means": "attend", "key_padding": False,
                                  "native_causal": (), "per_head": True}
    # Whether ``call`` returns (output, weights) whatever it is asked (a +weights name).
    returns_weights = False

    def build(self, problem: Problem, dtype: str) -> Tuple[Any, Any]:
        """(the module's static part, hashable: closed over by the executable, e.g. a Flax
        linen module; its parameters, a pytree of arrays in ``dtype`` passed as an
        argument). Default: no static part, ``dense_params``."""
        return None, self.dense_params(problem, dtype)

    def dense_params(self, problem: Problem, dtype: str) -> Dict[str, Dict[str, Any]]:
        """The canonical weights as ``nn.Dense`` parameters of the ``layers``: name ->
        {"kernel": (in, out), "bias": (out,)} (no "bias" when the problem has none)."""
        t = JAX_DTYPES[dtype]
        return {self.layers[role]: {"kernel": jnp.asarray(param.weight, t),
                                    **({} if param.bias is None
                                       else {"bias": jnp.asarray(param.bias, t)})}
                for role, param in adapters.to_conv1d(problem.weights).items()}

    def einsum_params(self, problem: Problem, dtype: str) -> Dict[str, Dict[str, Any]]:
        """The canonical weights as Flax ``nn.DenseGeneral`` (and Keras ``EinsumDense``)
        parameters of the ``layers``: q/k/v kernels (E, heads, D) with biases (heads, D), the
        output kernel (H, D, E) with bias (E,), as ``linen.MultiHeadDotProductAttention``
        names them with ``layers = EINSUM_LAYERS`` (no "bias" when the problem has none).
        ``read_weights`` and ``weight_grads`` read this layout back by the kernels' rank."""
        t = JAX_DTYPES[dtype]
        p = problem
        return {self.layers[role]: {"kernel": jnp.asarray(param.weight, t),
                                    **({} if param.bias is None
                                       else {"bias": jnp.asarray(param.bias, t)})}
                for role, param in adapters.to_einsum(p.weights, p.H, p.K).items()}

    def _canonical(self, tree: Any) -> Dict[str, np.ndarray]:
        """A tree in the layout of ``dense_params`` (2-d kernels) or ``einsum_params``
        (3-d), read through ``layers`` -> canonical names."""
        per_role = {role: adapters.Param(_np(tree[name]["kernel"]),
                                         _np(tree[name]["bias"]) if "bias" in tree[name]
                                         else None)
                    for role, name in self.layers.items()}
        ranks = {role: param.weight.ndim for role, param in per_role.items()}
        if set(ranks.values()) == {2}:
            return adapters.grads_from_conv1d(per_role)
        if set(ranks.values()) == {3}:
            return adapters.grads_from_einsum(per_role)
        raise ValueError(f"kernels of ranks {ranks}: neither nn.Dense (in, out) nor "
                         "nn.DenseGeneral (E, heads, D) / (H, D, E) throughout")

    def read_weights(self, params: Any) -> Dict[str, np.ndarray]:
        """The canonical weights held in parameters ``params`` (the tree ``build`` made),
        under canonical names: the inverse of ``dense_params`` or ``einsum_params``, read
        through ``layers``. A wrapper with another parameter layout overrides it beside
        ``build`` and ``weight_grads``."""
        return self._canonical(params)

    def check_wrapper(self, problem: Problem) -> List[str]:
        """The wrapper's own translation, before any verdict on the library: the weights
        read back (``read_weights``) from the parameters ``build`` makes for ``problem``
        (float32) must equal the problem's to float32 rounding. Returns what differs
        (empty: the round trip holds); ``Unsupported`` when the wrapper builds its own
        parameter layout and gives no ``read_weights`` the suite could read it with."""
        own = (_overrides(self, "build") or _overrides(self, "dense_params")) \
            and not _overrides(self, "read_weights")
        if own and _overrides(self, "weight_grads"):
            raise Unsupported("build and weight_grads are the wrapper's own (another parameter "
                              "layout) and it gives no read_weights (their inverse)")
        if set(self.layers) != set(adapters.ROLES):
            raise Unsupported(f"layers {self.layers!r} does not name q, k, v and o")
        _, params = self.build(problem, "float32")
        try:
            back = self.read_weights(params)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
            if not own:
                raise
            raise Unsupported(f"build is the wrapper's own and its parameters cannot be read "
                              f"back through layers ({type(exc).__name__}: {exc}); give "
                              f"read_weights") from exc
        return adapters.weight_differences(problem.weights, back, rtol=1e-6, atol=1e-6)

    def check_mask(self, problem: Problem) -> List[str]:
        """The wrapper's own mask translation: the ``MaskParts`` ``module_mask`` hands to
        ``call``, read back by its convention into a (B, H, L, S) allowed matrix and bias,
        must mean the canonical mask of ``problem`` (``suite.plugins.adapters.mask_differences``)."""
        parts = self.module_mask(problem)
        if not isinstance(parts, adapters.MaskParts):
            raise Unsupported(f"module_mask returns {type(parts).__name__}, not "
                              f"suite.plugins.adapters.MaskParts: the suite cannot read it back")
        return adapters.mask_differences(problem, parts)

    def call(self, module: Any, params: Any, query, key, value, mask: adapters.MaskParts,
             need_weights: bool):
        """One forward (traced): -> output (B, L, E), or (output, weights (B, H, L, S))."""
        raise NotImplementedError

    def module_mask(self, problem: Problem) -> adapters.MaskParts:
        """The mask as ``call`` receives it, in NumPy (the core moves its arrays)."""
        return adapters.split_mask(problem, **self.mask_split)

    def weight_grads(self, grads: Any) -> Dict[str, np.ndarray]:
        """Gradients of the parameters (the tree ``build`` made) -> canonical names."""
        return self._canonical(grads)

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if dtype not in JAX_DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(JAX_DTYPES)}, got {dtype!r}")
        p, dev, t = problem, jax_device(device), JAX_DTYPES[dtype]
        parts = self.module_mask(p)
        with jax.default_device(dev):
            module, params = self.build(p, dtype)
        params = jax.device_put(params, dev)
        x = [jax.device_put(np.asarray(a).astype(t), dev) for a in (p.query, p.key, p.value)]
        # The mask's arrays go through jit as arguments; its other fields are static.
        arrays = {n: None if getattr(parts, n) is None else jax.device_put(
            np.asarray(getattr(parts, n)).astype(t if n == "bias" else bool), dev)
            for n in ("key_padding", "mask", "bias")}
        static = dataclasses.replace(parts, key_padding=None, mask=None, bias=None)
        weights = need_weights or self.returns_weights

        def fwd(params, q, k, v, arrays):
            return self.call(module, params, q, k, v, dataclasses.replace(static, **arrays),
                             weights)

        fn, args = fwd, (params, *x, arrays)
        if grad:  # the output alone is differentiated (a weights path also returns them)
            fn = with_vjp(lambda *a: fwd(*a)[0] if weights else fwd(*a), (0, 1, 2, 3))
            args = (*args, jax.device_put(cotangent(p).astype(t), dev))
        key = (type(self), device, dtype, p.B, p.L, p.S, p.E, p.H, p.K, static, weights, grad,
               module, jax.tree_util.tree_structure(params),
               tuple(a.shape for a in jax.tree_util.tree_leaves(params)),
               tuple((n, None if a is None else a.shape) for n, a in arrays.items()))
        exe, compile_s = compile_once(self._cache, key, fn, args)
        return {"exe": exe, "args": args, "out": None, "grad": grad, "compile_s": compile_s}

    def fetch(self, state: Dict[str, Any], handle) -> Result:
        if state["grad"]:
            out, (g_params, *g_inputs) = handle
            grads = self.weight_grads(g_params)
            grads.update(zip(("query", "key", "value"), map(_np, g_inputs)))
            return Result(_np(out), None, grads)
        out, weights = handle if isinstance(handle, tuple) else (handle, None)
        return Result(_np(out), None if weights is None else _np(weights))


def _overrides(impl: Any, name: str) -> bool:
    """Whether ``impl``'s class replaces ``JaxModuleCore``'s method ``name``."""
    return getattr(type(impl), name) is not getattr(JaxModuleCore, name)


def _np(a) -> np.ndarray:
    """A result as float64 NumPy: by way of float32 (NumPy has no bfloat16), unless it is
    float64 already (JAX's 64-bit mode)."""
    a = jnp.asarray(a)
    if a.dtype == jnp.float64:
        return np.asarray(a)
    return np.asarray(a.astype(jnp.float32)).astype(np.float64)


def masked_softmax(s):
    """Softmax over the last axis in float32; a row with no finite logit gives zeros."""
    s = s.astype(jnp.float32)
    top = jnp.max(s, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    e = jnp.exp(s - top)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(total > 0, total, 1.0)
