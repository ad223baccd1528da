"""Planted training-mode dropout bugs on the NumPy reference: the dropout family must fail
each, and the reference pass. Each computes the eval-mode weights, then drops them its
own wrong way."""

import numpy as np

from implementations.numpy.mha import NumpyMHA


class _Dropped(NumpyMHA):
    """The eval-mode weights, then ``drop`` (the bug) applied to them."""

    def attend(self, q, k, v, mask, scale, need_weights):
        p = mask.dropout
        heads, weights = super().attend(q, k, v, mask.replace(dropout=None), scale, True)
        if not p:
            return heads, weights if need_weights else None
        weights = self.drop(weights, p).astype(weights.dtype)
        return weights @ v, (weights if need_weights else None)

    def drop(self, w, p):
        raise NotImplementedError


class NoRescale(_Dropped):
    """Drops weights but does not scale the kept ones by 1 / (1 - p)."""

    name = "bug.dropout_no_rescale"

    def drop(self, w, p):
        return np.where(self.draws().random(w.shape) >= p, w, 0)


class Ignored(_Dropped):
    """Declares dropout, computes the eval-mode answer in training mode."""

    name = "bug.dropout_ignored"

    def drop(self, w, p):
        return w


class KeepProbability(_Dropped):
    """Takes p as the probability of keeping a weight (a convention mixed up)."""

    name = "bug.dropout_keep_probability"

    def drop(self, w, p):
        return np.where(self.draws().random(w.shape) < p, w / p, 0)


class SameMask(_Dropped):
    """Draws its mask from a generator seeded anew at every call: the same mask each time."""

    name = "bug.dropout_same_mask"

    def drop(self, w, p):
        return np.where(np.random.default_rng(0).random(w.shape) >= p, w / (1 - p), 0)


class OneMaskForAllHeads(_Dropped):
    """Draws one mask per batch item, row and key, shared by every head."""

    name = "bug.dropout_one_mask_all_heads"

    def drop(self, w, p):
        B, H, L, S = w.shape
        keep = self.draws().random((B, 1, L, S)) >= p
        return np.where(keep, w / (1 - p), 0)


class OneMaskPerKVGroup(_Dropped):
    """Draws one mask per key/value head and shares it with the query heads of its group (a
    grouped kernel that indexes its random stream by the key/value head): right without
    GQA, related masks within each group with it."""

    name = "bug.dropout_one_mask_per_kv_group"

    def prepare(self, problem, device, dtype, **kw):
        self._kv_heads = problem.K
        return super().prepare(problem, device, dtype, **kw)

    def drop(self, w, p):
        B, H, L, S = w.shape
        K = self._kv_heads
        keep = np.repeat(self.draws().random((B, K, L, S)) >= p, H // K, axis=1)
        return np.where(keep, w / (1 - p), 0)


class OnTheOutput(_Dropped):
    """Drops whole output rows of a head (the head output) instead of weights."""

    name = "bug.dropout_on_head_rows"

    def drop(self, w, p):
        B, H, L, S = w.shape
        return np.where(self.draws().random((B, H, L, 1)) >= p, w / (1 - p), 0)


class DropsAtZero(NumpyMHA):
    """In training mode drops with 0.1 whatever p says (p = 0 included)."""

    name = "bug.dropout_at_zero"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.dropout is not None:
            mask = mask.replace(dropout=0.1)
        return super().attend(q, k, v, mask, scale, need_weights)


class OneMaskForTheBatch(_Dropped):
    """Draws one mask per head, row and key, shared by every batch item."""

    name = "bug.dropout_one_mask_for_the_batch"

    def drop(self, w, p):
        B, H, L, S = w.shape
        keep = self.draws().random((1, H, L, S)) >= p
        return np.where(keep, w / (1 - p), 0)


class RepeatsEvery(_Dropped):
    """Cycles through ``period`` masks, one per call (a generator reseeded from a counter
    that wraps): fresh-looking draws whose pattern repeats across calls."""

    name = "bug.dropout_repeats"
    period = 2

    def drop(self, w, p):
        self.calls = getattr(self, "calls", -1) + 1
        rng = np.random.default_rng(self.calls % self.period)
        return np.where(rng.random(w.shape) >= p, w / (1 - p), 0)


class RepeatsEvery50(RepeatsEvery):
    """Fifty masks in a cycle: the mean of 200 draws is within the mean test's bound and
    the spread right (cycles of 32 or fewer fail the mean already); only calls 50 apart
    show it."""

    name = "bug.dropout_repeats_50"
    period = 50


class VariantsDroppedInTraining(NumpyMHA):
    """The score variants kept in eval mode and dropped from the training path (right dropout
    of the weights computed without the cap, ALiBi or sinks): what a training kernel written
    after the inference one does when it forgets them."""

    name = "bug.dropout_variants_dropped"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.dropout:
            mask = mask.replace(variants=None)
        return super().attend(q, k, v, mask, scale, need_weights)


class PackedAcrossInTraining(NumpyMHA):
    """A training path that builds its mask from the causal flag alone (eval mode keeps the
    packed sequences apart): the sequences packed in a row attend each other when dropping."""

    name = "bug.dropout_packed_across"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.dropout and mask.segments is not None:
            L, S = q.shape[-2], k.shape[-2]
            allowed = np.broadcast_to(np.tri(L, S, dtype=bool), mask.allowed.shape)
            mask = mask.replace(allowed=allowed,
                                bias=np.where(allowed, 0.0, -np.inf).astype(q.dtype))
        return super().attend(q, k, v, mask, scale, need_weights)
