"""The ``mask_forms`` family's cases, declared as data: one case per mask form.

Each case is a canonical problem whose mask the form can express exactly (a 2-D form gets
a mask that is the same for every batch item and head, a key-padding form gets ``valid_lens``
of shape (B,), ...), built from a seed derived from the form's name, so a failing test id
replays the same arrays. The plugin is given the problem in that form
(``suite.plugins.adapters.with_form``): the library broadcasts what the form leaves out, and its
answer is compared with the float64 oracle on the canonical problem.

Sizes: B = 2 and H = 4 (so a (B*H) axis flattened head-major instead of batch-major shows),
L = 9 queries and S = 67 keys (L != S, so a mask read transposed shows; S crosses a 64-key
block). A plugin whose library takes one input for query, key and value
(``kv_source="self"``) gets the square version, L = S = 24.

The window forms (``local_window``, ``chunked_causal`` and their combinations) are longer,
L = 200 queries and S = 300 keys (square: 200), so the window crosses the 128-key blocks of
the kernels that skip blocks (splash, FlexAttention) and the last query block is partial.
The sliding window is asymmetric, (left, right) = (37, 11), so swapped sizes show, and top
left aligned (query i sits at key i whatever L and S: jax.nn's ``local_window_size`` has no
other alignment), so keys past i + 11 of the last query are read by no row. The chunk size,
48, does not divide L: the last chunk (rows 192-199) is partial, and a chunk straddles the
128 boundary. Key lengths beside a window cut inside the last rows' windows (171 and 205)
and leave every row a key.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import List

import numpy as np

from suite.conformance.families.declare import Case
from suite.conformance.judge import Outcome, run_problem
from suite.plugins.adapters import chunked_causal_allowed, form_parts, window_allowed, with_form
from suite.plugins.declarations import MASK_FORMS, WINDOW_FORMS
from suite.plugins.interface import Implementation, declared
from suite.spec.problem import Mask, Problem, make_problem

B, H, E = 2, 4, 16
L, S = 9, 67
SQUARE = 24  # L = S for self-attention plugins
WINDOW_L, WINDOW_S = 200, 300  # the window forms' lengths (square: L = S = WINDOW_L)
WINDOW = (37, 11)  # (left, right): query i attends keys i - 37 .. i + 11
CHUNK = 48  # chunked_causal's chunk size: 200 = 4 * 48 + 8, the last chunk partial
WINDOW_KV_LENGTHS = (171, 205)  # key lengths (B,) beside a window: inside the last windows

# The 4-D pattern of each attention-mask shape (a "1" axis is constant: broadcast).
_PATTERN = {"BHLS": "BHLS", "B1LS": "B1LS", "11LS": "11LS", "B11S": "B11S", "BHL1": "BHL1",
            "LS": "11LS", "BLS": "B1LS", "BHxLS": "BHLS"}


class FormCase(Case):
    """The case of mask form ``form`` (its name): its canonical problem, built from its seed,
    given to the plugin in that form."""

    @property
    def form(self) -> str:
        return self.name

    def problem(self, self_attention: bool = False) -> Problem:
        """The problem (L = S and query = key = value when ``self_attention``)."""
        return build(self.form, self.seed, self_attention).validate()


def _judge(form: str):
    def judge(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
        """The canonical problem ``p`` in form ``form``, against the oracle on ``p``."""
        if form not in declared(impl, "mask_forms"):
            return out.classify("unsupported", f"does not declare mask form {form}")
        return run_problem(impl, out, with_form(p, form))
    return judge


def _case(form: str) -> FormCase:
    return FormCase("mask_forms", form, functools.partial(build, form), MASK_FORMS[form],
                    judge=_judge(form),
                    build_self=functools.partial(build, form, self_attention=True))


def _attn_mask(rng: np.random.Generator, kind: str, shape: str, Lq: int, Sk: int) -> Mask:
    """A random boolean mask or additive bias of the pattern's shape (1 = broadcast axis);
    every query row keeps key 0, except where the key axis is broadcast (whole rows)."""
    dims = tuple({"B": B, "H": H, "L": Lq, "S": Sk, "1": 1}[c] for c in _PATTERN[shape])
    keep = rng.random(dims) < 0.6
    if dims[-1] > 1:
        keep[..., 0] = True  # no empty row: those are the masking family's subject
    else:
        keep.flat[0] = True  # rows masked whole: some rows, not all
    if kind == "bool":
        return Mask(allowed=keep)
    bias = 2.0 * rng.standard_normal(dims)  # a key axis of 1: a per-row shift, softmax-neutral
    return Mask(bias=np.where(keep, bias, -np.inf) if dims[-1] > 1 else bias)


def build(form: str, seed: int, self_attention: bool = False) -> Problem:
    """The canonical problem of mask form ``form`` (see the module docstring)."""
    if form in WINDOW_FORMS:
        return _build_window(form, seed, self_attention)
    rng = np.random.default_rng(seed + 1)
    Lq, Sk = (SQUARE, SQUARE) if self_attention else (L, S)
    parts = form_parts(form)
    mask = Mask()
    attn = [p for p in parts if p.split("_", 1)[0] in ("bool", "float")]
    if attn:
        kind, shape = attn[0].split("_", 1)
        mask = _attn_mask(rng, kind, shape, Lq, Sk)
    if "causal_flag" in parts or "causal_hint" in parts:
        mask = dataclasses.replace(mask, causal=True)
        if "causal_hint" in parts:  # the hint: the attention mask is exactly the causal one
            mask = dataclasses.replace(mask, allowed=None)
    if {"kpm_bool", "kpm_float", "kv_lengths"} & set(parts):
        lens = rng.integers(1, Sk + 1, size=B)
        lens[0] = Sk // 2 + 3  # padding ends inside a 64-key block, not at its edge
        mask = dataclasses.replace(mask, valid_lens=lens)
    if {"qpm_bool", "q_lengths"} & set(parts):
        if "q_lengths" in parts:  # a suffix of rows without keys
            rows = np.arange(Lq)[None, :] < np.array([Lq - 2, Lq // 2])[:, None]  # (B, L)
        else:
            rows = rng.random((B, Lq)) < 0.7
            rows[:, 0] = True
        allowed = rows[:, None, :, None]  # (B, 1, L, 1)
        if mask.allowed is not None:
            allowed = allowed & mask.allowed
        mask = dataclasses.replace(mask, allowed=allowed)
    return make_problem(seed, B, Lq, Sk, E, H, mask=mask, self_attention=self_attention)


def _build_window(form: str, seed: int, self_attention: bool) -> Problem:
    """The canonical problem of a window form: the window or chunked causal mask as a boolean
    (1, 1, L, S) ``allowed``, the causal flag and key lengths (B,) beside it as the form says."""
    parts = form_parts(form)
    Lq, Sk = (WINDOW_L, WINDOW_L) if self_attention else (WINDOW_L, WINDOW_S)
    band = (window_allowed(Lq, Sk, *WINDOW) if "local_window" in parts
            else chunked_causal_allowed(Lq, Sk, CHUNK))  # (L, S)
    mask = Mask(allowed=band[None, None], causal="causal_flag" in parts)
    if "kv_lengths" in parts:
        mask = dataclasses.replace(mask, valid_lens=np.minimum(WINDOW_KV_LENGTHS, Sk))
    return make_problem(seed, B, Lq, Sk, E, H, mask=mask, self_attention=self_attention)


CASES: List[FormCase] = [_case(f) for f in MASK_FORMS]
