"""NumPy MHA: the tutorials' vectorised algorithm, and the adapter other NumPy kernels reuse.

``NumpyCore`` does the untimed and projection work; a NumPy attention kernel
subclasses it and supplies only ``attend(q, k, v, mask, scale, need_weights)`` (per-head
q, k, v -> head outputs), the signature the torch and jax cores share; ``mask`` is what
``attention_mask(problem, dtype)`` translates the canonical mask into: by default a
``suite.plugins.adapters.AttendMask`` of NumPy arrays in the compute dtype, which a kernel with
its own mask representation overrides (``numpy.flash`` keeps the mask in parts).

``numpy`` also reads a paged key/value cache (``suite.spec.paging``): the pool's blocks projected,
then gathered through the block table into each sequence's cache (``read_pages``).

``numpy`` also computes every score variant (``suite.spec.variants``: soft-capping, ALiBi, a
relative position table, a score modifier, sinks, value heads of their own width), each
from the problem's parameters, in the compute dtype; the other NumPy kernels declare none.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import numpy as np

from suite.plugins.adapters import AttendMask, ScoreVariants, attend_mask, cached_chunks
from suite.plugins.declarations import VARIANT_FEATURES, Deviation
from suite.plugins.interface import Implementation, Result
from suite.spec.paging import gather, paged_cache
from suite.spec.problem import Problem
from suite.spec.variants import Alibi, RelBias, ScoreMod

NP_DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16}


class NumpyCore(Implementation):
    """Projections, head split/merge and mask translation for NumPy kernels."""

    framework = "numpy"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale"})

    def framework_version(self) -> str:
        return np.__version__

    def dtypes(self, device: str):
        return ("float64", "float32", "float16")

    def prepare(self, problem: Problem, device: str, dtype: str, *, need_weights: bool = False,
                grad: bool = False) -> Dict[str, Any]:
        if device != "cpu":
            raise ValueError(f"device: expected 'cpu', got {device!r}")
        if dtype not in NP_DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(NP_DTYPES)}, got {dtype!r}")
        if need_weights and "weights" not in self.features:
            raise ValueError(f"need_weights: {self.name} does not return attention weights "
                             f"(feature 'weights' not declared), got True")
        t = NP_DTYPES[dtype]
        p = problem

        def cast(a: Optional[np.ndarray]) -> Optional[np.ndarray]:
            return None if a is None else np.ascontiguousarray(a, dtype=t)

        mask = self.attention_mask(p, t)
        state = {"p": p, "dtype": t, "need_weights": need_weights,
                 "query": cast(p.query), "key": cast(p.key), "value": cast(p.value),
                 "w": {k: cast(v) for k, v in p.weights.as_dict().items()},
                 "mask": mask, "scale": t(p.effective_scale)}
        if p.paging is not None:  # a paged cache: the pool and its table replace key and value
            cache = paged_cache(p)
            state.update(key=None, value=None, key_pages=cast(cache.key_pages),
                         value_pages=cast(cache.value_pages), block_table=cache.block_table,
                         lengths=cache.lengths)
        return state

    def attention_mask(self, problem: Problem, dtype: type) -> Any:
        """The canonical mask in the form ``attend`` takes, built once in ``prepare``
        (untimed): an ``AttendMask`` whose bias carries -inf where the boolean parts forbid
        attention, in ``dtype``; a kernel with its own mask form overrides this."""
        def cast(a: Optional[np.ndarray]) -> Optional[np.ndarray]:
            return None if a is None else np.ascontiguousarray(a, dtype=dtype)

        return attend_mask(problem, put_float=cast)

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: AttendMask,
               scale: float, need_weights: bool):
        """q (B, H, L, D), k (B, H, S, D), v (B, H, S, V), mask.bias (B, H|1, L, S) or None;
        with ``repeat_kv = False`` k and v keep their K kv heads (B, K, S, D|V): the kernel
        groups the query heads itself (query head h reads kv head h // (H // K)).

        Returns (heads (B, H, L, V), weights (B, H, L, S) or None).
        """
        raise NotImplementedError

    def attend_in_steps(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: AttendMask,
                        scale: float, p: Problem) -> np.ndarray:
        """The rows chunk by chunk (``p.steps``), each chunk's keys and values put in a cache
        first (``cache_append``, or ``cache_write`` into a static cache of ``p.cache_len``
        slots) and its rows attending everything the cache holds (slots not yet written
        masked): heads (B, H, L, V)."""
        L = q.shape[2]

        def empty(slots: int):
            return (np.zeros(k.shape[:2] + (slots, k.shape[3]), k.dtype),
                    np.zeros(v.shape[:2] + (slots, v.shape[3]), v.dtype))

        bias = mask.bias if mask.bias is not None else np.zeros((1, 1, L, L), q.dtype)
        heads = []
        for start, end, kc, vc in cached_chunks(p, k, v, empty, self.cache_append,
                                                self.cache_write):
            rows = np.full(bias.shape[:2] + (end - start, kc.shape[2]), -np.inf, bias.dtype)
            rows[..., :end] = bias[:, :, start:end, :end]  # slots past the sequence: masked
            # the chunk's rows sit at positions start.. (ALiBi, the table and a score_mod
            # read them)
            var = mask.variants
            at = np.full(q.shape[0], start) if var is not None and (
                var.alibi is not None or var.rel_bias is not None
                or var.score_mod is not None) else None
            h, _ = self.attend(q[:, :, start:end], kc, vc,
                               mask.replace(bias=rows, query_offset=at), scale, False)
            heads.append(h)
        return np.concatenate(heads, axis=2)

    def cache_append(self, kc, vc, k, v):
        """A growing cache: the chunk's keys and values after those held."""
        return np.concatenate([kc, k], axis=2), np.concatenate([vc, v], axis=2)

    def cache_write(self, kc, vc, k, v, start: int):
        """A static cache: the chunk's keys and values at their positions start.."""
        kc, vc = kc.copy(), vc.copy()
        kc[:, :, start:start + k.shape[2]] = k
        vc[:, :, start:start + v.shape[2]] = v
        return kc, vc

    def read_pages(self, pages: np.ndarray, block_table: np.ndarray, lengths: np.ndarray,
                   S: int) -> np.ndarray:
        """The logical cache (B, S, X) of a paged one: ``pages`` (N, P, X), projected, read
        through the block table (B, T); ``lengths`` (B,) the filled slots (the mask hides
        the rest)."""
        return gather(pages, block_table, S)

    def run(self, s: Dict[str, Any]):
        p, w = s["p"], s["w"]
        B, L, S, H, K, D, V = p.B, p.L, p.S, p.H, p.K, p.D, p.V

        def proj(x: np.ndarray, name: str) -> np.ndarray:  # x @ W (+ b)
            y = x @ w[f"w_{name}"]
            return y if w[f"b_{name}"] is None else y + w[f"b_{name}"]

        q = proj(s["query"], "q")  # (B, L, H*D)
        if p.paging is None:
            k = proj(s["key"], "k")  # (B, S, K*D)
            v = proj(s["value"], "v")  # (B, S, K*V)
        else:  # the pool's blocks projected (per token), then read through the block table
            table, lengths = s["block_table"], s["lengths"]
            k = self.read_pages(proj(s["key_pages"], "k"), table, lengths, S)  # (B, S, K*D)
            v = self.read_pages(proj(s["value_pages"], "v"), table, lengths, S)  # (B, S, K*V)
        q = q.reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
        k = k.reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
        v = v.reshape(B, S, K, V).transpose(0, 2, 1, 3)  # (B, K, S, V)
        if K != H and self.repeat_kv:  # query head h reads kv head h // (H // K)
            k = np.repeat(k, H // K, axis=1)  # (B, H, S, D)
            v = np.repeat(v, H // K, axis=1)  # (B, H, S, V)
        if p.steps is not None:  # a generating module: chunk by chunk against a cache
            heads, weights = self.attend_in_steps(q, k, v, s["mask"], s["scale"], p), None
        else:
            heads, weights = self.attend(q, k, v, s["mask"], s["scale"], s["need_weights"])
        out = heads.transpose(0, 2, 1, 3).reshape(B, L, H * V) @ w["w_o"]  # (B, L, E)
        if w["b_o"] is not None:
            out += w["b_o"]
        return out, weights

    def fetch(self, state: Any, handle: Any) -> Result:
        out, weights = handle
        return Result(out.astype(np.float64),
                      None if weights is None else weights.astype(np.float64))


class NumpyMHA(NumpyCore):
    """Scores, the score variants, masked softmax (a sink in the denominator), weighted sum:
    the plain vectorised algorithm."""

    name = "numpy"
    features = NumpyCore.features | {"weights", "decode", "packed", "steps", "static_cache",
                                     "paged", "dropout"} | VARIANT_FEATURES
    deviations = {"nan_padding": Deviation(
        "confined", "a NaN or inf value at a key masked for some rows but not all reaches those "
                    "rows: their weight there is 0 and 0 * NaN is NaN in weights @ v (values "
                    "masked for every row are zeroed first; measured, special_values cases)")}

    def attend(self, q, k, v, mask, scale, need_weights):
        bias = mask.bias
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale  # (B, H, L, S)
        variants = mask.variants
        if variants is not None:  # cap, position biases, score_mod: before the mask
            scores = self.vary(scores, variants, mask)
        if bias is not None:
            scores += bias
            # Padded keys may hold NaN/garbage: masked scores are exactly -inf, never NaN.
            scores[np.broadcast_to(np.isneginf(bias), scores.shape)] = -np.inf
        row_max = scores.max(axis=-1, keepdims=True)  # (B, H, L, 1)
        sinks = None if variants is None or variants.sinks is None else \
            variants.sinks[None, :, None, None]  # (1, H, 1, 1)
        if sinks is not None:  # the sink's logit joins the max (a NaN max stays NaN)
            row_max = np.maximum(row_max, sinks)
        # A fully masked row has no finite logit: use 0 as its max so exp gives all zeros
        # (a +inf or NaN max stays: IEEE makes that row NaN, as the spec says).
        row_max[np.isneginf(row_max)] = 0
        scores -= row_max
        np.exp(scores, out=scores)  # softmax in the input dtype, max-subtracted
        total = scores.sum(axis=-1, keepdims=True)  # (B, H, L, 1)
        if sinks is not None:  # in the denominator only: the sink takes no value
            total += np.exp(sinks - row_max)
        total[total == 0] = 1  # fully masked row: weights stay 0, so its head output is 0
        scores /= total
        if mask.dropout is not None:  # training mode: inverted dropout, fresh draws each call
            keep = self.draws().random(scores.shape) >= mask.dropout
            scores = np.where(keep, scores / scores.dtype.type(1 - mask.dropout), 0).astype(
                scores.dtype)
        if bias is not None:
            v = np.where(np.isneginf(bias).all(axis=-2)[..., None], 0, v)  # NaN padding: 0*NaN
        heads = scores @ v  # (B, H, L, D)
        return heads, (scores if need_weights else None)

    def draws(self) -> np.random.Generator:
        """This instance's random generator for dropout, seeded from the OS once."""
        if getattr(self, "_rng", None) is None:
            self._rng = np.random.default_rng()
        return self._rng

    # --- score variants (suite.spec.variants), each in the compute dtype ---------------------
    def vary(self, scores: np.ndarray, variants: ScoreVariants, mask: AttendMask
             ) -> np.ndarray:
        """scores (B, H, L, S) with the variants in the spec's order: cap, ALiBi and the
        relative table added, score_mod; the position variants at the rows' absolute
        positions (``positions``: a decode row at its offset, a packed token in its own
        sequence)."""
        L, S = scores.shape[-2:]
        if variants.softcap is not None:
            scores = self.cap(scores, variants.softcap)
        if variants.alibi is not None:
            at = self.positions(variants.alibi.align, L, S, mask)
            scores = scores + self.alibi_bias(variants.alibi, *at)  # (B|1, H, L, S)
        if variants.rel_bias is not None:
            at = self.positions(variants.rel_bias.align, L, S, mask)
            scores = scores + self.relative_bias(variants.rel_bias, *at)  # (B|1, H, L, S)
        if variants.score_mod is not None:
            placed = mask is not None and (mask.segments is not None
                                           or mask.query_offset is not None)  # (an
            # override's two-argument modify stays valid where no form places the rows)
            scores = self.modify(scores, variants.score_mod, mask) if placed \
                else self.modify(scores, variants.score_mod)
        return scores

    def cap(self, scores: np.ndarray, cap: float) -> np.ndarray:
        """cap * tanh(scores / cap): tanh saturates, so an inf score becomes +-cap."""
        return cap * np.tanh(scores / cap)

    @staticmethod
    def query_positions(align: str, L: int, S: int, dtype) -> np.ndarray:
        """(L, 1) key position of each query row: i, or i + S - L bottom-right aligned."""
        return (np.arange(L, dtype=dtype) + (S - L if align == "bottom_right" else 0))[:, None]

    @classmethod
    def positions(cls, align: str, L: int, S: int, mask: AttendMask):
        """(queries (B|1, 1, L, 1), keys (B|1, 1, 1, S)) int64 positions: a decode row of
        batch b at ``query_offset[b] + i`` (keys at their slots), a packed token at its index
        in its own sequence, else query i at ``query_positions``."""
        if mask is not None and mask.segments is not None:  # restart at each sequence
            seg = np.asarray(mask.segments)  # (B, L), L = S
            idx = np.arange(seg.shape[1])
            first = np.where(np.diff(seg, axis=1, prepend=-1) != 0, idx, 0)
            pos = idx - np.maximum.accumulate(first, axis=1)  # (B, L)
            return pos[:, None, :, None], pos[:, None, None, :]
        keys = np.arange(S)[None, None, None, :]
        if mask is not None and mask.query_offset is not None:
            rows = np.asarray(mask.query_offset)[:, None] + np.arange(L)[None, :]  # (B, L)
            return rows[:, None, :, None], keys
        return cls.query_positions(align, L, S, np.int64)[None, None], keys

    def alibi_bias(self, alibi: Alibi, queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """(B|1, H, L, S): each head's slope times the convention's position term at query
        positions (B|1, 1, L, 1) and key positions (B|1, 1, 1, S)."""
        slopes = alibi.slopes  # (H,) in the compute dtype
        i, j = queries.astype(slopes.dtype), keys.astype(slopes.dtype)
        term = {"key": j + 0 * i, "distance": -np.abs(i - j),
                "signed": j - i}[alibi.convention]  # (B|1, 1, L, S)
        return slopes[:, None, None] * term  # (B|1, H, L, S)

    def relative_bias(self, rel: RelBias, queries: np.ndarray, keys: np.ndarray
                      ) -> np.ndarray:
        """(B|1, H, L, S): each head's table read at the bucket of the distance j - i."""
        distance = keys - queries  # (B|1, 1, L, S) memory minus context position, as T5
        n = rel.table.shape[-1]
        if rel.bucketing == "clip":
            high = rel.max_distance if rel.bidirectional else 0
            buckets = np.clip(distance, -rel.max_distance, high) + rel.max_distance
        else:
            buckets = _t5_bucket(distance, rel.bidirectional, n, rel.max_distance)
        return np.moveaxis(rel.table[:, buckets[:, 0]], 0, 1)  # (B|1, H, L, S)

    def modify(self, scores: np.ndarray, mod: ScoreMod,
               mask: Optional[AttendMask] = None) -> np.ndarray:
        """The score modifier on (B, H, L, S), its indices as floats of the dtype; i and j
        are the rows' and keys' absolute positions (``positions``): a decode row at its
        batch's offset (keys at their cache slots), a packed token within its own
        sequence."""
        B, H, L, S = scores.shape
        t = scores.dtype
        b, h = np.arange(B, dtype=t)[:, None, None, None], np.arange(H, dtype=t)[:, None, None]
        i, j = np.arange(L, dtype=t)[:, None], np.arange(S, dtype=t)
        if mask is not None and (mask.segments is not None or mask.query_offset is not None):
            i, j = (a.astype(t) for a in self.positions("top_left", L, S, mask))
        return np.asarray(mod.fn(scores, b, h, i, j, np), dtype=t)


def _t5_bucket(distance: np.ndarray, bidirectional: bool, num_buckets: int,
               max_distance: int) -> np.ndarray:
    """Hugging Face T5's ``_relative_position_bucket``, line for line (float32 log)."""
    buckets = np.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        buckets += (distance > 0).astype(np.int64) * num_buckets
        distance = np.abs(distance)
    else:
        distance = -np.minimum(distance, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    with np.errstate(divide="ignore"):  # log(0) where the exact bucket is taken anyway
        scaled = (np.log(distance.astype(np.float32) / max_exact)
                  / np.float32(math.log(max_distance / max_exact)) * (num_buckets - max_exact))
    large = max_exact + np.where(is_small, 0, scaled).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, distance, large)
