"""Input layouts: the same values in the memory layouts models hand attention kernels.

A kernel that reads its inputs through the wrong strides computes a different problem, and
the layouts models produce every day are rarely contiguous: heads split from (B, L, H, D)
without a copy, q/k/v out of a 1x1 convolution (the last axis strided), channels-last
4-D tensors, slices of a fused qkv buffer, a kv head broadcast to every query head with
stride 0 (``expand``), a mask broadcast over heads. A layout here is a name and a function
that returns a tensor with the same values and shape in that memory layout; the array
library's own ops build it (``implementations.torch.common.arrange``), so the kernel gets
exactly the strides a model would give it. The ``layouts`` case family (``suite.conformance.cases``)
runs each problem in each layout; a plugin declares the layouts it takes
(``Implementation.layouts``, default ``contiguous`` only) and the rest are reported
unsupported. This module imports no framework.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

from suite.spec.problem import Problem

# name -> what the kernel receives (q, k, v per head: (B, H, L, D); the mask: (B, H, L, S)).
LAYOUTS: Dict[str, str] = {
    "contiguous": "every tensor contiguous in its logical order",
    "transposed": "heads split without a copy: (B, H, L, D) as a view of a (B, L, H, D) buffer, "
                  "the layout `x.view(B, L, H, D).transpose(1, 2)` gives",
    "last_strided": "the last axis strided (stride L): (B, H, L, D) as a view of a (B, H, D, L) "
                    "buffer, as q/k/v come out of a 1x1 convolution (NCHW)",
    "channels_last": "torch.channels_last 4-D tensors (strides (L*D*H, 1, D*H, H))",
    "sliced": "slices of a larger buffer (a storage offset, rows padded), as q, k and v split "
              "from one fused projection",
    "expanded": "stride-0 broadcast: each kv head expanded over the query heads that read it "
                "(multi-query problems), and a mask broadcast over heads with `expand`",
}

def check(layout: str) -> str:
    """``layout`` if it is a known layout name, else a ValueError listing them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {sorted(LAYOUTS)}, got {layout!r}")
    return layout


@dataclasses.dataclass(frozen=True)
class LayoutProblem(Problem):
    """A problem whose per-head q, k, v and mask are to reach the kernel in ``layout`` (a name
    of ``LAYOUTS``); everything else, the oracle included, reads it as the canonical problem."""

    layout: str = "contiguous"


def with_layout(problem: Problem, layout: str) -> LayoutProblem:
    """``problem`` asking for ``layout`` (checked against ``LAYOUTS``)."""
    check(layout)
    fields = {f.name: getattr(problem, f.name) for f in dataclasses.fields(Problem)}
    return LayoutProblem(**fields, layout=layout)


def requested_layout(problem: Problem) -> Optional[str]:
    """The layout ``problem`` asks for, or None (the core's own layout)."""
    return getattr(problem, "layout", None)
