"""The ``mask_forms`` family's cases, declared as data: one case per mask form.

Each case is a canonical problem whose mask the form can express exactly (a 2-D form gets
a mask that is the same for every batch item and head, a key-padding form gets ``valid_lens``
of shape (B,), ...), built from a seed derived from the form's name, so a failing test id
replays the same arrays. The plugin is given the problem in that form
(``suite.adapters.with_form``): the library broadcasts what the form leaves out, and its
answer is compared with the float64 oracle on the canonical problem.

Sizes: B = 2 and H = 4 (so a (B*H) axis flattened head-major instead of batch-major shows),
L = 9 queries and S = 67 keys (L != S, so a mask read transposed shows; S crosses a 64-key
block). A plugin whose library takes one input for query, key and value
(``kv_source="self"``) gets the square version, L = S = 24.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import List

import numpy as np

from suite.adapters import form_parts, with_form
from suite.cases import Case
from suite.check import Outcome, run_problem
from suite.plugin import MASK_FORMS, Implementation, declared
from suite.problem import Mask, Problem, make_problem

B, H, E = 2, 4, 16
L, S = 9, 67
SQUARE = 24  # L = S for self-attention plugins

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


CASES: List[FormCase] = [_case(f) for f in MASK_FORMS]
