"""The float64 oracle, and the same-dtype baselines (naive_t) of the agreement rule.

One forward pass, ``forward(p, ar)``, written once over an ``Arithmetic``:

- ``EXACT``: float64 end to end, the oracle (the spec of MHA as plainly as NumPy allows);
- ``Arithmetic(t, order)``: the plain algorithm computed in dtype t the way hardware does.
  float32 runs end to end in float32 (float32 matmuls, exp and sums); float16 and bfloat16
  accumulate in float32 and round each operation's result to t. ``order`` is the reduction
  order of every matmul and sum: ``"blas"`` (this machine's BLAS and NumPy's pairwise sums)
  or ``"sequential"`` (one term after another, the textbook loop, the same on every CPU).

The agreement rule takes the larger error of the two orders (``baselines``): an
implementation is held to what its dtype allows in any plain summation order, so a verdict
does not hinge on which CPU, BLAS or thread count ran it (DESIGN.md, agreement rule).

Score variants (``suite.spec.variants``) are applied in one place, ``_vary``, in the spec's
order: scale, cap, ALiBi and the relative table, score_mod; then the mask, then the softmax
with the sinks in its denominator. A row with no key to attend gives a zero head output,
with a sink too (it attends only to the sink, which takes no value).

Letters: B batch, L query length, S key length, H query heads, K kv heads, D head width,
V value head width, E model width.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from suite.spec.problem import Problem, variant_positions
from suite.spec.variants import score_mod_indices

ORDERS = ("blas", "sequential")
# How a dtype's arithmetic may depart from the plain algorithm, as a plugin declares it
# (suite.plugins.declarations.POLICIES): None = the plain algorithm; "tf32" (float32 only, a
# ``float32_dots`` policy) = each matrix product's operands rounded to TF32 first (10 stored
# mantissa bits, float32's exponent), accumulated in float32, as GPU tensor cores run float32
# dots by default in JAX and Triton; "softmax32" (float64 only, a ``float64_softmax`` policy) =
# the softmax (the logits cast down, the max, exp, sum and division) in float32 and its
# weights cast back, as transformers' eager attention computes it for float64 inputs.
DOTS = (None, "tf32", "softmax32")
PRECISION_DTYPE = {"tf32": "float32", "softmax32": "float64"}


def precision(dtype: str, dots: Optional[str]) -> Optional[str]:
    """``dots`` where it applies to ``dtype`` (``PRECISION_DTYPE``), else None."""
    if dots not in DOTS:
        raise ValueError(f"dots: expected one of {DOTS}, got {dots!r}")
    return dots if dots is not None and PRECISION_DTYPE[dots] == dtype else None
# What a query row with no key to attend gives (the spec is "zero"); the other policies are
# the behaviours a plugin may declare (suite.plugins.interface.FULLY_MASKED_POLICIES).
FULLY_MASKED = ("zero", "nan", "mean_values", "unmasked")


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to dtype's precision (returned as float64)."""
    if dtype == "float64":
        return np.asarray(x, dtype=np.float64)
    return _round32(np.asarray(x, dtype=np.float32), dtype).astype(np.float64)


def _round32(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to dtype's precision, kept as float32."""
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "tf32":  # the top 19 bits of float32 (10 mantissa bits)
        return _drop_low_bits(x, 13)
    if dtype == "bfloat16":  # the top 16 bits of float32
        return _drop_low_bits(x, 16)
    raise ValueError(f"dtype: expected one of float64, float32, float16, bfloat16, got {dtype!r}")


def _drop_low_bits(x: np.ndarray, n: int) -> np.ndarray:
    """float32 values rounded to nearest even on their top 32 - n bits (inf and NaN kept)."""
    f = np.ascontiguousarray(x)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = (bits + ((1 << (n - 1)) - 1) + ((bits >> n) & 1)) & (0xFFFFFFFF ^ ((1 << n) - 1))
    out = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(f), out, f)


class Arithmetic:
    """The operations of the forward and backward passes in one dtype and reduction order."""

    def __init__(self, dtype: str = "float64", order: str = "blas",
                 dots: Optional[str] = None) -> None:
        if order not in ORDERS:
            raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
        round_to(np.zeros(1), dtype)  # an unknown dtype fails here, naming itself
        self.dtype, self.order = dtype, order
        self.precision = precision(dtype, dots)
        # float32 products' operands rounded to TF32 first (a declared float32_dots policy)
        self.dots = "tf32" if self.precision == "tf32" else None
        # Storage and accumulation type: float64 for the oracle, float32 below it.
        self.acc = np.float64 if dtype == "float64" else np.float32
        # The softmax's own arithmetic: float32 under a float64_softmax policy, else this one.
        self.softmax = Arithmetic("float32", order) if self.precision == "softmax32" else self

    def rounded(self, x) -> np.ndarray:
        """An operation's result (or an input), rounded to the dtype."""
        x = np.asarray(x, dtype=self.acc)
        return x if self.acc is np.float64 else _round32(x, self.dtype)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (..., M, N) @ b (..., N, P), accumulated in acc, rounded once at the end."""
        a, b = np.asarray(a, self.acc), np.asarray(b, self.acc)
        if self.dots is not None:
            a, b = _round32(a, self.dots), _round32(b, self.dots)
        if self.order == "blas":
            return self.rounded(np.matmul(a, b))
        n = a.shape[-1]
        shape = np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1]))
        acc = np.zeros(shape, dtype=self.acc)
        for i in range(n):  # term after term: a product rounded, then a sum rounded
            acc = acc + a[..., :, i:i + 1] * b[..., i:i + 1, :]
        return self.rounded(acc)

    def sum(self, x: np.ndarray, axis: int) -> np.ndarray:
        """Sum over ``axis`` (kept as a length-1 axis), accumulated in acc."""
        x = np.asarray(x, self.acc)
        if self.order == "blas":
            return self.rounded(x.sum(axis=axis, keepdims=True, dtype=self.acc))
        moved = np.moveaxis(x, axis, 0)
        acc = np.zeros(moved.shape[1:], dtype=self.acc)
        for term in moved:
            acc = acc + term
        return self.rounded(np.expand_dims(acc, axis))

    def exp(self, x: np.ndarray) -> np.ndarray:
        # exp rounded once to the dtype (float32 exp implementations differ by CPU in the
        # last ulp; a correctly rounded one keeps the baseline the same everywhere).
        return self.rounded(np.exp(np.asarray(x, np.float64)))

    def tanh(self, x: np.ndarray) -> np.ndarray:
        # tanh rounded once to the dtype, as exp (the same on every CPU)
        return self.rounded(np.tanh(np.asarray(x, np.float64)))


EXACT = Arithmetic("float64")


def forward(p: Problem, ar: Arithmetic = EXACT, fully_masked: str = "zero"
            ) -> Dict[str, np.ndarray]:
    """The forward pass in arithmetic ``ar``; returns every intermediate the backward needs.

    ``fully_masked`` is what a query row with no key to attend gives: the spec's zero head
    output, NaN, the mean of the values (uniform weights) or attention as if unmasked.
    """
    if fully_masked not in FULLY_MASKED:
        raise ValueError(f"fully_masked: expected one of {FULLY_MASKED}, got {fully_masked!r}")

    def compute() -> Dict[str, Any]:
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf follow IEEE on purpose
            return _forward(p, ar, fully_masked)

    return _memo(("forward", digest(p), ar.dtype, ar.order, ar.precision, fully_masked), compute)


def _memo(key: tuple, compute: Any) -> Any:
    """``compute()``, or what it gave before for ``key`` in this process (read-only arrays)."""
    found = _PASSES.get(key)
    if found is not None:
        _PASSES.move_to_end(key)
        return found[0]
    value = compute()
    size = 0
    for a in _arrays(value):  # shared by every later caller: a write would corrupt the cache
        a.flags.writeable = False
        size += a.nbytes
    global _PASSES_SIZE
    _PASSES[key] = (value, size)
    _PASSES_SIZE += size
    while len(_PASSES) > 1 and (_PASSES_SIZE > _PASSES_BYTES or len(_PASSES) > _PASSES_KEPT):
        _PASSES_SIZE -= _PASSES.popitem(last=False)[1][1]
    return value


# Passes computed in this process, by problem content and arithmetic: one case is judged on
# every implementation and dtype (and its oracle, two baselines and first-order bound all
# start from a pass), and the sequential baseline of a 1025-key case takes seconds. Kept by
# size: an implementation runs every case before the next implementation (or dtype) runs
# the first again, so a cache of a few dozen passes shared none of them across
# implementations (docs/measured/profile.md); the passes of CI's covering selection of a
# family's cases fit in a few hundred MB, the largest pass is under 50 MB.
_PASSES: collections.OrderedDict[tuple, Tuple[Dict[str, Any], int]] = collections.OrderedDict()
_PASSES_BYTES = 384 << 20
_PASSES_KEPT = 8192
_PASSES_SIZE = 0


# Problems whose digest is known (``pinned``): id -> (problem, digest).
_PINNED: Dict[int, Tuple[Problem, str]] = {}


@contextlib.contextmanager
def pinned(*problems: Problem) -> Iterator[None]:
    """Within the block, ``digest`` of each of ``problems`` (the same objects) is computed
    once: the caller promises that no code in the block changes their arrays (the judge
    comparing a result with the oracle, its baselines and its bound, each keyed by the
    problem's digest: hashing a problem five times a case was 5 ms of it)."""
    before = {id(p): _PINNED.get(id(p)) for p in problems}
    for p in problems:
        _PINNED[id(p)] = (p, digest(p))
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                _PINNED.pop(key, None)
            else:
                _PINNED[key] = old


def digest(p: Problem) -> str:
    """A hash of everything ``p`` holds (arrays by dtype, shape and bytes): equal problems,
    built anew from the same seed, share one pass."""
    known = _PINNED.get(id(p))
    if known is not None and known[0] is p:
        return known[1]
    h = hashlib.blake2b(digest_size=16)

    def feed(x: Any) -> None:
        if isinstance(x, np.ndarray):
            h.update(f"a{x.dtype.str}{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            h.update(type(x).__name__.encode())
            for field in dataclasses.fields(x):
                h.update(field.name.encode())
                feed(getattr(x, field.name))
        elif isinstance(x, dict):
            for k in sorted(x):
                h.update(repr(k).encode())
                feed(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(f"s{len(x)}".encode())
            for v in x:
                feed(v)
        else:
            h.update(repr(x).encode())

    feed(p)
    return h.hexdigest()


def _arrays(x: Any):
    """Every ndarray in a pass's (nested) dict."""
    if isinstance(x, np.ndarray):
        yield x
    elif isinstance(x, (dict, tuple)):
        for v in (x.values() if isinstance(x, dict) else x):
            yield from _arrays(v)


def score_mod_at(p: Problem, shape: Tuple[int, ...], dtype: Any) -> tuple:
    """The (b, h, i, j) a score_mod of ``p`` reads on a (B, H, L, S) score, as floats of
    ``dtype`` (``suite.spec.variants.ScoreFn``): the batch and head indices, and the query
    and key positions ALiBi and the relative table read (``variant_positions``, top-left):
    a decode row of batch b at ``mask.query_offset[b] + i`` ((B, 1, L, 1); keys at their
    cache slots), a packed token at its position within its own sequence ((B, 1, L, 1) and
    (B, 1, 1, S): a packed sequence's rows are those of the sequence alone), else query row
    i and key j. A generation problem's chunks are rows of one causal problem, so their
    positions are its row and key indices."""
    b, h, _, _ = score_mod_indices(shape, dtype)
    queries, keys = variant_positions(p, "top_left")  # (B|1, L), (B|1, S) ints
    return b, h, queries.astype(dtype)[:, None, :, None], keys.astype(dtype)[:, None, None, :]


def _vary(p: Problem, ar: Arithmetic, logits: np.ndarray) -> Tuple[np.ndarray, Dict[str, Any]]:
    """The score variants on the scaled logits (B, H, L, S), in the spec's order: cap, ALiBi
    and the relative table added, score_mod; each result rounded to the dtype. Also returns
    what the backward and the rounding bound need (empty without variants)."""
    r = ar.rounded
    parts: Dict[str, Any] = {}
    if p.softcap is not None:  # cap * tanh(score / cap), after the scale, before any bias
        cap = ar.acc(p.softcap)
        t = ar.tanh(r(logits / cap))
        parts["scaled"], parts["cap_slope"] = logits, r(1 - r(t * t))  # d capped / d scaled
        logits = r(cap * t)
    added = []
    # Absolute positions (B|1, L) and (B|1, S): at a decode row's offset, within a packed
    # sequence (suite.spec.variants.token_positions)
    if p.alibi is not None:  # slope (H,) times the position term (B|1, L, S), in the dtype
        slopes = r(p.alibi.slopes)[None, :, None, None]  # (1, H, 1, 1)
        term = p.alibi.term(*variant_positions(p, p.alibi.align))[:, None]  # (B|1, 1, L, S)
        added.append(r(slopes * r(term)))  # (B|1, H, L, S)
    if p.rel_bias is not None:  # table (H, n) read at each pair's bucket (B|1, L, S)
        buckets = p.rel_bias.buckets_at(*variant_positions(p, p.rel_bias.align))
        added.append(r(p.rel_bias.table)[:, buckets].transpose(1, 0, 2, 3))  # (B|1, H, L, S)
    for bias in added:
        logits = r(logits + bias)
    parts["added"] = tuple(added)
    if p.score_mod is not None:  # in the dtype's storage type: float64, or float32 below it
        parts["modded_from"] = logits
        logits = r(p.score_mod.fn(logits, *score_mod_at(p, logits.shape, ar.acc), np))
    return logits, parts


def _forward(p: Problem, ar: Arithmetic, fully_masked: str) -> Dict[str, np.ndarray]:
    r = ar.rounded
    B, L, S, H, K, D, V = p.B, p.L, p.S, p.H, p.K, p.D, p.V
    w = {n: (None if a is None else r(a)) for n, a in p.weights.as_dict().items()}
    x = {"query": r(p.query), "key": r(p.key), "value": r(p.value)}

    def project(inp: np.ndarray, wm: np.ndarray, b: Optional[np.ndarray]) -> np.ndarray:
        y = ar.matmul(inp, wm)
        return y if b is None else r(y + b)

    q = project(x["query"], w["w_q"], w["b_q"]).reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
    k = project(x["key"], w["w_k"], w["b_k"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
    v = project(x["value"], w["w_v"], w["b_v"]).reshape(B, S, K, V).transpose(0, 2, 1, 3)  # (B, K, S, V)
    # GQA: query head h reads kv head h // (H // K).
    k = np.repeat(k, H // K, axis=1)  # (B, H, S, D)
    v = np.repeat(v, H // K, axis=1)  # (B, H, S, V)
    allowed = p.mask.dense_allowed(B, H, L, S)  # (B, H, L, S)
    if p.mask.bias is not None:  # a -inf bias entry masks its key, as False in allowed does
        allowed = allowed & (np.broadcast_to(p.mask.bias, allowed.shape) > -np.inf)
    scores = ar.matmul(q, k.transpose(0, 1, 3, 2))  # (B, H, L, S)
    varied, parts = _vary(p, ar, r(scores * ar.acc(p.effective_scale)))  # (B, H, L, S)
    logits = varied
    if p.mask.bias is not None:
        logits = r(logits + r(p.mask.bias))
    dead_row = ~allowed.any(axis=-1, keepdims=True)  # (B, H, L, 1): no key to attend
    if fully_masked == "unmasked":
        sees = allowed | dead_row  # a row with no key attends to every key
        logits = np.where(dead_row, varied, logits)  # no mask
    elif fully_masked == "mean_values":
        sees = allowed | dead_row
        logits = np.where(dead_row, 0.0, logits).astype(ar.acc)  # equal logits: uniform weights
    else:
        sees = allowed
    # Masked logits are dropped (not merely -inf), so NaN in padded keys cannot leak.
    logits = np.where(sees, logits, -np.inf)
    sm = ar.softmax  # the softmax's arithmetic (float32 under a float64_softmax policy)
    logits = sm.rounded(logits)  # (cast down where the softmax runs in another dtype)
    empty = ~sees.any(axis=-1, keepdims=True)  # (B, H, L, 1): a row with no key to attend
    # Special values follow IEEE arithmetic in the keys a row attends: a NaN logit makes the
    # row max NaN, a +inf one makes logit - max = inf - inf = NaN, a row whose every
    # attended logit is -inf gives -inf - -inf = NaN: each makes the whole row's weights NaN.
    row_max = logits.max(axis=-1, keepdims=True)  # (B, H, L, 1)
    row_max = np.where(empty, 0.0, row_max)  # a fully masked row has no max
    sink = None if p.sinks is None else sm.rounded(p.sinks)[None, :, None, None]  # (1, H, 1, 1)
    if sink is not None:  # the sink's logit joins the max (a NaN max stays NaN)
        row_max = np.where(empty, sink, np.maximum(row_max, sink)).astype(sm.acc)
    e = sm.exp(sm.rounded(logits - row_max))  # masked entries: exp(-inf) = 0
    total = sm.sum(e, axis=-1)  # (B, H, L, 1)
    if sink is not None:  # the sink joins the denominator, after the keys
        e_sink = sm.exp(sm.rounded(sink - row_max))  # (B, H, L, 1)
        total = sm.rounded(total + e_sink)
        parts["sink_weight"] = sm.rounded(e_sink / total).astype(ar.acc)  # what the sink takes
    # A fully masked query row has no key to attend: its weights and head output are 0
    # (with a sink too: the row attends only to the sink, which takes no value).
    weights = np.where(empty, 0.0, sm.rounded(e / np.where(empty, 1, total))).astype(ar.acc)
    if fully_masked == "nan":
        weights = np.where(dead_row, np.nan, weights).astype(ar.acc)
    # Keys no query may attend (padding) must not poison the sum: 0 * NaN is NaN.
    used = sees.any(axis=2)[..., None]  # (B, H, S, 1)
    v_used = np.where(used, v, 0.0).astype(ar.acc)  # (B, H, S, V)
    # A NaN or inf value reaches exactly the rows that may attend its key, and makes their
    # head output NaN (0 * inf is NaN: a key a row may not attend is dropped, not weighted 0).
    bad_v = ~np.isfinite(v_used).all(axis=-1)  # (B, H, S)
    heads = ar.matmul(weights, np.where(bad_v[..., None], 0.0, v_used))  # (B, H, L, V)
    if bad_v.any():
        reach = (sees & bad_v[:, :, None, :]).any(axis=-1, keepdims=True)  # (B, H, L, 1)
        heads = np.where(reach, np.nan, heads).astype(ar.acc)
    concat = heads.transpose(0, 2, 1, 3).reshape(B, L, H * V)  # (B, L, H*V)
    out = project(concat, w["w_o"], w["b_o"])  # (B, L, E)
    return {"x": x, "w": w, "q": q, "k": k, "v": v_used, "used": used, "weights": weights,
            "heads": heads, "concat": concat, "out": out, "allowed": allowed, "logits": logits,
            "sees": sees, "variants": parts}


def oracle(p: Problem, fully_masked: str = "zero") -> Tuple[np.ndarray, np.ndarray]:
    """Float64 output (B, L, E) and attention weights (B, H, L, S) of problem ``p``."""
    f = forward(p, EXACT, fully_masked)
    return f["out"], f["weights"]


def naive(p: Problem, dtype: str, order: str = "blas", fully_masked: str = "zero",
          dots: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The plain algorithm in ``dtype`` with reduction ``order`` (output, weights), as float64;
    ``dots``: how float32 products take their operands (``DOTS``)."""
    f = forward(p, Arithmetic(dtype, order, dots), fully_masked)
    return f["out"].astype(np.float64), f["weights"].astype(np.float64)


def baselines(p: Problem, dtype: str, fully_masked: str = "zero", dots: Optional[str] = None
              ) -> List[Tuple[np.ndarray, np.ndarray]]:
    """naive_t in every reduction order; the rule takes the largest error among them."""
    return [naive(p, dtype, order, fully_masked, dots) for order in ORDERS]


# Unit roundoff per dtype: half the distance from 1.0 to the next value.
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11,
                 "bfloat16": 2.0**-8, "tf32": 2.0**-11}


def first_order(p: Problem, dtype: str, fully_masked: str = "zero", dots: Optional[str] = None
                ) -> Tuple[np.ndarray, np.ndarray]:
    """The first-order rounding bound of ``p`` in ``dtype`` (``_first_order``), computed once
    per problem and dtype in this process."""
    dots = precision(dtype, dots)
    return _memo(("first_order", digest(p), dtype, fully_masked, dots),
                 lambda: _first_order(p, dtype, fully_masked, dots))


def squares_finite(a: np.ndarray) -> np.ndarray:
    """Squares, with NaN/inf (masked or padded entries, weighed 0 where used) as 0."""
    return np.square(np.nan_to_num(np.asarray(a, np.float64), nan=0.0, posinf=0.0, neginf=0.0))


def _through_variants(p: Problem, parts: Dict[str, Any], dl: np.ndarray, u2: float
                      ) -> np.ndarray:
    """The variance ``dl`` (B, H, L, S) of the scaled logits' error carried through the
    score variants of ``p`` (``_vary``'s ``parts``, float64), with each variant's roundings."""
    if p.softcap is not None:
        # The division and tanh each rounded once; tanh' = 1 - tanh^2 <= 1, so an error
        # before the cap shrinks by it and never grows (a saturated logit forgets it).
        slope2 = np.square(parts["cap_slope"])
        dl = slope2 * (dl + 2 * u2 * squares_finite(parts["scaled"])) \
            + u2 * p.softcap ** 2 * (1 - parts["cap_slope"])  # tanh's rounding: u |cap tanh|
    for added in parts["added"]:  # ALiBi's slope and product, or the table, rounded
        dl = dl + 2 * u2 * squares_finite(added)
    if p.score_mod is not None:  # first order: the modifier's derivative, central difference
        s = np.nan_to_num(parts["modded_from"], nan=0.0, posinf=0.0, neginf=0.0)
        step = 1e-6 * np.maximum(1.0, np.abs(s))
        index = score_mod_at(p, s.shape, np.float64)
        fn = p.score_mod.fn
        slope = (fn(s + step, *index, np) - fn(s - step, *index, np)) / (2 * step)
        dl = np.square(np.nan_to_num(slope)) * dl
    return dl


def _first_order(p: Problem, dtype: str, fully_masked: str = "zero", dots: Optional[str] = None
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """The size of the error that rounding every stored intermediate to ``dtype`` once
    gives the output (B, L, E) and the weights (B, H, L, S), to first order, in their units.

    Every result (projection and q.k products, logits, weights, head outputs, the output) is
    taken as rounded once, an independent error of size u |value| (u the unit roundoff), and
    the errors are propagated through the exact float64 pass, adding in quadrature (root sum
    of squares: independent roundings do not all take the worst sign): a logit l_j off by
    dl_j moves head output h by sum_j w_j (v_j - h) dl_j. This is the case's condition: it
    scales with |logits| and |v_j - h|, and it does not depend on how one summation order
    happened to round on one seed (a row with two nearly tied logits makes every plain
    order's error a lottery; this is the size of the draw). The root sum of squares is
    scaled by sqrt(2 ln 2n), n the entries compared, as the rule compares the largest error.
    With ``dots`` ("tf32"), each product of a matmul also carries the rounding of its two
    operands to that format (2 u_dots^2 |a b|^2 in place of u^2 |a b|^2); with "softmax32"
    the softmax's roundings (the logit cast down, the weight, the sink) are float32's.
    """
    u2 = UNIT_ROUNDOFF[dtype] ** 2
    # a matmul's products: each rounded once (u), or its operands rounded to ``dots`` first
    ud2 = 2 * UNIT_ROUNDOFF[dots] ** 2 + u2 if dots == "tf32" else u2
    # the softmax's roundings: in the dtype, or float32's under a float64_softmax policy
    us2 = UNIT_ROUNDOFF["float32"] ** 2 if dots == "softmax32" else u2
    f = forward(p, EXACT, fully_masked)
    B, L, S, H, K, D, V = p.B, p.L, p.S, p.H, p.K, p.D, p.V
    w, x = f["w"], f["x"]

    def proj_var(inp: np.ndarray, wm: np.ndarray, b: Optional[np.ndarray]) -> np.ndarray:
        # each product x_i W_ij and the result rounded once: u^2 (x^2 @ W^2 + b^2)
        var = ud2 * (squares_finite(inp) @ squares_finite(wm))  # (B, L, out)
        return var if b is None else var + u2 * squares_finite(b)

    dq = proj_var(x["query"], w["w_q"], w["b_q"]).reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
    dk = proj_var(x["key"], w["w_k"], w["b_k"]).reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
    dv = proj_var(x["value"], w["w_v"], w["b_v"]).reshape(B, S, K, V).transpose(0, 2, 1, 3)  # (B, K, S, V)
    dk, dv = np.repeat(dk, H // K, axis=1), np.repeat(dv, H // K, axis=1)  # (B, H, S, D|V)
    q2, k2, v2 = squares_finite(f["q"]), squares_finite(f["k"]), squares_finite(f["v"])
    weights = np.nan_to_num(f["weights"])  # (B, H, L, S); the nan policy's rows count as 0
    w2 = np.square(weights)
    seen = weights > 0  # only keys a row weighs carry its error (masked logits are -inf)
    s2 = float(p.effective_scale) ** 2
    kt, dkt = k2.transpose(0, 1, 3, 2), dk.transpose(0, 1, 3, 2)  # (B, H, D, S)
    dl = s2 * (ud2 * (q2 @ kt) + dq @ kt + q2 @ dkt)  # (B, H, L, S): the scaled q.k's
    dl = us2 * squares_finite(f["logits"]) + _through_variants(p, f["variants"], dl, u2)  # the logit's
    dl = np.where(seen, dl, 0.0)
    heads = np.nan_to_num(f["heads"])  # (B, H, L, V)
    vals = np.nan_to_num(f["v"])  # (B, H, S, V)
    spread = np.square(vals[:, :, None, :, :] - heads[:, :, :, None, :])  # (v_j - h)^2 (B, H, L, S, V)
    # A sink is one more logit in the softmax (its own rounding, u |sink|), with value 0.
    sink_var = 0.0 if p.sinks is None else (
        np.square(np.nan_to_num(f["variants"]["sink_weight"]))
        * us2 * np.square(p.sinks)[None, :, None, None])  # (B, H, L, 1)
    dw = w2 * (dl + (w2 * dl).sum(-1, keepdims=True) + sink_var) + us2 * w2  # (B, H, L, S)
    dh = (np.einsum("bhls,bhlsd->bhld", w2 * dl, spread) + w2 @ dv
          + ud2 * (w2 @ v2) + u2 * np.square(heads) + sink_var * np.square(heads))  # (B, H, L, V)
    if dots == "softmax32":  # each weight cast down to float32 (us) before its float64 product
        dh = dh + us2 * (w2 @ v2)
    dcat = dh.transpose(0, 2, 1, 3).reshape(B, L, H * V)  # (B, L, H*V)
    w_o2 = squares_finite(w["w_o"])
    dout = (dcat @ w_o2 + ud2 * (squares_finite(f["concat"]) @ w_o2)
            + u2 * squares_finite(f["out"]))  # (B, L, E)
    # Each entry's error is a sum of many independent roundings (about Gaussian, std the
    # root sum of squares above); the largest of n such entries is about std *
    # sqrt(2 ln 2n) (the expected maximum of n half-normal draws): the rule compares maxima.
    def tail(n: int) -> float:
        return float(np.sqrt(2.0 * np.log(2.0 * max(n, 1))))

    return np.sqrt(dout) * tail(dout.size), np.sqrt(dw) * tail(dw.size)
