"""Planted NumPy plugins right in prefill and wrong with a score modifier in one inference
form: the packed family's ``score_mod_docs``, the dropout family's ``score_mod_causal``, the
decode family's ``score_mod_at_offset``, the generation family's ``score_mod_steps`` and the
paged family's ``score_mod_rows_at_offsets`` must fail each (misplaced or dropped), and the reference pass."""

import dataclasses

import numpy as np

from implementations.numpy.mha import NumpyMHA


def _without_score_mod(mask):
    return mask.replace(variants=dataclasses.replace(mask.variants, score_mod=None))


class PackedDropsScoreMod(NumpyMHA):
    """The score modifier applied on padded batches and left out on the packed path (a
    varlen kernel called without the modifier the padded path runs)."""

    name = "bug.packed_drops_score_mod"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.segments is not None and mask.variants is not None:
            mask = _without_score_mod(mask)
        return super().attend(q, k, v, mask, scale, need_weights)


class TrainingDropsScoreMod(NumpyMHA):
    """The score modifier applied in eval mode and left out of the training path (every
    other variant kept): right dropout of the unmodified scores' weights."""

    name = "bug.dropout_drops_score_mod"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.dropout and mask.variants is not None:
            mask = _without_score_mod(mask)
        return super().attend(q, k, v, mask, scale, need_weights)


class ScoreModAtRowIndices(NumpyMHA):
    """The score modifier handed each query row's index within the query tensor where a form
    places the rows at an offset (a decode step's rows, a generation step's chunk): the
    offset forgotten, as a decode kernel that passes its q_idx through. Right in prefill and
    in a packed batch (the positions within each sequence kept)."""

    name = "bug.score_mod_at_row_indices"

    def modify(self, scores, mod, mask=None):
        return super().modify(scores, mod, None if mask is None
                              else mask.replace(query_offset=None))


class DecodeDropsScoreMod(NumpyMHA):
    """The score modifier kept in prefill and left out where the rows sit at an offset into a
    cache (a decode step, a generation step's chunk): a decode kernel written after the
    prefill one, without the modifier."""

    name = "bug.decode_drops_score_mod"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.query_offset is not None and mask.variants is not None:
            mask = _without_score_mod(mask)
        return super().attend(q, k, v, mask, scale, need_weights)


class PagedScoreModAtPoolSlots(NumpyMHA):
    """The score modifier handed each key's slot in the paged pool (block * page size + slot
    in the block) instead of its slot in its own sequence: a paged kernel that forgets to map
    its physical key index back through the block table (FlexAttention's paged attention does
    this mapping for a score_mod). Right wherever the cache is not paged."""

    name = "bug.paged_score_mod_at_pool_slots"

    def prepare(self, problem, device, dtype, **kw):
        self._pool_slots = None
        if problem.paging is not None:
            table, P = np.asarray(problem.paging.block_table), problem.paging.page_size
            s = np.arange(problem.S)
            self._pool_slots = (table[:, s // P] * P + s % P)[:, None, None, :]  # (B, 1, 1, S)
        return super().prepare(problem, device, dtype, **kw)

    def modify(self, scores, mod, mask=None):
        slots = getattr(self, "_pool_slots", None)
        if slots is not None:
            inner = mod.fn
            mod = dataclasses.replace(
                mod, fn=lambda score, b, h, i, j, xp: inner(score, b, h, i, slots.astype(score.dtype), xp))
        return super().modify(scores, mod, mask)
