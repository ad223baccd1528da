"""Planted bugs in the score variants on torch: torch.eager with one variant wrong (the cap,
ALiBi, a sink, the relative table), and SDPA with its value heads split at the key width."""

from __future__ import annotations

import dataclasses

from variants_planted import KeyWidthSplit

from implementations.torch.eager import TorchEager
from implementations.torch.sdpa import TorchSDPA
from suite.spec.variants import ScoreMod


class _ChangesOneVariant(TorchEager):
    """torch.eager with the problem's ``field`` variant, where it has one, replaced by
    ``changed(value)`` before attending."""

    field = ""

    def changed(self, value):
        raise NotImplementedError

    def attend(self, q, k, v, mask, scale, need_weights):
        value = None if mask.variants is None else getattr(mask.variants, self.field)
        if value is not None:
            mask = mask.replace(variants=dataclasses.replace(
                mask.variants, **{self.field: self.changed(value)}))
        return super().attend(q, k, v, mask, scale, need_weights)


class TorchDropsCap(_ChangesOneVariant):
    """Soft-capping declared and forgotten."""

    name = "bug.torch_drops_cap"
    field = "softcap"

    def changed(self, cap):
        return None


class TorchSlopesReversed(_ChangesOneVariant):
    """ALiBi's slopes in the reverse head order."""

    name = "bug.torch_alibi_reversed"
    field = "alibi"

    def changed(self, alibi):
        return dataclasses.replace(alibi, slopes=alibi.slopes.flip(0))


class TorchAlibiTopLeft(_ChangesOneVariant):
    """ALiBi's distance measured from the top-left where the problem aligns it bottom-right."""

    name = "bug.torch_alibi_top_left"
    field = "alibi"

    def changed(self, alibi):
        return dataclasses.replace(alibi, align="top_left")


class TorchForgetsSink(_ChangesOneVariant):
    """Sinks declared and left out of the softmax's denominator."""

    name = "bug.torch_forgets_sink"
    field = "sinks"

    def changed(self, sinks):
        return None


class TorchRelTableHeadsReversed(_ChangesOneVariant):
    """The relative position table's heads in reverse order (a port that lays out the
    (H, buckets) table bucket-major)."""

    name = "bug.torch_rel_heads_reversed"
    field = "rel_bias"

    def changed(self, rel):
        return dataclasses.replace(rel, table=rel.table.flip(0))


class SDPAKeyWidthValues(KeyWidthSplit, TorchSDPA):
    """SDPA whose caller splits the value projection at the query/key head width (a port of
    a latent-attention module that views values like keys)."""

    name = "bug.sdpa_key_width_values"


# --- right in prefill, wrong at a decode step (issue 50) ---------------------------------------
class TorchDecodeDropsCap(TorchEager):
    """torch.eager that soft-caps in prefill and drops the cap on its decode path (rows at an
    offset into a cache)."""

    name = "bug.torch_decode_drops_cap"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.query_offset is not None and mask.variants is not None:
            mask = mask.replace(variants=dataclasses.replace(mask.variants, softcap=None))
        return super().attend(q, k, v, mask, scale, need_weights)


class TorchAlibiAtZero(TorchEager):
    """torch.eager whose ALiBi (and relative table) at a decode step is measured from row 0,
    the chunk's row index, not the row's absolute position offset[b] + i (the mask keeps the
    offset)."""

    name = "bug.torch_alibi_at_zero"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.query_offset is not None and mask.variants is not None:
            import implementations.torch.common as common

            scores = (q @ k.transpose(-1, -2)) * scale
            moved = mask.replace(query_offset=None)  # positions from 0, the mask unchanged
            scores = common.vary_scores(scores, mask.variants, moved)
            scores = (scores + mask.bias).masked_fill(~mask.allowed, float("-inf"))
            weights = common.masked_softmax(scores, mask.variants.sinks)
            v = common.zero_dead_values(v, mask)
            return weights @ v, (weights if need_weights else None)
        return super().attend(q, k, v, mask, scale, need_weights)


class TorchScoreModAtRowIndices(TorchEager):
    """torch.eager whose score modifier at a decode step (or a generation step's chunk)
    reads each row's index within the query tensor, not its absolute position offset[b] + i:
    the modifier is handed i minus the batch's offset (the rest of the problem unchanged)."""

    name = "bug.torch_score_mod_at_row_indices"

    def attend(self, q, k, v, mask, scale, need_weights):
        var = mask.variants
        if mask.query_offset is not None and var is not None and var.score_mod is not None:
            import torch

            off = torch.as_tensor(mask.query_offset, device=q.device).to(q.dtype)
            off = off.view(-1, 1, 1, 1)  # (B, 1, 1, 1)
            fn = var.score_mod.fn

            def at_rows(s, b, h, i, j, xp):
                return fn(s, b, h, i - off, j, xp)

            mask = mask.replace(variants=dataclasses.replace(
                var, score_mod=ScoreMod(var.score_mod.name, at_rows)))
        return super().attend(q, k, v, mask, scale, need_weights)
