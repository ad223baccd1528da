"""Planted NumPy plugins right in prefill and wrong with a score modifier in one inference
form: the packed family's ``score_mod_docs`` and the dropout family's ``score_mod_causal``
must fail each, and the reference pass."""

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
