"""The layouts family: the same problem in the memory layouts models hand kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from suite.conformance.judge import Outcome, run_problem
from suite.plugins.interface import Implementation, declared
from suite.spec.layouts import LAYOUTS, with_layout
from suite.spec.problem import Mask, Problem, make_problem

if TYPE_CHECKING:
    from suite.conformance.families.declare import Judge
from suite.conformance.families.declare import family
from suite.conformance.families.declare import rng as seeded_rng

FAMILY = "layouts"
BUILDERS, case = family(FAMILY)

# --- layouts: the same problem in the memory layouts models hand kernels ------------------------
# Per-head q, k, v and the mask reach the kernel as strided views, slices and stride-0
# broadcasts (suite.spec.layouts); the oracle reads the canonical arrays. Three problems per
# layout: cross-attention unmasked (L != S, so a stride read for the wrong length shows), with
# an additive bias of shape (B, 1, L, S) with -inf holes (the mask broadcast over heads), and
# causal self-attention (the is_causal paths); `expanded` poses them multi-query (one kv
# head broadcast with stride 0 over H = 4 query heads). The self-attention form
# (``kv_source="self"``) of the first two is square, L = S = 9, one input.
YB, YL, YS, YE, YH = 2, 9, 13, 32, 4
_LAYOUT_PROBLEMS = {"none": "cross-attention (L = 9, S = 13), no mask",
                    "bias": "an additive (B, 1, L, S) bias with -inf holes",
                    "causal": "causal self-attention (L = S = 9)"}


def _layout_problem(layout: str, kind: str):
    def build(seed: int, square: Optional[int] = None) -> Problem:
        rng = seeded_rng(seed)
        S = YL if kind == "causal" or square is not None else YS
        K = 1 if layout == "expanded" else YH
        mask = Mask()
        if kind == "bias":
            keep = rng.random((YB, 1, YL, S)) < 0.7
            keep[..., 0] = True
            mask = Mask(bias=np.where(keep, rng.standard_normal(keep.shape), -np.inf))
        elif kind == "causal":
            mask = Mask(causal=True)
        p = make_problem(seed, YB, YL, S, YE, YH, K, mask=mask,
                         self_attention=kind == "causal" or square is not None)
        return with_layout(p, layout)
    build.__doc__ = f"{LAYOUTS[layout]}; {_LAYOUT_PROBLEMS[kind]}."
    return build


def _shows(layout: str, x) -> bool:
    """Whether tensor ``x`` (per-head q, k or v, (B, H|K, L, D), as ``attend`` got it; any
    array with torch's ``stride``/``storage_offset``) is in ``layout``'s memory layout."""
    if layout == "transposed":  # a view of (B, L, H, D): heads closer than rows
        return x.stride(-1) == 1 and x.stride(1) < x.stride(2)
    if layout == "last_strided":
        return x.stride(-1) != 1
    if layout == "channels_last":  # (L*D*H, 1, D*H, H): the heads axis innermost
        return x.stride(1) == 1 and x.shape[1] > 1
    if layout == "sliced":  # a slice of a larger buffer
        return x.storage_offset() > 0
    return True


def _spied(impl: Implementation, layout: str, out: Outcome, p: Problem) -> Outcome:
    """``run_problem`` with ``impl.attend`` (a kernel core's: ``TorchCore.attend(q, k, v,
    mask, scale, need_weights)``) watched: a pass where the kernel never received the
    layout (the plugin declares it and hands its own) is a failure. The values are the
    same in every layout, so without this a plugin that ignores the request passes."""
    seen: list = []
    attend = impl.attend

    def spy(q, k, v, mask, *rest, **kw):
        seen.append((q, k, v, getattr(mask, "bias", None)))
        return attend(q, k, v, mask, *rest, **kw)

    impl.attend = spy
    try:
        out = run_problem(impl, out, p)
    finally:
        del impl.attend
    if out.outcome != "pass" or not seen or layout == "contiguous":
        return out
    q, k, v, bias = seen[0]
    if layout == "expanded":  # one kv head over H query heads, stride 0 (or kept as 1 head)
        wrong = [n for n, x in (("k", k), ("v", v)) if x.shape[1] != 1 and x.stride(1) != 0]
        if bias is not None and bias.shape[1] == p.H and bias.stride(1) != 0:
            wrong.append("the mask")
    else:
        wrong = [n for n, x in (("q", q), ("k", k), ("v", v)) if not _shows(layout, x)]
    if not wrong:
        return out
    return out.classify("fail", f"declares layout {layout} but its kernel received "
                                f"{', '.join(wrong)} in another (strides "
                                f"{tuple(seen[0][0].stride())} for q): the values are the same "
                                f"in every layout, the strides it was to be handed are not")


def _layout_judge(layout: str) -> Judge:
    def judge(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
        if layout not in declared(impl, "layouts"):
            return out.classify("unsupported", f"does not declare layout {layout}")
        if callable(getattr(impl, "attend", None)) and "attend" not in vars(impl):
            return _spied(impl, layout, out, p)
        return run_problem(impl, out, p)
    return judge


for _layout in LAYOUTS:
    for _kind in ("none", "bias", "causal"):
        case(_layout if _kind == "none" else f"{_layout}+{_kind}",
             judge=_layout_judge(_layout), square=None if _kind == "causal" else YL)(
            _layout_problem(_layout, _kind))


