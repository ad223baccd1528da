"""Planted bugs in the score variants on torch: torch.eager with one variant wrong, and SDPA
with its value heads split at the key width."""

from __future__ import annotations

import dataclasses

import numpy as np

from implementations.torch_eager import TorchEager
from implementations.torch_sdpa import TorchSDPA


def _with(mask, **changes):
    """``mask`` (an AttendMask of tensors) with its score variants changed."""
    return mask.replace(variants=dataclasses.replace(mask.variants, **changes))


class TorchDropsCap(TorchEager):
    """Soft-capping declared and forgotten."""

    name = "bug.torch_drops_cap"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.variants is not None:
            mask = _with(mask, softcap=None)
        return super().attend(q, k, v, mask, scale, need_weights)


class TorchSlopesReversed(TorchEager):
    """ALiBi's slopes in the reverse head order."""

    name = "bug.torch_alibi_reversed"

    def attend(self, q, k, v, mask, scale, need_weights):
        alibi = None if mask.variants is None else mask.variants.alibi
        if alibi is not None:
            mask = _with(mask, alibi=dataclasses.replace(alibi, slopes=alibi.slopes.flip(0)))
        return super().attend(q, k, v, mask, scale, need_weights)


class TorchAlibiTopLeft(TorchEager):
    """ALiBi's distance measured from the top-left where the problem aligns it bottom-right."""

    name = "bug.torch_alibi_top_left"

    def attend(self, q, k, v, mask, scale, need_weights):
        alibi = None if mask.variants is None else mask.variants.alibi
        if alibi is not None:
            mask = _with(mask, alibi=dataclasses.replace(alibi, align="top_left"))
        return super().attend(q, k, v, mask, scale, need_weights)


class SDPAKeyWidthValues(TorchSDPA):
    """SDPA whose caller splits the value projection at the query/key head width (a port of
    a latent-attention module that views values like keys): head h reads value columns
    [h*D, h*D + V) instead of [h*V, (h+1)*V)."""

    name = "bug.sdpa_key_width_values"

    def prepare(self, problem, device, dtype, *, need_weights=False, grad=False):
        p = problem
        if p.V != p.D:  # the columns this caller reads, gathered into the canonical layout
            cols = np.concatenate([np.arange(h * p.D, h * p.D + p.V) for h in range(p.K)])
            w = p.weights
            if cols.max() >= w.w_v.shape[1]:
                raise IndexError(f"value column {cols.max()} of {w.w_v.shape[1]}")
            p = dataclasses.replace(p, weights=dataclasses.replace(
                w, w_v=w.w_v[:, cols], b_v=None if w.b_v is None else w.b_v[cols]))
        return super().prepare(p, device, dtype, need_weights=need_weights, grad=grad)
