"""jax.nn: ``jax.nn.dot_product_attention`` (layout (B, T, N, H)), and its cudnn variant.

The canonical mask goes in as its users call it: key padding (B,) as
``key_value_seq_lengths``, beside ``is_causal`` (top left: query i sees keys j <= i) or a
boolean ``mask`` for the rest (``LENGTH_FORMS``); a mask with no key padding, or with a
bias, as its ``mask`` (True = attend, like ours) plus ``bias``; top-left causal alone as
``is_causal``. GQA is native: it takes K kv heads.

Inference forms. A decode step (one row at its offset in a cache) is the cache's length:
the row sees keys j <= offset, so ``key_value_seq_lengths`` = min(length, offset + 1) says
it all. Rows at an offset (a few rows, a chunk of prefill) have no argument of their own:
``is_causal`` and ``local_window_size`` are aligned at query 0 and take no offset, so the
causality at the offset (and a window) goes in as ``mask`` beside the lengths, as a user
builds it from positions. Generation steps (``steps``) run against a cache the adapter keeps
(appended, or a static one with ``key_value_seq_lengths`` = the slots written), each step's
rows called as above; the prefill takes ``is_causal`` (and a window form's
``local_window_size``). A packed batch has no argument either (no segment ids): its
block-diagonal ``mask``, as Flax's ``make_attention_mask`` builds it. ``query_seq_lengths``
is never chosen here: no problem says its rows are padding (a row without keys is the mask's
doing, and what the library answers there is the measurement, ``fully_masked_rows``); the
mask_forms family reaches it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from implementations.jax.common import JaxCore, gpu_count, tf32_on_gpu
from suite.plugins import adapters, cache, probes
from suite.plugins.declarations import Deviation
from suite.plugins.interface import Unavailable, Unsupported
from suite.spec.problem import Problem

# Mask forms jax.nn.dot_product_attention takes: ``mask`` and ``bias`` broadcastable to
# (B, N, T, S) (fewer than 4 dimensions are expanded on the left), is_causal beside them,
# and query_seq_lengths / key_value_seq_lengths (B,), and a sliding window as its
# local_window_size=(left, right) (the xla implementation; top left: query i sits at key i).
JAX_NN_FORMS = frozenset(
    {f"{kind}_{shape}" for kind in ("bool", "float")
     for shape in ("BHLS", "B1LS", "11LS", "B11S", "BHL1", "LS")}
    | {"kv_lengths", "kv_lengths+bool_B1LS", "q_lengths", "q_lengths+kv_lengths",
       "causal_flag", "causal_flag+bool_B11S", "causal_flag+kv_lengths", "local_window",
       "local_window+kv_lengths", "local_window+causal_flag"})


# The keyword of jax.nn.dot_product_attention each form part needs (the others take only its
# mask, bias and is_causal): jax added them over its releases (the sequence lengths after
# 0.4.31, local_window_size later), so the forms declared are those the installed
# signature takes, read from it, never from a version number.
FORM_KEYWORDS = {"kv_lengths": "key_value_seq_lengths", "q_lengths": "query_seq_lengths",
                 "local_window": "local_window_size"}


def keywords() -> frozenset:
    """The keyword parameters of the installed jax.nn.dot_product_attention (none: absent)."""
    fn = getattr(jax.nn, "dot_product_attention", None)
    if not callable(fn):
        return frozenset()
    return frozenset(inspect.signature(fn).parameters)


def forms_taken(params: frozenset) -> frozenset:
    """The forms of ``JAX_NN_FORMS`` whose every part the signature ``params`` takes."""
    return frozenset(f for f in JAX_NN_FORMS
                     if all(FORM_KEYWORDS[part] in params
                            for part in adapters.form_parts(f) if part in FORM_KEYWORDS))


# The forms a problem with key lengths (B,) goes in as outside the mask_forms family, the
# first that expresses it: the lengths alone, beside is_causal, beside a boolean mask.
LENGTH_FORMS = ("kv_lengths", "causal_flag+kv_lengths", "kv_lengths+bool_B1LS")


def as_lengths(problem: Problem, taken: frozenset) -> Optional[Problem]:
    """``problem`` asking for the first of ``LENGTH_FORMS`` in ``taken`` that expresses it,
    its key padding as ``key_value_seq_lengths``; a decode step (one row at each batch's
    offset) as the cache's length min(length, offset + 1). None: no key lengths (B,), or
    no such form holds the rest of its mask (a bias, a mask that varies over heads)."""
    m = problem.mask
    lens = m.valid_lens
    if lens is not None and np.ndim(lens) != 1:
        return None
    if m.query_offset is not None and problem.L == 1:  # the row sees keys j <= offset
        upto = np.asarray(m.query_offset) + 1
        lens = upto if lens is None else np.minimum(lens, upto)
        problem = dataclasses.replace(problem, mask=dataclasses.replace(
            m, valid_lens=lens, causal=False, query_offset=None))
    if lens is None:
        return None
    for form in LENGTH_FORMS:
        if form in taken:
            try:
                adapters.form_mask(problem, form)
            except Unsupported:  # the rest of the mask has no place in this form
                continue
            return adapters.with_form(problem, form)
    return None


class JaxNN(JaxCore):
    name = "jax.nn"
    compile_path = "XLA"  # its kernels are XLA's code, as jax.jit's, jax.nn's and Flax's
    repeat_kv = False
    # Inference forms (module docstring): offsets and packed rows through its mask, key
    # lengths and caches through key_value_seq_lengths; a static cache needs that keyword
    # (jax 0.4.31's signature has none: its static-cache steps are unsupported, not errors).
    features = JaxCore.features | {"decode", "packed", "steps"} | (
        {"static_cache"} if "key_value_seq_lengths" in keywords() else set())
    implementation = None  # let jax choose ("xla" on CPU)
    mask_forms = forms_taken(keywords())
    deviations = {
        "fully_masked_rows": Deviation(
            "mean_values", "a query row with no key to attend gives the mean of the values "
                           f"(uniform weights), not a zero head output (measured, jax "
                           f"{jax.__version__})"),
        "nan_padding": Deviation(
            "confined", "NaN in a masked value position gives NaN rows: the masked weight is "
                        "0 and 0 * NaN is NaN in weights @ v (measured by calling "
                        f"jax.nn.dot_product_attention directly, jax {jax.__version__})"),
        "bias_masked_rows": Deviation(
            "nan", "a row whose every key a -inf bias masks gives NaN: the bias is added to "
                   "the logits and the softmax of a row of -inf is NaN, while a row its "
                   "boolean mask empties gives the mean of the values (measured, tiles and "
                   f"special_values cases, jax {jax.__version__})"),
        "float32_dots": tf32_on_gpu("jax.nn.dot_product_attention's float32 dots"),
    }

    def __init__(self) -> None:
        super().__init__()
        if not callable(getattr(jax.nn, "dot_product_attention", None)):
            raise Unavailable(f"jax {jax.__version__} has no jax.nn.dot_product_attention "
                              "(it arrived in jax 0.4.31)")
        # GQA by the layout the spec gives (K kv heads, query head h reads kv head h // G):
        # a jax that refuses that call leaves GQA undeclared, its cases unsupported.
        if self.implementation is None and not cache.memo(
                "jax.nn gqa:cpu", functools.partial(_probe_gqa, self.implementation)):
            self.features = self.features - {"gqa"}
        if x64():
            self.deviations = float64_deviations(self.deviations)

    def dtypes(self, device: str) -> Sequence[str]:
        # float64 only in JAX's 64-bit mode (JAX_ENABLE_X64=1: process-wide, so a run of its
        # own, as nox -s check_full runs it); otherwise JAX computes float64 arrays in float32.
        extra = ("float64",) if device == "cpu" and x64() else ()
        return [t for t in (*super().dtypes(device), *extra)
                if _usable(device, t, self.implementation)]

    def prepare(self, problem: Problem, device: str, dtype: str, **kw):
        # Key lengths as its lengths argument, unless the mask_forms family asks for a form.
        if adapters.requested_form(problem) is None and problem.steps is None:
            problem = as_lengths(problem, self.mask_forms) or problem
        return super().prepare(problem, device, dtype, **kw)

    def attend_chunk(self, q, k, v, mask, scale, start, end):
        """One generation step (``attend_in_steps``) as a jax.nn user calls it: a static
        cache's written slots as ``key_value_seq_lengths``; the prefill (start 0) with
        ``is_causal`` (and a window form's ``local_window_size``); rows at an offset, or a
        window past the prefill, with the rows' ``mask`` (neither flag takes an offset); a
        single row sees every slot written (the lengths alone)."""
        q, k, v = q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)  # (B, n|slots, H|K, D)
        B, n, slots = q.shape[0], q.shape[1], k.shape[1]
        kw = {"scale": scale, "implementation": self.implementation}
        if slots > end:  # a static cache: the slots written so far
            kw["key_value_seq_lengths"] = jnp.full((B,), end, jnp.int32)
        window = mask.form.window if mask.form_name else None
        if start == 0 and window is not None:  # the prefill, its window as its sizes
            kw.update(is_causal=True, local_window_size=window)
        elif "bool_mask" in mask.kinds or (n > 1 and start > 0):
            kw["mask"] = mask.allowed  # (B, 1, n, slots): causal at the offset, the window
        elif n > 1:
            kw["is_causal"] = True  # the prefill: top left is its positions
        out = jax.nn.dot_product_attention(q, k, v, **kw)  # (B, n, H, D)
        return out.swapaxes(1, 2)  # (B, H, n, D)

    def attend(self, q, k, v, mask, scale, need_weights):
        # Values go in untouched: what the library does with NaN padding is the measurement.
        q, k, v = q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)  # (B, L|S, H|K, D)
        kw = {"scale": scale, "implementation": self.implementation}
        if mask.form_name:  # the mask form asked for, as the library takes it
            return _form_call(q, k, v, mask, kw), None
        if mask.causal_only:
            kw["is_causal"] = True
        elif mask.bias is not None:
            kw["mask"] = mask.allowed  # True = attend, as ours
            kw["bias"] = jnp.where(mask.allowed, mask.bias, 0).astype(q.dtype)
        out = jax.nn.dot_product_attention(q, k, v, **kw)  # (B, L, H, D)
        return out.swapaxes(1, 2), None  # (B, H, L, D)


def _form_call(q, k, v, mask, kw):
    """jax.nn.dot_product_attention with the form's parts as its own arguments."""
    form = mask.form
    if form.attn is not None:
        # A boolean form is its ``mask`` (True = attend); a float form its ``bias``.
        kw["mask" if form.attn.dtype == jnp.bool_ else "bias"] = form.attn
    kw["is_causal"] = "causal_flag" in adapters.form_parts(mask.form_name)
    # Only the keywords the form has: a jax before them takes no such keyword at all.
    if form.kv_lengths is not None:
        kw["key_value_seq_lengths"] = form.kv_lengths
    if form.q_lengths is not None:
        kw["query_seq_lengths"] = form.q_lengths
    if form.window is not None:
        kw["local_window_size"] = form.window  # (left, right), Python ints
    out = jax.nn.dot_product_attention(q, k, v, **kw)  # (B, L, H, D)
    return out.swapaxes(1, 2)  # (B, H, L, D)




class JaxNNCudnn(JaxNN):
    name = "jax.nn[cudnn]"
    implementation = "cudnn"
    features = JaxNN.features - {"bool_mask", "valid_lens", "causal_bottom_right", "grad",
                                 "decode", "packed", "steps", "static_cache"}
    # cudnn takes no boolean mask, and a window only as a left size beside causal
    # (local_window_size's right side must be 0 without it): not declared, unverified here.
    # Its sequence lengths (a padding mask type) would take a decode step; unverified too.
    mask_forms = frozenset({"causal_flag"})

    def devices(self) -> List[str]:
        return [f"cuda:{i}" for i in range(gpu_count())]

    def dtypes(self, device: str) -> Sequence[str]:
        return ("float16", "bfloat16")


def x64() -> bool:
    """Whether JAX runs in its 64-bit mode (``jax_enable_x64``, ``JAX_ENABLE_X64=1``)."""
    return bool(jax.config.jax_enable_x64)


def float64_deviations(table):
    """``table`` with what jax.nn does in float64 (JAX's 64-bit mode): its XLA path casts the
    logits to float32 for the softmax ("Softmax and it is always carried out in fp32",
    ``_dot_product_attention_core``) and the weights back, the float64_softmax policy (a row
    with no key still gives the mean of the values, as in the other dtypes: measured)."""
    return {**table, "float64_softmax": Deviation(
        "float32", "the softmax of jax.nn.dot_product_attention's XLA path runs in float32 for "
                   "float64 inputs (the logits cast to float32, the weights back to float64; "
                   f"measured, jax {jax.__version__})")}


def _usable(device: str, dtype: str, implementation) -> bool:
    """Whether a tiny call runs in this dtype (float16 does not on the CPU: XLA has no
    F16_F16_F32 dot there, measured with jax 0.10); probed once per process and cached on
    disk per library versions."""
    return probes.usable(f"jax.nn dtype:{device}:{dtype}:{implementation}",
                         f"a {dtype} jax.nn.dot_product_attention(implementation="
                         f"{implementation!r}) call on {device}",
                         functools.partial(_probe_dtype, device, dtype, implementation))


def _probe_dtype(device: str, dtype: str, implementation) -> None:
    from implementations.jax.common import JAX_DTYPES, jax_device

    q = jax.device_put(jnp.zeros((2, 5, 2, 4), JAX_DTYPES[dtype]), jax_device(device))
    call = jax.jit(lambda x: jax.nn.dot_product_attention(x, x, x,
                                                          implementation=implementation))
    jax.block_until_ready(call(q))  # under jit, as the plugin runs it


def _probe_gqa(implementation) -> bool:
    """Whether a tiny GQA call (4 query heads, 2 kv heads, layout (B, T, N, D)) runs on the
    CPU under jit (jax 0.4.31 raised on it: it wanted another query layout)."""
    def probe() -> None:
        q = jnp.zeros((1, 5, 4, 8), jnp.float32)  # (B, L, H, D)
        kv = jnp.zeros((1, 5, 2, 8), jnp.float32)  # (B, S, K, D)
        call = jax.jit(lambda a, b: jax.nn.dot_product_attention(a, b, b,
                                                                 implementation=implementation))
        jax.block_until_ready(call(q, kv))

    # a failure means GQA does not run in this layout here; kept with its exception
    return probes.why_not(f"a GQA jax.nn.dot_product_attention(implementation="
                          f"{implementation!r}) call", probe) is None


def backend_variants() -> List[type]:
    """jax.nn[cudnn] where a GPU and a probe call work; nothing on CPU."""
    if not gpu_count():
        return []
    try:
        q = jnp.zeros((1, 8, 2, 64), jnp.float16, device=jax.devices("gpu")[0])
        jax.block_until_ready(jax.nn.dot_product_attention(q, q, q, implementation="cudnn"))
    except Exception as exc:  # cudnn absent or too old: the variant is not registered
        probes.failed("a cudnn jax.nn.dot_product_attention call", exc)
        return []
    return [JaxNNCudnn]


