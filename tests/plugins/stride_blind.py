"""Planted bug of a hand-written kernel that reads its inputs' memory as if they were
contiguous (a C or Triton kernel that ignores the strides it is handed): torch.eager's answer
on contiguous inputs, garbage on transposed views, strided last axes, slices and stride-0
broadcasts. It declares every layout, so the layouts family runs it on each."""

import dataclasses

import torch

from implementations.torch.common import ALL_LAYOUTS
from implementations.torch.eager import TorchEager
from suite.spec.problem import Problem


def _as_contiguous_memory(x: torch.Tensor) -> torch.Tensor:
    """``x``'s storage read from its offset as if laid out contiguously in its shape."""
    flat = x.untyped_storage()
    out = torch.empty(0, dtype=x.dtype, device=x.device).set_(flat, x.storage_offset(), x.shape)
    return out.clone()


class StrideBlind(TorchEager):
    name = "bug.stride_blind"
    layouts = ALL_LAYOUTS

    def attend(self, q, k, v, mask, scale, need_weights):
        # a stride-0 broadcast holds fewer elements than its shape: read what is there,
        # repeated, as a kernel indexing head h at h * S * D would read past the kv head
        q, k, v = (_as_contiguous_memory(x) if _fits(x) else _wrapped(x) for x in (q, k, v))
        return super().attend(q, k, v, mask, scale, need_weights)


def _wrapped(x: torch.Tensor) -> torch.Tensor:
    """A broadcast ``x`` read as contiguous memory: its first head's storage for every head
    after the first, shifted by one row (the wrong offset a stride-blind kernel computes)."""
    dense = x.contiguous()
    return torch.cat([dense[:, :1], dense[:, 1:].roll(1, dims=-2)], dim=1)


def _fits(x: torch.Tensor) -> bool:
    return x.untyped_storage().nbytes() >= (x.storage_offset() + x.numel()) * x.element_size()


class ContiguousOnly(TorchEager):
    """torch.eager declaring no layout but the default: the other layouts are unsupported."""

    name = "contiguous_only"
    layouts = frozenset({"contiguous"})



class IgnoresLayout(TorchEager):
    """Declares every layout and never reads the request: its ``prepare`` drops the layout
    the case asks for, so its kernel gets the core's own views. The values are the same in
    every layout, so only the strides the kernel receives tell."""

    name = "bug.ignores_layout"
    layouts = ALL_LAYOUTS

    def prepare(self, problem, device, dtype, **kw):
        plain = Problem(**{f.name: getattr(problem, f.name) for f in dataclasses.fields(Problem)})
        return super().prepare(plain, device, dtype, **kw)
