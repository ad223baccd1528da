"""The JAX adapter: device placement, projections, mask translation, jit + compile, gradients.

JAX dispatches asynchronously (on CPU too), so ``run`` keeps its output in the
state and ``synchronize`` blocks on it: a timer that skipped it would time the
dispatch only. Compilation happens in ``prepare`` (``jit(...).lower(...).compile()``)
and its seconds go to ``state["compile_s"]``; executables are cached per shape.

A JAX kernel that only computes attention subclasses ``JaxCore`` and writes
``attend`` (traced under jit), with the signature the NumPy and torch cores share::

    import jax, jax.numpy as jnp
    from implementations.jax_common import JaxCore

    class MyKernel(JaxCore):
        name = "mine.jax"

        def attend(self, q, k, v, mask, scale, need_weights):
            # q (B, H, L, D); k, v (B, H, S, D); mask: a suite.adapters.AttendMask of jax
            # arrays, mask.bias (B, H|1, L, S) with -inf where masked, or None.
            s = q @ k.swapaxes(-1, -2) * scale
            if mask.bias is not None:
                s = s + mask.bias
            return jax.nn.softmax(s, axis=-1) @ v, None  # heads (B, H, L, D), no weights
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from suite import cache
from suite.adapters import AttendMask, attend_mask
from suite.plugin import Implementation, Result
from suite.problem import Problem, cotangent

cache.enable_compile_caches()  # executables persist in the user's cache: compile once

JAX_DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}


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
    except RuntimeError:  # no GPU backend
        return 0


def zero_dead_values(v, dead):
    """Zero value rows no query may attend (0 * NaN is NaN); v may have K < H heads."""
    if dead is None:
        return v
    if dead.shape[1] not in (1, v.shape[1]):
        B, H, S, _ = dead.shape
        dead = dead.reshape(B, v.shape[1], H // v.shape[1], S, 1).all(axis=2)  # (B, K, S, 1)
    return jnp.where(dead, 0, v)


class JaxCore(Implementation):
    """Projections and heads in jnp under jax.jit; subclasses supply ``attend``."""

    framework = "jax"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale", "grad"})
    repeat_kv = True  # False: ``attend`` takes K kv heads itself

    def __init__(self) -> None:
        self._cache: Dict[Tuple, Any] = {}

    def framework_version(self) -> str:
        return jax.__version__

    def fresh(self) -> JaxCore:
        jax.clear_caches()  # a repeated run traces and compiles again
        return type(self)()

    def devices(self) -> List[str]:
        return ["cpu", *(f"cuda:{i}" for i in range(gpu_count()))]

    def dtypes(self, device: str) -> Sequence[str]:
        return ("float32", "float16", "bfloat16")

    def attend(self, q, k, v, mask: AttendMask, scale: float, need_weights: bool):
        """q (B, H, L, D), k/v (B, H, S, D) -> (heads (B, H, L, D), weights or None)."""
        raise NotImplementedError

    def forward(self, x: Dict[str, Any], mask: AttendMask, shape: Tuple, scale: float):
        B, L, S, H, K, D = shape

        def proj(inp, w, b):
            y = inp @ w
            return y if b is None else y + b

        q = proj(x["query"], x["w_q"], x["b_q"]).reshape(B, L, H, D).transpose(0, 2, 1, 3)
        k = proj(x["key"], x["w_k"], x["b_k"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)
        v = proj(x["value"], x["w_v"], x["b_v"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)
        if self.repeat_kv and K != H:  # query head h reads kv head h // (H // K)
            k = jnp.repeat(k, H // K, axis=1)  # (B, H, S, D)
            v = jnp.repeat(v, H // K, axis=1)  # (B, H, S, D)
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
        mask = attend_mask(p, put_float=put, put_bool=lambda a: put(a, bool))
        shape = (p.B, p.L, p.S, p.H, p.K, p.D)
        scale = p.effective_scale
        g = put(cotangent(p)) if grad else None
        # The arrays go through jit as arguments; the rest of the mask is static.
        static = {k: getattr(mask, k) for k in ("causal_only", "kinds", "causal_align",
                                                "form_name")}
        dyn_mask = {k: getattr(mask, k) for k in ("bias", "allowed", "dead_keys", "form")}

        def fwd(x, dyn):
            return self.forward(x, AttendMask(**dyn, **static), shape, scale)

        if grad:
            def fn(x, dyn, g):
                out, vjp = jax.vjp(lambda xx: fwd(xx, dyn), x)
                return out, vjp(g)[0]
            args = (x, dyn_mask, g)
        else:
            fn, args = fwd, (x, dyn_mask)
        key = (type(self), device, dtype, shape, scale, grad, tuple(sorted(static["kinds"])),
               static["causal_align"], static["form_name"],
               tuple((k, None if v is None else v.shape) for k, v in sorted(dyn_mask.items())
                     if k != "form"),
               tuple((k, v is None) for k, v in sorted(x.items())))
        compile_s = 0.0
        if key not in self._cache:
            start = time.perf_counter()
            self._cache[key] = jax.jit(fn).lower(*args).compile()
            compile_s = time.perf_counter() - start
        return {"exe": self._cache[key], "args": args, "grad": grad, "out": None,
                "compile_s": compile_s}

    def run(self, state: Dict[str, Any]):
        state["out"] = state["exe"](*state["args"])
        return state["out"]

    def synchronize(self, state: Dict[str, Any]) -> None:
        jax.block_until_ready(state["out"])

    def fetch(self, state: Dict[str, Any], handle) -> Result:
        if state["grad"]:
            out, grads = handle
            return Result(_np(out), None, {n: _np(g) for n, g in grads.items() if g is not None})
        return Result(_np(handle))


def _np(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a, dtype=jnp.float32)).astype(np.float64)


def masked_softmax(s):
    """Softmax over the last axis in float32; a row with no finite logit gives zeros."""
    s = s.astype(jnp.float32)
    top = jnp.max(s, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    e = jnp.exp(s - top)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(total > 0, total, 1.0)
