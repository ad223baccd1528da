"""Planted bugs in the score variants on torch: torch.eager with one variant wrong (the cap,
ALiBi, a sink, the relative table), and SDPA with its value heads split at the key width."""

from __future__ import annotations

import dataclasses

from variants_planted import KeyWidthSplit

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


class SDPAKeyWidthValues(KeyWidthSplit, TorchSDPA):
    """SDPA whose caller splits the value projection at the query/key head width (a port of
    a latent-attention module that views values like keys)."""

    name = "bug.sdpa_key_width_values"


class TorchForgetsSink(TorchEager):
    """Sinks declared and left out of the softmax's denominator."""

    name = "bug.torch_forgets_sink"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.variants is not None:
            mask = _with(mask, sinks=None)
        return super().attend(q, k, v, mask, scale, need_weights)


class TorchRelTableHeadsReversed(TorchEager):
    """The relative position table's heads in reverse order (a port that lays out the
    (H, buckets) table bucket-major)."""

    name = "bug.torch_rel_heads_reversed"

    def attend(self, q, k, v, mask, scale, need_weights):
        rel = None if mask.variants is None else mask.variants.rel_bias
        if rel is not None:
            mask = _with(mask, rel_bias=dataclasses.replace(rel, table=rel.table.flip(0)))
        return super().attend(q, k, v, mask, scale, need_weights)
