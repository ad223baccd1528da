"""Planted NumPy plugins right in prefill and wrong with a score modifier in one inference
form: the packed family's ``score_mod_docs``, the dropout family's ``score_mod_causal``, the
decode family's ``score_mod_at_offset`` and the generation family's ``score_mod_steps`` must
fail each (misplaced or dropped), and the reference pass."""

import dataclasses

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
