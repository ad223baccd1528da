"""Planted bugs in the score variants: NumPy plugins that each get one variant wrong (and one
that gets a modifier of its own right), as kernels and ports get them wrong. Each is
numpy's reference with one thing changed; tests/test_variants.py runs the variants family
on them (torch's planted bugs: variants_planted_torch.py)."""

from __future__ import annotations

import dataclasses

import numpy as np

from implementations.numpy.mha import NumpyMHA
from suite.spec.variants import ScoreMod


def _with(mask, **changes):
    """``mask`` (an AttendMask) with its score variants changed."""
    return mask.replace(variants=dataclasses.replace(mask.variants, **changes))


class DropsCap(NumpyMHA):
    """Soft-capping declared and forgotten: the scores go to the softmax uncapped."""

    name = "bug.drops_cap"

    def cap(self, scores, cap):
        return scores


class CapsAfterBias(NumpyMHA):
    """The cap applied to the final logits, ALiBi and the relative table included (a port
    that caps where the mask is added, not right after the scale)."""

    name = "bug.caps_after_bias"

    def vary(self, scores, variants, mask):
        capless = dataclasses.replace(variants, softcap=None)
        scores = super().vary(scores, capless, mask)
        return scores if variants.softcap is None else self.cap(scores, variants.softcap)


class SlopesReversed(NumpyMHA):
    """ALiBi's slopes in the reverse head order (head 0 gets the smallest slope)."""

    name = "bug.alibi_reversed"

    def alibi_bias(self, alibi, queries, keys):
        return super().alibi_bias(dataclasses.replace(alibi, slopes=alibi.slopes[::-1]),
                                  queries, keys)


class SlopesNegated(NumpyMHA):
    """ALiBi's slopes with the sign turned over: far keys favoured instead of near ones."""

    name = "bug.alibi_negated"

    def alibi_bias(self, alibi, queries, keys):
        return super().alibi_bias(dataclasses.replace(alibi, slopes=-alibi.slopes), queries,
                                  keys)


class AlibiTopLeft(NumpyMHA):
    """ALiBi's distance always measured from the top-left (query i at key i), also where
    the problem aligns it bottom-right (query i at key i + S - L)."""

    name = "bug.alibi_top_left"

    def vary(self, scores, variants, mask):
        if variants.alibi is not None:
            variants = dataclasses.replace(variants, alibi=dataclasses.replace(
                variants.alibi, align="top_left"))
        return super().vary(scores, variants, mask)


class ForgetsSink(NumpyMHA):
    """Sinks declared and left out of the softmax's denominator."""

    name = "bug.forgets_sink"

    def attend(self, q, k, v, mask, scale, need_weights):
        if mask.variants is not None:
            mask = _with(mask, sinks=None)
        return super().attend(q, k, v, mask, scale, need_weights)


class SinkWithValue(NumpyMHA):
    """The sink appended as a key that holds the first key's value (StreamingLLM's sink
    token, not a learned logit): the sink's weight times v_0 joins every head output."""

    name = "bug.sink_with_value"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, True)
        if mask.variants is not None and mask.variants.sinks is not None:
            sink_weight = 1 - weights.sum(-1, keepdims=True)  # (B, H, L, 1)
            heads = heads + sink_weight * v[:, :, :1]  # (B, H, L, V)
        return heads, (weights if need_weights else None)


class RelTableTransposed(NumpyMHA):
    """The relative table read at i - j (context minus memory position) instead of j - i."""

    name = "bug.rel_transposed"

    def relative_bias(self, rel, queries, keys):
        return super().relative_bias(rel, keys, queries)  # the bug: context minus memory


class ScoreModIndicesSwapped(NumpyMHA):
    """The score modifier called with the query and key indices swapped."""

    name = "bug.score_mod_swapped"

    def modify(self, scores, mod):
        swapped = ScoreMod(mod.name, lambda s, b, h, i, j, xp: mod.fn(s, b, h, j, i, xp))
        return super().modify(scores, swapped)


class KeyWidthSplit:
    """Value heads split at the query/key head width: head h reads value columns
    [h*D, h*D + V) instead of [h*V, (h+1)*V) (a kernel that strides values like keys);
    mixed into a plugin before its base."""

    def prepare(self, problem, device, dtype, *, need_weights=False, grad=False):
        p = problem
        if p.V != p.D:  # the columns this kernel reads, gathered into the canonical layout
            cols = np.concatenate([np.arange(h * p.D, h * p.D + p.V) for h in range(p.K)])
            w = p.weights
            if cols.max() >= w.w_v.shape[1]:
                raise IndexError(f"value column {cols.max()} of {w.w_v.shape[1]}")
            p = dataclasses.replace(p, weights=dataclasses.replace(
                w, w_v=w.w_v[:, cols], b_v=None if w.b_v is None else w.b_v[cols]))
        return super().prepare(p, device, dtype, need_weights=need_weights, grad=grad)


class KeyWidthValues(KeyWidthSplit, NumpyMHA):
    """numpy's reference with its value heads split at the key width."""

    name = "bug.key_width_values"


# --- a variant of the plugin's own: a modifier it declares and computes itself ---------------
def _shift_spec(score, b, h, i, j, xp):
    """The spec of a plugin's own variant: keys after the query lose 0.75 per head index."""
    return score - 0.75 * h * (j > i)


LATER_KEYS = ScoreMod("later_keys_penalty", _shift_spec,
                      "score - 0.75 h [j > i]: keys after the query penalised per head")


class OwnModifier(NumpyMHA):
    """Declares a score modifier of its own and computes it with its own code (not the
    NumPy function the suite's oracle calls): the suite needs no change to check it."""

    name = "own.later_keys"
    score_mods = (LATER_KEYS,)

    def modify(self, scores, mod):
        if mod.name != LATER_KEYS.name:
            return super().modify(scores, mod)
        H, L, S = scores.shape[1:]
        later = np.arange(S)[None, :] > np.arange(L)[:, None]  # (L, S)
        penalty = 0.75 * np.arange(H, dtype=scores.dtype)[:, None, None] * later  # (H, L, S)
        return scores - penalty.astype(scores.dtype)


class OwnModifierWrong(OwnModifier):
    """Its own modifier with the penalty on the keys before the query (j < i)."""

    name = "own.later_keys_wrong"

    def modify(self, scores, mod):
        if mod.name != LATER_KEYS.name:
            return super().modify(scores, mod)
        H, L, S = scores.shape[1:]
        earlier = np.arange(S)[None, :] < np.arange(L)[:, None]  # (L, S): the wrong side
        penalty = 0.75 * np.arange(H, dtype=scores.dtype)[:, None, None] * earlier
        return scores - penalty.astype(scores.dtype)
