"""The shared conformance cases, declared as data: family, name, how to build the problem.

Every case builds its problem from a seed derived from its family and name (never from its
position in a list), so a failing test id
(``test_agreement.py::test_case[numpy-cpu-float32-masking/causal]``) replays exactly the
same arrays, and adding a case changes no other case's arrays. One ``Case`` type serves
every family with fixed inputs: the agreement families here (the problem against the float64
oracle under the agreement rule), the mask forms (``suite.mask_forms``) and the property and
gradient cases (``suite.property_cases``), whose ``judge`` checks a property instead;
``suite.catalog`` lists them all for ``mha-suite repro`` and the conformance tests.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from suite import (
    decode_cases,
    dropout_cases,
    generation_cases,
    packed_cases,
    paged_cases,
    variant_cases,
)
from suite.check import Outcome, run_problem
from suite.layouts import LAYOUTS, with_layout
from suite.plugin import Implementation, declared
from suite.problem import Mask, Problem, make_problem

# A property judge: runs problem ``p`` on ``impl`` and classifies ``out`` (its seed is the
# case's); the agreement judge is ``suite.check.run_problem``.
Judge = Callable[[Implementation, Outcome, Problem], Outcome]


@dataclasses.dataclass(frozen=True)
class Case:
    family: str  # masking, shapes, numerics, tiles, special_values, mask_forms, properties, ...
    name: str
    build: Callable[[int], Problem]  # seed -> problem
    doc: str = ""
    # The case is about key != value: unsupported for a plugin with one key/value source.
    distinct_kv: bool = False
    # False: the problem puts NaN or inf in query, key or value on purpose (special values).
    finite: bool = True
    # None: the agreement rule against the float64 oracle; else a property judge.
    judge: Optional[Judge] = None
    # seed -> the square problem (Lq == Lk) for a plugin with one input for query, key and
    # value (``kv_source="self"``); None: ``build``'s problem (``expressible`` adapts it).
    build_self: Optional[Callable[[int], Problem]] = None
    # The case's point does not rest on its mask (a property, say): a ``kv_source="self"``
    # plugin that lacks a feature its mask needs gets the problem unmasked, so a mask-free
    # self-attention module still runs it.
    mask_optional: bool = False

    @property
    def seed(self) -> int:
        return zlib.crc32(f"{self.family}/{self.name}".encode())

    def problem(self) -> Problem:
        return self.build(self.seed).validate(self.finite)

    def problem_for(self, impl: Any) -> Problem:
        """The problem ``impl`` is given (the square one for ``kv_source="self"``)."""
        if declared(impl, "kv_source") != "self":
            return self.problem()
        p = self.problem() if self.build_self is None else \
            self.build_self(self.seed).validate(self.finite)
        if self.mask_optional and frozenset(p.mask.kinds) - frozenset(declared(impl, "features")):
            p = dataclasses.replace(p, mask=Mask())
        return p

    def judge_problem(self, impl: Implementation, out: Outcome, p: Problem) -> Outcome:
        """Run problem ``p`` (this case's, or the same arrays loaded by a reproducer) on
        ``impl`` and classify ``out``."""
        if self.judge is None:
            return run_problem(impl, out, p, distinct_kv=self.distinct_kv)
        return self.judge(impl, out, p)

    def run(self, impl: Implementation, out: Outcome) -> Outcome:
        """Run the case on ``impl`` and classify ``out`` (the conformance tests' judge)."""
        return self.judge_problem(impl, out, self.problem_for(impl))


CASES: List[Case] = []


def case(family: str, name: str, *, distinct_kv: bool = False, finite: bool = True,
         judge: Optional[Judge] = None, into: Optional[List[Case]] = None,
         self_form: Optional[Callable[[int], Problem]] = None, square: Optional[int] = None,
         mask_optional: bool = False):
    """Register a case in ``into`` (default ``CASES``, the agreement cases); which
    declarable behaviours its problem exhibits is read from the problem itself
    (``suite.check.behaviours``), never from a tag. ``self_form``: the seed's square
    self-attention problem (``Case.build_self``) where the case's own is not square or puts
    a special value in key or value; ``square=n``: that problem is ``fn(seed, square=n)``
    (the builder's problem with Lq = Lk = n and one input for query, key and value)."""
    def deco(fn: Callable[[int], Problem]) -> Callable[[int], Problem]:
        nonlocal self_form
        if square is not None:
            self_form = functools.partial(fn, square=square)
        (CASES if into is None else into).append(
            Case(family, name, fn, (fn.__doc__ or "").strip(), distinct_kv, finite, judge,
                 self_form, mask_optional))
        return fn
    return deco


def one_input(p: Problem) -> Problem:
    """Square problem ``p`` as self-attention: key = value = query, the one input holding
    every NaN or inf that ``p`` put in its key or value (so a special value a plugin with one
    input is given is where ``p`` put it, not dropped with the key)."""
    x = p.query.copy()
    for a in (p.key, p.value):
        bad = ~np.isfinite(a)
        x[bad] = a[bad]
    return dataclasses.replace(p, query=x, key=x, value=x)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed + 1)


# --- masking -------------------------------------------------------------------------------
# Lq = 11 queries over Lk = 13 keys; the self-attention form (``kv_source="self"``) of a case
# whose problem is not square is the same mask and padding over Lq = Lk = 13 (SQ).
B, L, E, H = 3, 11, 16, 4
SQ = 13


def _sized(seed: int, square: Optional[int], Lq: int = L, Lk: int = 13, **kw) -> Problem:
    """The problem (B, Lq, Lk), or its self-attention form (B, square, square)."""
    if square is not None:
        return make_problem(seed, B, square, square, E, H, self_attention=True, **kw)
    return make_problem(seed, B, Lq, Lk, E, H, **kw)


def _lq(square: Optional[int]) -> int:
    return L if square is None else square


@case("masking", "none", square=SQ)
def _none(seed, square=None):
    """No mask at all."""
    return _sized(seed, square)


@case("masking", "valid_lens", square=SQ)
def _valid_lens(seed, square=None):
    """Key padding: batch b sees keys j < valid_lens[b]."""
    return _sized(seed, square, mask=Mask(valid_lens=np.array([13, 5, 1])))


@case("masking", "valid_lens_per_query", square=SQ)
def _valid_lens_2d(seed, square=None):
    """valid_lens of shape (B, Lq): a length per query row."""
    vl = _rng(seed).integers(1, 14, size=(B, _lq(square)))
    return _sized(seed, square, mask=Mask(valid_lens=vl))


@case("masking", "causal")
def _causal(seed):
    """Causal self-shaped attention, Lq == Lk."""
    return make_problem(seed, B, L, L, E, H, mask=Mask(causal=True))


@case("masking", "causal_top_left_short_query")
def _causal_tl_short(seed):
    """Causal, Lq < Lk, top-left aligned: query i sees keys j <= i."""
    return make_problem(seed, B, 7, 12, E, H, mask=Mask(causal=True))


@case("masking", "causal_top_left_long_query")
def _causal_tl_long(seed):
    """Causal, Lq > Lk, top-left aligned."""
    return make_problem(seed, B, 12, 7, E, H, mask=Mask(causal=True))


@case("masking", "causal_bottom_right_short_query")
def _causal_br_short(seed):
    """Causal, Lq < Lk, bottom-right aligned: query i sees keys j <= i + Lk - Lq."""
    return make_problem(seed, B, 7, 12, E, H, mask=Mask(causal=True, causal_align="bottom_right"))


@case("masking", "causal_bottom_right_long_query")
def _causal_br_long(seed):
    """Causal, Lq > Lk, bottom-right aligned: the first Lq - Lk rows see no key."""
    return make_problem(seed, B, 12, 7, E, H, mask=Mask(causal=True, causal_align="bottom_right"))


@case("masking", "bool_mask", square=SQ)
def _bool_mask(seed, square=None):
    """A boolean (B, H, Lq, Lk) mask, True = may attend (every row keeps one key)."""
    allowed = _rng(seed).random((B, H, _lq(square), 13)) < 0.6
    allowed[..., 0] = True
    return _sized(seed, square, mask=Mask(allowed=allowed))


@case("masking", "bool_mask_broadcast", square=SQ)
def _bool_mask_bcast(seed, square=None):
    """A boolean (Lq, Lk) mask broadcast over batch and heads."""
    allowed = _rng(seed).random((_lq(square), 13)) < 0.5
    allowed[:, 3] = True
    return _sized(seed, square, mask=Mask(allowed=allowed))


@case("masking", "bias", square=SQ)
def _bias(seed, square=None):
    """An additive float (B, H, Lq, Lk) bias."""
    bias = 2.0 * _rng(seed).standard_normal((B, H, _lq(square), 13))
    return _sized(seed, square, mask=Mask(bias=bias))


@case("masking", "bias_broadcast", square=SQ)
def _bias_bcast(seed, square=None):
    """An additive (1, H, 1, Lk) bias, ALiBi-like, broadcast over batch and queries."""
    bias = -0.5 * np.arange(13)[None, None, None, :] * np.arange(1, H + 1)[None, :, None, None]
    return _sized(seed, square, mask=Mask(bias=bias))


@case("masking", "bias_as_mask", square=SQ)
def _bias_as_mask(seed, square=None):
    """A 0/-inf additive bias: must agree with the equivalent boolean mask."""
    allowed = _rng(seed).random((B, 1, _lq(square), 13)) < 0.6
    allowed[..., 2] = True
    return _sized(seed, square, mask=Mask(bias=np.where(allowed, 0.0, -np.inf)))


@case("masking", "combined")
def _combined(seed):
    """valid_lens AND causal AND a boolean mask, plus a bias."""
    rng = _rng(seed)
    allowed = rng.random((B, 1, L, L)) < 0.7
    allowed[..., 0] = True
    return make_problem(seed, B, L, L, E, H, mask=Mask(
        valid_lens=np.array([L, 6, 2]), causal=True, allowed=allowed,
        bias=rng.standard_normal((1, H, L, L))))


def _padded(seed: int, fill: float, Lq: int = L, Lk: int = 13, lens: tuple = (13, 5, 9),
            square: Optional[int] = None) -> Problem:
    """Key padding by ``lens`` (B,) with ``fill`` in the padded keys and values; in the
    self-attention form (``square``) the one input's padded positions hold it, so the padded
    query rows do too: the spec is what they read (a NaN query row is NaN, a garbage one
    attends the unpadded keys), and no other row may change."""
    p = _sized(seed, square, Lq, Lk, mask=Mask(valid_lens=np.array(lens)))
    key, value = p.key.copy(), p.value.copy()
    for b, n in enumerate(p.mask.valid_lens):
        key[b, n:] = fill
        value[b, n:] = fill
    if square is not None:  # query = key = value: one array
        return dataclasses.replace(p, query=key, key=key, value=key)
    return dataclasses.replace(p, key=key, value=value)


@case("masking", "nan_padding", finite=False, square=SQ)
def _nan_padding(seed, square=None):
    """Padded keys and values hold NaN: the unpadded output must not change."""
    return _padded(seed, np.nan, square=square)


@case("masking", "garbage_padding", square=SQ)
def _garbage_padding(seed, square=None):
    """Padded keys and values hold 1e4 garbage: the unpadded output must not change."""
    return _padded(seed, 1e4, square=square)


@case("masking", "nan_padding_one_query")
def _nan_padding_one_query(seed):
    """One query (decoding) over 300 keys, padded keys and values hold NaN: lengths 37, 152
    and 300 (a split-K decode kernel's splits: 37 ends inside one, 152 on a boundary for
    splits of 19 or 38 keys, as pallas.gpu.decode's 16 splits of 300 keys padded to 304)."""
    return _padded(seed, np.nan, Lq=1, Lk=300, lens=(37, 152, 300))


@case("masking", "fully_masked_valid_lens", square=SQ)
def _fully_masked_vl(seed, square=None):
    """valid_lens 0 for one batch item: its rows attend to nothing, so output = b_o."""
    return _sized(seed, square, mask=Mask(valid_lens=np.array([13, 0, 4])))


@case("masking", "fully_masked_bool_row", square=SQ)
def _fully_masked_bool(seed, square=None):
    """A boolean mask with all-False query rows: those rows give a zero head output."""
    allowed = _rng(seed).random((B, H, _lq(square), 13)) < 0.6
    allowed[..., 0] = True
    allowed[1, :, 3] = False
    allowed[0, 2, 5] = False
    return _sized(seed, square, mask=Mask(allowed=allowed))


# --- shapes --------------------------------------------------------------------------------
@case("shapes", "batch_1")
def _batch_1(seed):
    """B = 1."""
    return make_problem(seed, 1, 9, 9, 16, 2)


@case("shapes", "length_1")
def _length_1(seed):
    """Lq = Lk = 1."""
    return make_problem(seed, 2, 1, 1, 16, 2)


@case("shapes", "query_length_1")
def _query_length_1(seed):
    """A single query over many keys (decoding)."""
    return make_problem(seed, 2, 1, 37, 16, 2)


@case("shapes", "odd_lengths", square=113)
def _odd(seed, square=None):
    """Lq = 113, Lk = 203: no tile or vector width divides them (self-attention: 113)."""
    if square is not None:
        return make_problem(seed, 2, square, square, 32, 4, self_attention=True)
    return make_problem(seed, 2, 113, 203, 32, 4)


@case("shapes", "cross_key_ne_value", distinct_kv=True)
def _cross(seed):
    """Cross-attention, Lq != Lk, key != value."""
    return make_problem(seed, 2, 5, 17, 24, 3)


@case("shapes", "one_head")
def _one_head(seed):
    """H = 1: the whole width is one head."""
    return make_problem(seed, 2, 10, 10, 16, 1)


@case("shapes", "many_heads")
def _many_heads(seed):
    """H = 16 heads of width 4: head i owns columns [4i, 4i+4)."""
    return make_problem(seed, 2, 10, 10, 64, 16)


@case("shapes", "head_width_1")
def _head_width_1(seed):
    """D = 1 (H = E)."""
    return make_problem(seed, 2, 6, 6, 8, 8)


@case("shapes", "gqa")
def _gqa(seed):
    """GQA: H = 8 query heads share K = 2 kv heads; query head h reads kv head h // 4."""
    return make_problem(seed, 2, 9, 9, 32, 8, 2)


@case("shapes", "gqa_groups_of_2", square=11)
def _gqa2(seed, square=None):
    """GQA with H = 4, K = 2: h // 2 and h % 2 differ for heads 1 and 2."""
    if square is not None:
        return make_problem(seed, 2, square, square, 32, 4, 2, self_attention=True)
    return make_problem(seed, 2, 9, 11, 32, 4, 2)


@case("shapes", "mqa")
def _mqa(seed):
    """MQA: one kv head for all H = 4 query heads."""
    return make_problem(seed, 2, 9, 9, 32, 4, 1)


@case("shapes", "no_projection_bias")
def _no_bias(seed):
    """Projections without biases."""
    return make_problem(seed, 2, 8, 8, 16, 2, bias=False)


@case("shapes", "self_attention")
def _self(seed):
    """query, key and value are one array."""
    return make_problem(seed, 2, 12, 12, 16, 4, self_attention=True)


# --- numerics ------------------------------------------------------------------------------
@case("numerics", "large_logits")
def _large_logits(seed):
    """Inputs scaled x30: logits in the hundreds must not overflow the softmax."""
    return make_problem(seed, 2, 16, 16, 32, 2, input_scale=30.0)


@case("numerics", "explicit_scale")
def _explicit_scale(seed):
    """An explicit scale 0.37 instead of 1/sqrt(D)."""
    return make_problem(seed, 2, 10, 10, 32, 4, scale=0.37)


@case("numerics", "negative_scale")
def _negative_scale(seed):
    """A negative scale -0.6: the softmax favours the least similar key."""
    return make_problem(seed, 2, 10, 10, 32, 4, scale=-0.6)


@case("numerics", "long_rows", square=1024)
def _long_rows(seed, square=None):
    """Lk = 1024: the softmax sum accumulates many terms (self-attention: Lq = Lk = 1024)."""
    if square is not None:
        return make_problem(seed, 1, square, square, 32, 2, self_attention=True)
    return make_problem(seed, 1, 16, 1024, 32, 2)


@case("numerics", "wide_heads")
def _wide_heads(seed):
    """D = 128: the q.k dot products accumulate many terms."""
    return make_problem(seed, 1, 16, 16, 256, 2)



# --- tiles ---------------------------------------------------------------------------------
# CPU kernels tile keys (and queries) in blocks: torch's CPU flash attention splits keys in
# 512s and queries in 32/64/256s by length, numpy.flash in 512s (256s causal), inductor and
# FlexAttention in 64-128s. Bugs live where a length is one off a block, where a whole
# block is masked for a row, and past the first few blocks. Small B, H and E keep each
# case one cheap problem (README: the family's time per implementation).
TE, TH = 16, 2  # model width and heads: D = 8


PADDED_LENGTHS = [n + d for n in (64, 128, 256, 512, 1024) for d in (-1, 0, 1)]


@case("tiles", "padding_across_blocks")
def _tiles_padding(seed):
    """Key padding ending one below, at and one above 64, 128, 256, 512 and 1024 keys: one
    batch item each (B = 15), Lk = 1025, Lq = 17 (one problem: one compile for compiled
    plugins)."""
    return make_problem(seed, len(PADDED_LENGTHS), 17, 1025, TE, TH,
                        mask=Mask(valid_lens=np.array(PADDED_LENGTHS)))


def _tiles_square(seed: int, n: int, mask: Optional[Mask] = None) -> Problem:
    """The self-attention form of a tiles case: Lq = Lk = n, one input."""
    return make_problem(seed, 1, n, n, TE, TH, mask=mask, self_attention=True)


@case("tiles", "unmasked_129x1025", square=1025)
def _tiles_unmasked_long_keys(seed, square=None):
    """No mask, Lq = 129, Lk = 1025: one query and one key past a block, three key blocks
    (self-attention: Lq = Lk = 1025)."""
    if square is not None:
        return _tiles_square(seed, square)
    return make_problem(seed, 1, 129, 1025, TE, TH)


@case("tiles", "unmasked_1023x255", square=1023)
def _tiles_unmasked_long_queries(seed, square=None):
    """No mask, Lq = 1023, Lk = 255: query blocks one short of 1024, keys one short of 256
    (self-attention: Lq = Lk = 1023)."""
    if square is not None:
        return _tiles_square(seed, square)
    return make_problem(seed, 1, 1023, 255, TE, TH)


@case("tiles", "causal_513")
def _tiles_causal_square(seed):
    """Causal, Lq = Lk = 513: the diagonal crosses a 512 block by one row and one key."""
    return make_problem(seed, 1, 513, 513, TE, TH, mask=Mask(causal=True))


def _causal_case(L: int, S: int, align: str):
    def build(seed: int) -> Problem:
        return make_problem(seed, 1, L, S, TE, TH, mask=Mask(causal=True, causal_align=align))
    what = {("top_left", True): "keys past Lq are masked for every row: whole blocks",
            ("top_left", False): "rows past Lk see every key",
            ("bottom_right", True): "every row sees the first Lk - Lq keys: whole blocks",
            ("bottom_right", False): f"the first {L - S} rows see no key: whole query blocks "
                                     "with nothing to attend"}[(align, L < S)]
    build.__doc__ = f"Causal {align.replace('_', '-')}, Lq = {L}, Lk = {S}: {what}."
    return build


for _L, _S in ((255, 1025), (1025, 257)):
    for _align in ("top_left", "bottom_right"):
        case("tiles", f"causal_{_align}_{_L}x{_S}")(_causal_case(_L, _S, _align))


def _block_allowed(seed: int, L: int = 40, S: int = 1025) -> np.ndarray:
    """(1, 1, L, S) rows that each have a whole 512-key block (so every smaller power-of-two
    block in it) masked: the first, the middle, the last two, all but the last key, all but
    the first key; the other rows are random with most keys kept."""
    allowed = _rng(seed).random((1, 1, L, S)) < 0.8
    allowed[..., 0] = True
    groups = np.arange(L) % 5
    allowed[0, 0, groups == 0, :512] = False  # first block empty
    allowed[0, 0, groups == 1, 512:1024] = False  # middle block empty
    allowed[0, 0, groups == 2, 512:] = False  # last (partial) blocks empty
    allowed[0, 0, groups == 3, :S - 1] = False  # only the last key: every block but one empty
    allowed[0, 0, groups == 4, 1:] = False  # only the first key
    allowed[0, 0, groups == 0, 512:] |= _rng(seed + 1).random(S - 512) < 0.5  # keeps keys
    return allowed


@case("tiles", "masked_blocks_bool", square=1025)
def _tiles_masked_blocks(seed, square=None):
    """A boolean (1, 1, Lq, Lk) mask, Lq = 40, Lk = 1025: rows whose first, middle or last
    512-key block is masked whole, or all but the last key, or all but the first
    (self-attention: the same row patterns over Lq = Lk = 1025)."""
    if square is not None:
        return _tiles_square(seed, square, Mask(allowed=_block_allowed(seed, square)))
    return make_problem(seed, 1, 40, 1025, TE, TH, mask=Mask(allowed=_block_allowed(seed)))


@case("tiles", "masked_blocks_additive", square=1025)
def _tiles_masked_blocks_additive(seed, square=None):
    """The masked_blocks_bool pattern as an additive 0 / -inf float bias (the float-mask path)."""
    allowed = _block_allowed(seed, 40 if square is None else square)
    mask = Mask(bias=np.where(allowed, 0.0, -np.inf))
    if square is not None:
        return _tiles_square(seed, square, mask)
    return make_problem(seed, 1, 40, 1025, TE, TH, mask=mask)


# --- special values ------------------------------------------------------------------------
# NaN and inf where a mask does not hide them, -inf and finfo.min in an additive mask,
# subnormal and huge magnitudes. The spec (suite.oracle, README "Special values"): IEEE
# arithmetic over the keys a row may attend; a masked key is dropped, never multiplied by 0.
# The self-attention form (``kv_source="self"``) is square, Lq = Lk = 13 (11 for the causal
# cases), with each special value in the one input where the case puts it in query, key or
# value: it is then in that position's query, key and value, and reaches the rows that read
# that key and the position's own row.
SB, SL, SS = 2, 11, 13


def _special(seed: int, L: int = SL, S: int = SS, mask: Optional[Mask] = None,
             square: Optional[int] = None, **kw) -> Problem:
    if square is not None:
        return make_problem(seed, SB, square, square, TE, TH, mask=mask, self_attention=True,
                            **kw)
    return make_problem(seed, SB, L, S, TE, TH, mask=mask, **kw)


def _sl(square: Optional[int]) -> int:
    """Query rows of a special-values problem (the self-attention form: ``square``)."""
    return SL if square is None else square


def _ss(square: Optional[int]) -> int:
    """Keys of a special-values problem (the self-attention form: ``square``)."""
    return SS if square is None else square


def _put(p: Problem, name: str, index: tuple, value: float, square: Optional[int] = None
         ) -> Problem:
    """``p`` with ``value`` at ``index`` of input ``name``; in the self-attention form
    (``square``) in the one input, which is query, key and value."""
    arr = getattr(p, name).copy()
    arr[index] = value
    if square is not None:
        return dataclasses.replace(p, query=arr, key=arr, value=arr)
    return dataclasses.replace(p, **{name: arr})


@case("special_values", "nan_query", finite=False, square=SS)
def _nan_query(seed, square=None):
    """NaN in one element of query row (b=1, i=4): that output row is NaN, no other
    (self-attention: the NaN is key 4 too, so every row of batch 1 is NaN, batch 0 right)."""
    return _put(_special(seed, square=square), "query", (1, 4, 3), np.nan, square)


@case("special_values", "inf_query", finite=False, square=SS)
def _inf_query(seed, square=None):
    """+inf in query row (b=0, i=2): its logits mix +inf and -inf terms, so the row is NaN."""
    return _put(_special(seed, square=square), "query", (0, 2, 7), np.inf, square)


@case("special_values", "nan_key_causal", finite=False, square=SL)
def _nan_key(seed, square=None):
    """NaN in unmasked key (b=0, j=5), causal: rows i >= 5 of batch 0 are NaN; rows i < 5
    may not attend it and must be right."""
    return _put(_special(seed, SL, SL, Mask(causal=True), square), "key", (0, 5, 2), np.nan,
                square)


@case("special_values", "neg_inf_key_causal", finite=False, square=SL)
def _neg_inf_key(seed, square=None):
    """-inf in unmasked key (b=1, j=3), causal: rows i >= 3 of batch 1 are NaN (their logits
    mix +inf and -inf), rows i < 3 must be right."""
    return _put(_special(seed, SL, SL, Mask(causal=True), square), "key", (1, 3, 0), -np.inf,
                square)


@case("special_values", "nan_value_causal", finite=False, square=SL)
def _nan_value(seed, square=None):
    """NaN in unmasked value (b=1, j=6), causal: rows i >= 6 of batch 1 are NaN, rows i < 6
    must be right (a masked value is dropped, not weighted by 0)."""
    return _put(_special(seed, SL, SL, Mask(causal=True), square), "value", (1, 6, 0), np.nan,
                square)


@case("special_values", "inf_value_bool_mask", finite=False, square=SS)
def _inf_value(seed, square=None):
    """+inf in value (b=0, j=2) under a boolean mask: the rows that may attend key 2 are NaN
    (after the output projection), the rows that may not must be right."""
    allowed = _rng(seed).random((SB, 1, _sl(square), _ss(square))) < 0.6
    allowed[..., 0] = True
    allowed[0, 0, :5, 2] = False  # rows 0-4 may not attend it
    allowed[0, 0, 5:, 2] = True
    return _put(_special(seed, mask=Mask(allowed=allowed), square=square), "value", (0, 2, 5),
                np.inf, square)


@case("special_values", "inf_bias_entry", square=SS)
def _inf_bias(seed, square=None):
    """+inf in bias entry (b=0, h=1, i=3, j=4): logit - row max is inf - inf, so row (0, 3)
    of head 1, and through the output projection output row (0, 3), is NaN; no other row."""
    bias = _rng(seed).standard_normal((SB, TH, _sl(square), _ss(square)))
    bias[0, 1, 3, 4] = np.inf
    return _special(seed, mask=Mask(bias=bias), square=square)


@case("special_values", "neg_inf_bias_rows", square=SS)
def _neg_inf_bias(seed, square=None):
    """-inf bias entries are masked keys; a row of -inf (b=1, h=0, i=2) is a fully masked row
    (zero head output), and a row with only its last key finite attends that key alone."""
    rng = _rng(seed)
    shape = (SB, TH, _sl(square), _ss(square))
    bias = np.where(rng.random(shape) < 0.4, -np.inf, rng.standard_normal(shape))
    bias[..., 0] = 0.5
    bias[1, 0, 2] = -np.inf
    bias[0, 1, 6, :-1] = -np.inf
    return _special(seed, mask=Mask(bias=bias), square=square)


def _finfo_min_case(dtype: type):
    def build(seed: int, square: Optional[int] = None) -> Problem:
        allowed = _rng(seed).random((SB, TH, _sl(square), _ss(square))) < 0.6
        allowed[..., 1] = True
        bias = np.where(allowed, 0.0, float(np.finfo(dtype).min))
        return _special(seed, mask=Mask(bias=bias), square=square)
    build.__doc__ = (f"An additive mask of 0 and finfo({np.dtype(dtype).name}).min (every row keeps "
                     "a key): exp underflows to exactly 0, so it equals the boolean mask.")
    return build


for _dt in (np.float32, np.float16):
    case("special_values", f"finfo_min_mask_{np.dtype(_dt).name}", square=SS)(
        _finfo_min_case(_dt))


@case("special_values", "subnormal_inputs", square=SS)
def _subnormal(seed, square=None):
    """query, key and value at 1e-40 (subnormal in float32 and bfloat16, 0 in float16): the
    logits are ~0, the weights uniform, the output the output bias; no NaN from 0 / 0."""
    p = _special(seed, square=square)
    if square is not None:
        x = 1e-40 * p.query
        return dataclasses.replace(p, query=x, key=x, value=x)
    return dataclasses.replace(p, query=1e-40 * p.query, key=1e-40 * p.key, value=1e-40 * p.value)


@case("special_values", "subnormal_weights", square=SS)
def _subnormal_weights(seed, square=None):
    """A bias of -90 .. -100 on every key but one a row: those weights are ~1e-40, subnormal
    in float32 (flushed to zero by some kernels, which the rule allows)."""
    bias = -_rng(seed).uniform(90, 100, (SB, TH, _sl(square), _ss(square)))
    bias[..., 3] = 0.0
    return _special(seed, mask=Mask(bias=bias), square=square)


@case("special_values", "huge_values", square=SS)
def _huge_values(seed, square=None):
    """value x 3000: outputs in the thousands, within float16's range (65504) (self-attention:
    the value projection x 3000, as the one input is also query and key)."""
    p = _special(seed, square=square)
    if square is not None:
        w = p.weights
        return dataclasses.replace(p, weights=dataclasses.replace(
            w, w_v=3000.0 * w.w_v, b_v=None if w.b_v is None else 3000.0 * w.b_v))
    return dataclasses.replace(p, value=3000.0 * p.value)


# --- lanes: lengths across one and two SIMD vectors ------------------------------------------
# A CPU kernel's vector loop runs over whole vectors of keys (8 float32 lanes with AVX2, 16
# with AVX-512; 4 and 8 float64) and a scalar or masked tail after them: a key length under one
# vector runs the tail alone, and a bug there exists on one CPU and not the next. These cases
# put a NaN query row, NaN padding and rows with no key at key (and query) lengths on both
# sides of one and two vectors of every dtype and instruction-set level.
LANE_LENGTHS = (1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33)
LB, LE, LH = 2, 16, 2


def _lanes_nan_query(S: int):
    def build(seed: int) -> Problem:
        p = make_problem(seed, LB, S, S, LE, LH)
        return _put(p, "query", (1, S // 2, 3), np.nan)
    build.__doc__ = (f"Lq = Lk = {S}, no mask: NaN in query row (b=1, i={S // 2}); that output "
                     "row is NaN, no other.")
    return build


def _lanes_fully_masked(S: int):
    def build(seed: int) -> Problem:
        lens = np.arange(S)[None, :] % (S + 1) * np.array([[1], [0]])  # batch 1: no key at all
        lens[0, ::3] = 0  # every third row of batch 0 too
        return make_problem(seed, LB, S, S, LE, LH, mask=Mask(valid_lens=lens))
    build.__doc__ = (f"Lq = Lk = {S}, a key length per query row (row i sees i keys; every "
                     "third row of batch 0 and all of batch 1 see none): zero head outputs.")
    return build


def _lanes_nan_padding(S: int):
    def build(seed: int, square: Optional[int] = None) -> Problem:
        lens = np.array([S, max(1, S - 1 - S // 3)])
        p = make_problem(seed, LB, S, S, LE, LH, mask=Mask(valid_lens=lens),
                         self_attention=square is not None)
        pad = np.arange(S) >= lens[:, None]  # (B, S)
        key, value = p.key.copy(), p.value.copy()
        key[pad], value[pad] = np.nan, np.nan
        if square is not None:  # the one input: its padded query rows are NaN too
            return dataclasses.replace(p, query=key, key=key, value=key)
        return dataclasses.replace(p, key=key, value=value)
    build.__doc__ = (f"Lq = Lk = {S}, key lengths ({S}, {max(1, S - 1 - S // 3)}), padded keys "
                     "and values NaN: the output is unchanged, no NaN anywhere.")
    return build


for _S in LANE_LENGTHS:
    case("lanes", f"nan_query_S{_S}", finite=False)(_lanes_nan_query(_S))
    case("lanes", f"fully_masked_S{_S}")(_lanes_fully_masked(_S))
    if _S > 1:  # one key cannot be padded
        case("lanes", f"nan_padding_S{_S}", finite=False, square=_S)(_lanes_nan_padding(_S))


# --- layouts: the same problem in the memory layouts models hand kernels ------------------------
# Per-head q, k, v and the mask reach the kernel as strided views, slices and stride-0
# broadcasts (suite.layouts); the oracle reads the canonical arrays. Three problems per
# layout: cross-attention unmasked (L != S, so a stride read for the wrong length shows), with
# an additive bias of shape (B, 1, L, S) with -inf holes (the mask broadcast over heads), and
# causal self-attention (the is_causal paths); `expanded` poses them multi-query (one kv
# head broadcast with stride 0 over H = 4 query heads). The self-attention form
# (``kv_source="self"``) of the first two is square, L = S = 9, one input.
YB, YL, YS, YE, YH = 2, 9, 13, 32, 4
_LAYOUT_PROBLEMS = {"none": "cross-attention (L = 9, S = 13), no mask",
                    "bias": "an additive (B, 1, L, S) bias with -inf holes",
                    "causal": "causal self-attention (L = S = 9)"}


def _layout_problem(layout: str, kind: str):
    def build(seed: int, square: Optional[int] = None) -> Problem:
        rng = _rng(seed)
        S = YL if kind == "causal" or square is not None else YS
        K = 1 if layout == "expanded" else YH
        mask = Mask()
        if kind == "bias":
            keep = rng.random((YB, 1, YL, S)) < 0.7
            keep[..., 0] = True
            mask = Mask(bias=np.where(keep, rng.standard_normal(keep.shape), -np.inf))
        elif kind == "causal":
            mask = Mask(causal=True)
        p = make_problem(seed, YB, YL, S, YE, YH, K, mask=mask,
                         self_attention=kind == "causal" or square is not None)
        return with_layout(p, layout)
    build.__doc__ = f"{LAYOUTS[layout]}; {_LAYOUT_PROBLEMS[kind]}."
    return build


def _layout_judge(layout: str) -> Judge:
    def judge(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
        if layout not in declared(impl, "layouts"):
            return out.classify("unsupported", f"does not declare layout {layout}")
        return run_problem(impl, out, p)
    return judge


for _layout in LAYOUTS:
    for _kind in ("none", "bias", "causal"):
        case("layouts", _layout if _kind == "none" else f"{_layout}+{_kind}",
             judge=_layout_judge(_layout), square=None if _kind == "causal" else YL)(
            _layout_problem(_layout, _kind))


# --- variants: the score variants with the masks they meet (suite.variant_cases) ------------
for _name, _build, _kw in variant_cases.BUILDERS:
    case(variant_cases.FAMILY, _name, **_kw)(_build)


# --- decode: query rows at offsets into a key/value cache (suite.decode_cases) ---------------
for _name, _build, _kw in decode_cases.BUILDERS:
    case(decode_cases.FAMILY, _name, **_kw)(_build)


# --- generation: a prefill and decode steps against the module's own cache -----------------
for _name, _build, _kw in generation_cases.BUILDERS:
    case(generation_cases.FAMILY, _name, **_kw)(_build)


# --- packed: variable-length sequences back to back in one row (suite.packed_cases) ----------
for _name, _build, _kw in packed_cases.BUILDERS:
    case(packed_cases.FAMILY, _name, **_kw)(_build)


# --- paged: the decode form's cache in a pool of blocks, read through a table (paged_cases) ---
for _name, _build, _kw in paged_cases.BUILDERS:
    case(paged_cases.FAMILY, _name, **_kw)(_build)


# --- dropout: training mode, judged by the draws' mean and spread (suite.dropout_cases) -----
for _name, _build, _kw in dropout_cases.BUILDERS:
    case(dropout_cases.FAMILY, _name, **_kw)(_build)


def by_family() -> Dict[str, List[Case]]:
    out: Dict[str, List[Case]] = {}
    for c in CASES:
        out.setdefault(c.family, []).append(c)
    return out


def get(family: str, name: str) -> Case:
    for c in CASES:
        if c.family == family and c.name == name:
            return c
    raise KeyError(f"unknown case {family}/{name}")
