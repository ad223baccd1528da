"""The tiles family: lengths that cross the blocks of real CPU/GPU kernels, whole key blocks
masked, padding that ends inside a block."""

from __future__ import annotations

from typing import Optional

import numpy as np

from suite.conformance.families.declare import family
from suite.conformance.families.declare import rng as seeded_rng
from suite.spec.problem import Mask, Problem, make_problem

FAMILY = "tiles"
BUILDERS, case = family(FAMILY)

# --- tiles ---------------------------------------------------------------------------------
# CPU kernels tile keys (and queries) in blocks: torch's CPU flash attention splits keys in
# 512s and queries in 32/64/256s by length, numpy.flash in 512s (256s causal), inductor and
# FlexAttention in 64-128s. Bugs live where a length is one off a block, where a whole
# block is masked for a row, and past the first few blocks. Small B, H and E keep each
# case one cheap problem (README: the family's time per implementation).
TE, TH = 16, 2  # model width and heads: D = 8


PADDED_LENGTHS = [n + d for n in (64, 128, 256, 512, 1024) for d in (-1, 0, 1)]


@case("padding_across_blocks")
def _tiles_padding(seed):
    """Key padding ending one below, at and one above 64, 128, 256, 512 and 1024 keys: one
    batch item each (B = 15), Lk = 1025, Lq = 17 (one problem: one compile for compiled
    plugins)."""
    return make_problem(seed, len(PADDED_LENGTHS), 17, 1025, TE, TH,
                        mask=Mask(valid_lens=np.array(PADDED_LENGTHS)))


def _tiles_square(seed: int, n: int, mask: Optional[Mask] = None) -> Problem:
    """The self-attention form of a tiles case: Lq = Lk = n, one input."""
    return make_problem(seed, 1, n, n, TE, TH, mask=mask, self_attention=True)


@case("unmasked_129x1025", square=1025)
def _tiles_unmasked_long_keys(seed, square=None):
    """No mask, Lq = 129, Lk = 1025: one query and one key past a block, three key blocks
    (self-attention: Lq = Lk = 1025)."""
    if square is not None:
        return _tiles_square(seed, square)
    return make_problem(seed, 1, 129, 1025, TE, TH)


@case("unmasked_1023x255", square=1023)
def _tiles_unmasked_long_queries(seed, square=None):
    """No mask, Lq = 1023, Lk = 255: query blocks one short of 1024, keys one short of 256
    (self-attention: Lq = Lk = 1023)."""
    if square is not None:
        return _tiles_square(seed, square)
    return make_problem(seed, 1, 1023, 255, TE, TH)


@case("causal_513")
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
        case(f"causal_{_align}_{_L}x{_S}")(_causal_case(_L, _S, _align))


def _block_allowed(seed: int, L: int = 40, S: int = 1025) -> np.ndarray:
    """(1, 1, L, S) rows that each have a whole 512-key block (so every smaller power-of-two
    block in it) masked: the first, the middle, the last two, all but the last key, all but
    the first key; the other rows are random with most keys kept."""
    allowed = seeded_rng(seed).random((1, 1, L, S)) < 0.8
    allowed[..., 0] = True
    groups = np.arange(L) % 5
    allowed[0, 0, groups == 0, :512] = False  # first block empty
    allowed[0, 0, groups == 1, 512:1024] = False  # middle block empty
    allowed[0, 0, groups == 2, 512:] = False  # last (partial) blocks empty
    allowed[0, 0, groups == 3, :S - 1] = False  # only the last key: every block but one empty
    allowed[0, 0, groups == 4, 1:] = False  # only the first key
    allowed[0, 0, groups == 0, 512:] |= seeded_rng(seed + 1).random(S - 512) < 0.5  # keeps keys
    return allowed


@case("masked_blocks_bool", square=1025)
def _tiles_masked_blocks(seed, square=None):
    """A boolean (1, 1, Lq, Lk) mask, Lq = 40, Lk = 1025: rows whose first, middle or last
    512-key block is masked whole, or all but the last key, or all but the first
    (self-attention: the same row patterns over Lq = Lk = 1025)."""
    if square is not None:
        return _tiles_square(seed, square, Mask(allowed=_block_allowed(seed, square)))
    return make_problem(seed, 1, 40, 1025, TE, TH, mask=Mask(allowed=_block_allowed(seed)))


@case("masked_blocks_additive", square=1025)
def _tiles_masked_blocks_additive(seed, square=None):
    """The masked_blocks_bool pattern as an additive 0 / -inf float bias (the float-mask path)."""
    allowed = _block_allowed(seed, 40 if square is None else square)
    mask = Mask(bias=np.where(allowed, 0.0, -np.inf))
    if square is not None:
        return _tiles_square(seed, square, mask)
    return make_problem(seed, 1, 40, 1025, TE, TH, mask=mask)


