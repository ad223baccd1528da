"""Planted generating modules on the NumPy reference, each with one cache bug: the
generation family must fail each at the steps where it goes wrong, and the reference pass."""

import dataclasses

from implementations.numpy.mha import NumpyMHA


class AppendedTwice(NumpyMHA):
    """Appends each chunk's keys and values twice: the first chunk reads right, every later
    one reads the duplicates where its earlier tokens should be."""

    name = "bug.cache_appended_twice"

    def cache_append(self, kc, vc, k, v):
        return super().cache_append(*super().cache_append(kc, vc, k, v), k, v)


class RolledEarly(NumpyMHA):
    """A sliding-window cache of 4 that rolls one step early: it keeps the last 3 tokens, so
    the oldest key the window still needs is gone (zeros)."""

    name = "bug.cache_rolled_early"
    keep = 3

    def cache_append(self, kc, vc, k, v):
        kc, vc = super().cache_append(kc, vc, k, v)
        kc, vc = kc.copy(), vc.copy()
        kc[:, :, :-self.keep] = 0
        vc[:, :, :-self.keep] = 0
        return kc, vc


class FirstFillEvictsOneMore(NumpyMHA):
    """A sliding-window cache of 4 right when the prefill fills the window, and right while
    it slides, but which keeps only the last 3 tokens at the decode step where it first holds
    4 (a ring buffer that wraps one step early when it fills token by token): the oldest key
    that step's row needs is gone (zeros)."""

    name = "bug.window_first_fill_early"
    window = 4

    def cache_append(self, kc, vc, k, v):
        before = kc.shape[2]
        kc, vc = super().cache_append(kc, vc, k, v)
        if k.shape[2] == 1 and before < self.window <= kc.shape[2]:
            kc, vc = kc.copy(), vc.copy()
            kc[:, :, :-(self.window - 1)] = 0
            vc[:, :, :-(self.window - 1)] = 0
        return kc, vc


class FullCacheDropsLastWrite(NumpyMHA):
    """A static cache that takes a write reaching its last slot for an overflow and drops
    it: right while the cache has room, wrong at the step that fills it."""

    name = "bug.static_cache_full_drops_write"

    def cache_write(self, kc, vc, k, v, start):
        if start + k.shape[2] >= kc.shape[2]:
            return kc, vc
        return super().cache_write(kc, vc, k, v, start)


class WrittenOneLate(NumpyMHA):
    """A static cache written one slot late (the cache position off by one)."""

    name = "bug.static_cache_one_late"

    def cache_write(self, kc, vc, k, v, start):
        kc, vc = kc.copy(), vc.copy()
        n = min(k.shape[2], kc.shape[2] - start - 1)
        kc[:, :, start + 1:start + 1 + n] = k[:, :, :n]
        vc[:, :, start + 1:start + 1 + n] = v[:, :, :n]
        return kc, vc


class CountsChunks:
    """Put before a plugin class: ``decode_step()``, called in ``attend``, counts the chunks
    ``attend_in_steps`` hands it and says whether this one follows the first (a decode step
    after the prefill); False outside ``attend_in_steps``."""

    _chunk = None

    def attend_in_steps(self, q, k, v, mask, scale, p):
        self._chunk = 0
        try:
            return super().attend_in_steps(q, k, v, mask, scale, p)
        finally:
            self._chunk = None

    def decode_step(self) -> bool:
        if self._chunk is None:
            return False
        self._chunk += 1
        return self._chunk > 1


class StepsDropCap(CountsChunks, NumpyMHA):
    """Soft-caps its prefill (the first chunk) and drops the cap at every decode step after
    it (issue 50: a decode path written after the prefill one, without the variant)."""

    name = "bug.steps_drop_cap"

    def attend(self, q, k, v, mask, scale, need_weights):
        if self.decode_step() and mask.variants is not None:
            mask = mask.replace(variants=dataclasses.replace(mask.variants, softcap=None))
        return super().attend(q, k, v, mask, scale, need_weights)
