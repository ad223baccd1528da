"""The paged family: the decode form with its key/value cache paged into a shared pool of
fixed-size blocks read through a per-sequence block table (``Problem.paging``, feature
``paged``; the pool from ``suite.spec.paging.paged_cache``), as serving kernels read it.

Each case is a decode problem (``suite.conformance.families.decode.decode_problem``: rows at per-sequence
offsets against a cache filled to per-sequence lengths) plus its paging. The oracle judges
the logical problem, so a kernel that reads one block off, reads a page with the wrong
size, or reads past a sequence's last block into the pool's garbage is far off. The table
is shuffled (a sequence's blocks are nowhere near each other, nor in order), the pool holds
the other sequences' blocks and unused blocks full of large garbage, and the table's
unused entries point at garbage blocks. Cases: one row per sequence over a shuffled table,
a page size that divides no length, lengths that end exactly on a block boundary (the next
entry is garbage), a prefix of blocks shared read-only by sequences (one of them ending
inside a shared block), GQA and MQA caches, a few rows per sequence at the cache's end, and
rows at offsets inside the cache (causality at the offset hides the later tokens); one row
per sequence masked by its length alone, no causal mask (vLLM's form), so that only the
length hides the tail of a sequence's last page (garbage, or another sequence's tokens in a
shared block); and one module's paged and unpaged reads of one cache agreeing
(``agrees_with_unpaged``); with a score variant (issue 50): a cap, sinks with GQA, ALiBi at
rows inside the cache, sinks beside a sliding window (gpt-oss's windowed layers), a score
modifier that reads positions at rows inside the cache (its j a key's logical slot, never
where the pool holds it), and the paged and unpaged reads agreeing under a cap. The plugin
is handed the pool as the only copy of the cache (``suite.spec.paging.pool_only``): the
logical key and value it also gets hold garbage.

A plugin without ``paged`` reports every case unsupported (``suite.spec.paging`` says why).
``suite.conformance.cases`` registers ``BUILDERS`` into its ``CASES`` (this module does not import it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from suite.conformance.families.declare import family
from suite.conformance.families.decode import decode_problem
from suite.spec.paging import Paging, blocks_used, lengths_of
from suite.spec.problem import Mask, Problem
from suite.spec.variants import SCORE_MODS, Alibi, alibi_slopes

FAMILY = "paged"
BUILDERS, case = family(FAMILY)  # (name, seed -> problem, Case keywords), in order




def paged(p: Problem, seed: int, page_size: int, spare: int = 6,
          shared: Sequence[Tuple[int, int, int]] = ()) -> Problem:
    """``p`` (a decode problem) with its cache paged in blocks of ``page_size`` slots: each
    sequence's blocks drawn at random from a shuffled pool that also holds ``spare`` unused
    blocks (garbage), the table's unused entries pointing at those. ``shared``: (sequence,
    source, n) gives ``sequence`` the first n blocks of ``source`` (prefix sharing): its
    first n * P filled slots become the source's tokens, and both tables name the same
    blocks."""
    key, value = p.key.copy(), p.value.copy()
    lengths = lengths_of(p)
    P, S = page_size, p.S
    used = blocks_used(lengths, P)
    borrowed = {b: (src, n) for b, src, n in shared}
    own = sum(int(u) - (borrowed[b][1] if b in borrowed else 0) for b, u in enumerate(used))
    N = own + spare
    rng = np.random.default_rng(seed + 2)
    order = iter(rng.permutation(N).tolist())  # block ids in the order they are handed out
    T = -(-S // P)
    table = np.zeros((p.B, T), np.int64)
    for b in range(p.B):
        start = 0
        if b in borrowed:  # the source's first blocks, and its tokens in them
            src, n = borrowed[b]
            table[b, :n] = table[src, :n]
            filled = min(n * P, int(lengths[b]))
            key[b, :filled], value[b, :filled] = key[src, :filled], value[src, :filled]
            start = n
        for t in range(start, int(used[b])):
            table[b, t] = next(order)
    unused = list(order)  # the spare blocks: garbage only
    for b in range(p.B):  # entries past a sequence's last block: any block, here garbage
        table[b, used[b]:] = rng.choice(unused, T - int(used[b]))
    return dataclasses.replace(p, key=key, value=value,
                               paging=Paging(P, table, N, seed=seed + 3))


def paged_decode(seed: int, L: int, lengths: Optional[Sequence[int]], page_size: int,
                 offsets: Optional[Sequence[int]] = None, S: int = 16,
                 K: Optional[int] = None, E: int = 16, **kw: Any) -> Problem:
    """``decode_problem(seed, L, lengths, offsets, S, K, E=E)`` paged (``paged``'s
    keywords)."""
    return paged(decode_problem(seed, L, lengths, offsets, S=S, K=K, E=E), seed, page_size,
                 **kw)


@case("shared_prefix")
def _shared_prefix(seed):
    """One row per sequence (lengths 14, 6, 9; pages of 4): sequence 1 shares sequence 0's
    first two blocks and ends inside the second (its slots 6 and 7 there are sequence 0's
    tokens, past its own length), sequence 2 shares the first block. A kernel that writes its
    next token into its last block in place (no copy-on-write) corrupts sequence 0."""
    return paged_decode(seed, 1, [14, 6, 9], 4, shared=[(1, 0, 2), (2, 0, 1)])


@case("one_row_shuffled")
def _one_row_shuffled(seed):
    """A decode step: one row per sequence (lengths 16, 7, 1) over blocks of 4 handed out
    in a shuffled order from a pool with 6 unused garbage blocks."""
    return paged_decode(seed, 1, [16, 7, 1], 4)


@case("wide_pages")
def _wide_pages(seed):
    """Pages of 16 slots and heads 16 wide (E = 64; lengths 40, 17, 3 in a 48-slot cache):
    the sizes GPU paged kernels are built for (powers of two, at least 16), where the other
    cases' pages of 3 to 5 slots and heads of 4 are what a kernel may refuse."""
    return paged_decode(seed, 1, [40, 17, 3], 16, S=48, E=64)


@case("page_not_dividing")
def _page_not_dividing(seed):
    """Pages of 5 slots (lengths 13, 6, 16 and 16 slots: no length, nor the cache, a multiple
    of the page): a kernel that assumes another page size reads the wrong slots."""
    return paged_decode(seed, 1, [13, 6, 16], 5)


@case("block_boundary")
def _block_boundary(seed):
    """Lengths 16, 8 and 4 on pages of 4: every sequence ends exactly on a block boundary,
    so the next table entry (a garbage block) must not be read at all; a static cache of
    24 slots."""
    return paged_decode(seed, 1, [16, 8, 4], 4, S=24, spare=10)


@case("gqa")
def _gqa(seed):
    """Two key/value heads for four query heads, paged in blocks of 4 (lengths 16, 8, 2)."""
    return paged_decode(seed, 1, [16, 8, 2], 4, K=2)


@case("mqa")
def _mqa(seed):
    """One key/value head for four query heads, two rows per sequence, pages of 3 (lengths
    12, 16, 3)."""
    return paged_decode(seed, 2, [12, 16, 3], 3, K=1)


@case("few_rows")
def _few_rows(seed):
    """Three rows per sequence (speculative or chunked decoding) at the end of caches filled
    to 16, 9 and 3, pages of 4: row i sees one key more than row i - 1."""
    return paged_decode(seed, 3, [16, 9, 3], 4)


@case("rows_at_offsets")
def _rows_at_offsets(seed):
    """Two rows per sequence at offsets 3, 8 and 0 inside caches filled to 16, 11 and 7
    (pages of 4): causality at the offset hides the later blocks the table still names."""
    return paged_decode(seed, 2, [16, 11, 7], 4, offsets=[3, 8, 0])


def paged_lengths(seed: int, lengths: Sequence[int], page_size: int, S: int = 16,
                  K: Optional[int] = None, E: int = 16, **kw: Any) -> Problem:
    """One row per sequence that sees its whole cache and nothing past its length: key
    padding alone, no causal mask and no offset (the form of vLLM's ``paged_attention``,
    which takes ``seq_lens`` and no causal flag: the row is the sequence's newest token).
    ``decode_problem``'s cache (slots past a length garbage) paged (``paged``'s keywords):
    the length is all that hides the tail of a sequence's last page."""
    p = decode_problem(seed, 1, lengths, S=S, K=K, E=E)
    p = dataclasses.replace(p, mask=Mask(valid_lens=p.mask.valid_lens))
    return paged(p, seed, page_size, **kw)


@case("length_ends_mid_page")
def _length_ends_mid_page(seed):
    """A decode step as vLLM's kernel takes it, by lengths alone (13, 6, 10 on pages of 4,
    no causal mask): every sequence ends inside its last page, whose tail holds garbage that
    only the length hides. A kernel that reads whole pages is far off."""
    return paged_lengths(seed, [13, 6, 10], 4)


@case("shared_block_tail")
def _shared_block_tail(seed):
    """By lengths alone (14, 6, 9 on pages of 4, no causal mask), with ``shared_prefix``'s
    sharing: sequence 1 ends inside a block it shares with sequence 0, so the tail it must
    not read holds sequence 0's real tokens (ordinary values, not garbage)."""
    return paged_lengths(seed, [14, 6, 9], 4, shared=[(1, 0, 2), (2, 0, 1)])


@case("wide_pages_mid_page")
def _wide_pages_mid_page(seed):
    """By lengths alone on pages of 16 and heads 16 wide (E = 64; lengths 40, 17, 3 in a
    48-slot cache, two kv heads): the sizes GPU paged kernels are built for, each sequence
    ending inside a page."""
    return paged_lengths(seed, [40, 17, 3], 16, S=48, K=2, E=64)


def _judge_unpaged(impl: Any, out: Any, p: Problem) -> Any:
    """The paged problem against the same problem unpaged (its logical key and value): one
    module's two reads of one cache (through a block table, or as one array per sequence)
    differ by no more than two results within the rule's bound can."""
    from suite.conformance.judge import forms_agree

    parts = [(b, b, f"sequence {b}") for b in range(p.B)]
    return forms_agree(impl, out, p, dataclasses.replace(p, paging=None), parts,
                       "paged vs unpaged")


@case("agrees_with_unpaged", judge=_judge_unpaged)
def _agrees_with_unpaged(seed):
    """Two rows per sequence at the end of caches filled to 15, 10 and 6 on pages of 5,
    sequence 2 sharing sequence 0's first block, and the same problem unpaged: one module's
    paged and contiguous caches give every sequence the same rows."""
    return paged_decode(seed, 2, [15, 10, 6], 5, shared=[(2, 0, 1)])


# --- score variants over a paged cache (issue 50) ---------------------------------------------
@case("softcap_one_row")
def _softcap_one_row(seed):
    """Gemma 2 served from a paged cache (vLLM's and FlashInfer's ``logits_soft_cap``): cap 4
    on logits up to ~10 (inputs x3), one row per sequence (lengths 16, 7, 1) over shuffled
    blocks of 4."""
    p = paged(decode_problem(seed, 1, [16, 7, 1], input_scale=3.0), seed, 4)
    return dataclasses.replace(p, softcap=4.0)


@case("sinks_gqa")
def _sinks_gqa(seed):
    """gpt-oss served from a paged cache: sinks, two key/value heads for four query heads,
    two rows per sequence (lengths 12, 16, 3) on pages of 3."""
    p = paged(decode_problem(seed, 2, [12, 16, 3], K=2, input_scale=2.0), seed, 3)
    return dataclasses.replace(p, sinks=2.0 * np.random.default_rng(seed + 4).standard_normal(4))


@case("alibi_rows_at_offsets")
def _alibi_rows_at_offsets(seed):
    """ALiBi over a paged cache (vLLM's ``alibi_slopes``): -slope |pos - j|, two rows per
    sequence at offsets 3, 8 and 0 inside caches filled to 16, 11 and 7 (pages of 4): each
    row's distances from its own position, not from the cache's end or from 0."""
    p = paged(decode_problem(seed, 2, [16, 11, 7], [3, 8, 0]), seed, 4)
    return dataclasses.replace(p, alibi=Alibi(alibi_slopes(4), "distance"))


@case("sinks_window")
def _sinks_window(seed):
    """gpt-oss's sliding-window layers served from a paged cache: sinks beside a window of
    5 keys, one row per sequence at the end of caches filled to 14, 9 and 3 on pages of 4
    (the window's first key inside a page, and a sequence shorter than the window)."""
    p = paged(decode_problem(seed, 1, [14, 9, 3], window=5, input_scale=2.0), seed, 4)
    return dataclasses.replace(p, sinks=2.0 * np.random.default_rng(seed + 4).standard_normal(4))


@case("score_mod_rows_at_offsets")
def _score_mod_rows_at_offsets(seed):
    """A score modifier over a paged cache (FlexAttention's paged attention converts its
    score_mod's physical key index back to the logical one): the suite's position_wave,
    which reads positions as they are, two rows per sequence at offsets 5, 9 and 0 inside
    caches filled to 15, 12 and 6 on shuffled pages of 4 (inputs x2). Its i is each row's
    position and its j the key's slot in its own sequence: a kernel that hands it the slot
    in the pool, or the row's index within the query, moves every modified score."""
    p = paged(decode_problem(seed, 2, [15, 12, 6], [5, 9, 0], input_scale=2.0), seed, 4)
    return dataclasses.replace(p, score_mod=SCORE_MODS["position_wave"])


@case("softcap_agrees_with_unpaged", judge=_judge_unpaged)
def _softcap_agrees_with_unpaged(seed):
    """``agrees_with_unpaged`` with Gemma 2's cap (4, inputs x3): a module whose paged kernel
    drops the cap its contiguous path keeps disagrees with itself, whatever the oracle says."""
    p = paged(decode_problem(seed, 2, [15, 10, 6], input_scale=3.0), seed, 5, shared=[(2, 0, 1)])
    return dataclasses.replace(p, softcap=4.0)
