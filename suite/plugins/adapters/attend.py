"""The mask as the adapter cores hand it to a kernel: ``AttendMask`` (``attend_mask``), one
signature ``attend(q, k, v, mask, scale, need_weights)`` for the NumPy, torch and JAX cores,
and the score variants beside it (``score_variants``)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Optional

import numpy as np

from suite.plugins.adapters.forms import FormMask, form_mask, requested_form
from suite.plugins.adapters.masks import split_mask
from suite.spec.problem import VARIANT_FIELDS, Problem
from suite.spec.variants import Alibi, RelBias, ScoreMod


@dataclasses.dataclass
class AttendMask:
    """The mask as an attention kernel's ``attend(q, k, v, mask, scale, need_weights)``
    receives it from the adapter cores (``implementations.numpy.mha.NumpyCore``,
    ``torch_common.TorchCore``, ``jax_common.JaxCore``), in the core's array type; every
    array part is None for an unmasked problem.

    bias: float (B, H|1, L, S): the additive bias with -inf where not allowed;
    allowed: bool (B, H|1, L, S), True = may attend;
    dead_keys: bool (B, H|1, S, 1): keys no query may attend (padding may hold NaN there),
        or None when every key is read by some query;
    causal_only: the whole mask is top-left causal (a native ``is_causal`` flag suffices);
    kinds: the canonical mask's kinds (``Mask.kinds``); causal_align its alignment;
    variants: the problem's score variants (``ScoreVariants``), or None without any.
    """

    bias: Any = None
    allowed: Any = None
    dead_keys: Any = None
    causal_only: bool = False
    kinds: frozenset = frozenset()
    causal_align: str = "top_left"
    # The mask form asked for (``requested_form``) and its arrays (``form_mask``, True =
    # attend, -inf fill, in the kernel's array type), or "" and None.
    form_name: str = ""
    form: Optional[FormMask] = None
    variants: Optional[ScoreVariants] = None
    # A packed batch's sequence ids, int (B, L) NumPy (``Mask.segments``; already in
    # ``bias``/``allowed``): for a kernel that packs natively (document masks, jagged
    # tensors, cumulative lengths); None for an unpacked problem.
    segments: Optional[np.ndarray] = None
    # The decode form's per-batch positions, int (B,) NumPy (``Mask.query_offset``; already
    # in ``bias``/``allowed``), and key lengths, int (B,) or (B, L) NumPy (``Mask.valid_lens``):
    # for a kernel that takes a cache's offsets and lengths itself (a block mask reading
    # them); None where the problem has none.
    query_offset: Optional[np.ndarray] = None
    valid_lens: Optional[np.ndarray] = None
    # Training mode: the probability of dropping each attention weight (``Problem.dropout``,
    # feature ``dropout``); None in eval mode.
    dropout: Optional[float] = None

    def replace(self, **arrays: Any) -> AttendMask:
        return dataclasses.replace(self, **arrays)


@dataclasses.dataclass(frozen=True)
class ScoreVariants:
    """The problem's score variants as ``attend`` receives them (``AttendMask.variants``):
    ``suite.spec.variants``' fields with their arrays in the kernel's array type, dtype and
    device; the kernel computes positions and buckets itself. A core gives None when the
    problem has none; the spec's order is cap, ALiBi and table added, score_mod, mask,
    softmax with the sinks in its denominator."""

    softcap: Optional[float] = None
    alibi: Optional[Alibi] = None  # slopes (H,)
    rel_bias: Optional[RelBias] = None  # table (H, n_buckets)
    score_mod: Optional[ScoreMod] = None
    sinks: Any = None  # (H,)


def score_variants(problem: Problem, put_float: Callable[[np.ndarray], Any] = lambda a: a
                   ) -> Optional[ScoreVariants]:
    """The ``ScoreVariants`` of ``problem`` (None without any); ``put_float`` moves the
    float64 arrays (slopes, table, sinks) into the kernel's array type, dtype and device."""
    p = problem
    if all(getattr(p, n) is None for n in VARIANT_FIELDS):
        return None
    alibi = None if p.alibi is None else dataclasses.replace(
        p.alibi, slopes=put_float(np.asarray(p.alibi.slopes, np.float64)))
    rel = None if p.rel_bias is None else dataclasses.replace(
        p.rel_bias, table=put_float(np.asarray(p.rel_bias.table, np.float64)))
    sinks = None if p.sinks is None else put_float(np.asarray(p.sinks, np.float64))
    return ScoreVariants(p.softcap, alibi, rel, p.score_mod, sinks)


def attend_mask(problem: Problem, put_float: Callable[[np.ndarray], Any] = lambda a: a,
                put_bool: Callable[[np.ndarray], Any] = lambda a: a) -> AttendMask:
    """The ``AttendMask`` of ``problem``; ``put_float``/``put_bool`` move the float64 and
    bool NumPy arrays into the kernel's array type, dtype and device."""
    m = problem.mask
    variants = score_variants(problem, put_float)
    if m.is_empty():
        return AttendMask(causal_align=m.causal_align, variants=variants,
                          dropout=problem.dropout)
    parts = split_mask(problem, key_padding=False, native_causal=())  # everything in "mask"
    dead = parts.dead_keys()
    form_name, form = requested_form(problem) or "", None
    if form_name:
        form = form_mask(problem).map(
            lambda a: put_bool(a) if a.dtype == bool else a if a.dtype.kind == "i"
            else put_float(a))
    return AttendMask(put_float(parts.additive()), put_bool(parts.allowed()),
                      None if dead is None else put_bool(dead), m.kinds == {"causal"},
                      m.kinds, m.causal_align, form_name, form, variants,
                      *(None if a is None else np.asarray(a, np.int64)
                        for a in (m.segments, m.query_offset, m.valid_lens)),
                      dropout=problem.dropout)


def dropout_seed(impl: Any, p: Problem) -> int:
    """The seed of one training-mode call of ``p`` by ``impl`` (a library seeded per call: its
    Dropout layer, a PRNG key, torch's generator): the problem's own (a hash of everything it
    holds, ``suite.spec.oracle.digest``) and the draw's index (the training-mode calls ``impl``
    has made of that problem before), so each call draws a new mask and a run replays its
    draws."""
    from suite.spec.oracle import digest

    key = digest(p)
    draws = impl.__dict__.setdefault("_dropout_draws", {})
    index = draws[key] = draws.get(key, -1) + 1
    h = hashlib.blake2b(f"{key}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") >> 1
