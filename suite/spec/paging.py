"""Paged key/value caches: the decode form's cache stored as a serving kernel stores it, in a
shared pool of fixed-size blocks (pages) read through a per-sequence block table.

The problem stays the logical one (``Problem.key``/``value`` (B, S, E), ``mask.valid_lens``
the cache lengths): the oracle judges it as it judges any decode step. ``Problem.paging``
adds how that cache is paged, and ``paged_cache(problem)`` builds the pool a plugin that
declares feature ``paged`` reads instead of the logical key and value:

  key_pages, value_pages  (N, P, E) float64: N blocks of P slots, model width E, as every
      problem's key and value (the plugin projects them with W_k and W_v as it projects
      key and value: projection is per token, so it commutes with paging);
  block_table  (B, T) int32, T = ceil(S / P): logical slots t*P .. t*P + P - 1 of sequence
      b are slots 0 .. P - 1 of block ``block_table[b, t]``;
  lengths  (B,) int32: the first ``lengths[b]`` logical slots hold sequence b's tokens
      (``mask.valid_lens``, or S without it).

Every block that no sequence fills, the slots of a last block past its sequence's length,
and the blocks the table's unused entries (t >= ceil(lengths[b] / P)) point at hold
``GARBAGE``-sized values: a kernel that reads a block it must not is far off. A block may
be shared read-only by several sequences (prefix sharing): every slot two sequences fill
holds the same token in both (``suite.spec.problem`` checks it).

The pool is the only copy of the cache a paged plugin is handed. The harness gives it the
problem as ``pool_only(problem)`` returns it: ``paging.pool`` holds the pool built from the
logical key and value, and ``key``/``value`` themselves (kept for their shape, S and E) hold
``GARBAGE``-sized values read through the same table from another pool, so a plugin that
declares ``paged`` and reads the logical tensors is far off everywhere, while the oracle
judges the true ones. ``paged_cache`` returns ``paging.pool`` where it is set.

A plugin that does not declare ``paged`` is given no paged problem: the case is reported
unsupported, as a decode case is for a plugin without ``decode``. Running it unpaged would
repeat the decode family under another name and report a pass for a paging it never did.

Nothing here imports a framework or ``suite.spec.problem``: every array is NumPy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import numpy as np

# What the pool holds where no sequence's token is: finite and large, so a row that reads it
# is far off (NaN there is the special-values family's concern).
GARBAGE = 1e3


@dataclasses.dataclass(frozen=True)
class Paging:
    """How a problem's key/value cache is paged (``Problem.paging``).

    page_size: P, slots per block; block_table: (B, T) ints in [0, num_blocks),
    T = ceil(S / P), the block holding each sequence's t-th run of P logical slots (entries
    past a sequence's last filled block point at any block, and must not be read);
    num_blocks: N, the pool's size; seed: the garbage in the pool's unfilled slots;
    pool: the pool itself, set only on the problem a plugin is handed (``pool_only``), whose
    key and value no longer hold the tokens it is built from (not part of the layout: a
    reproducer saves the four fields above and rebuilds it).
    """

    page_size: int
    block_table: np.ndarray
    num_blocks: int
    seed: int = 0
    pool: Optional[PagedCache] = dataclasses.field(default=None, repr=False, compare=False)

    LAYOUT = ("page_size", "block_table", "num_blocks", "seed")  # what a reproducer saves


class PagedCache(NamedTuple):
    """The pool a paged plugin reads (``paged_cache``), float64 and int32 NumPy arrays."""

    key_pages: np.ndarray  # (N, P, E)
    value_pages: np.ndarray  # (N, P, E)
    block_table: np.ndarray  # (B, T) int32
    lengths: np.ndarray  # (B,) int32


def lengths_of(problem: Any) -> np.ndarray:
    """int64 (B,) filled slots per sequence: ``mask.valid_lens`` (B,), or S for every one."""
    vl = problem.mask.valid_lens
    return np.full(problem.B, problem.S, np.int64) if vl is None else \
        np.asarray(vl, dtype=np.int64).reshape(problem.B)


def blocks_used(lengths: np.ndarray, page_size: int) -> np.ndarray:
    """int64 (B,) blocks each sequence fills, ceil(length / P)."""
    return -(-np.asarray(lengths, dtype=np.int64) // page_size)


def paged_cache(problem: Any) -> PagedCache:
    """The pool of ``problem`` (validated, ``paging`` set): each sequence's filled slots
    written into its blocks, every other slot ``GARBAGE``-sized noise from ``paging.seed``;
    ``paging.pool`` where it is set (the problem a plugin is handed, ``pool_only``)."""
    pg = problem.paging
    if pg.pool is not None:
        return pg.pool
    P, N, E = pg.page_size, pg.num_blocks, problem.E
    table = np.asarray(pg.block_table)
    lengths = lengths_of(problem)
    rng = np.random.default_rng(pg.seed)
    key_pages = GARBAGE * rng.standard_normal((N, P, E))  # (N, P, E)
    value_pages = GARBAGE * rng.standard_normal((N, P, E))  # (N, P, E)
    for b, n in enumerate(lengths):
        for t in range(int(blocks_used(n, P))):
            filled = min(P, int(n) - t * P)
            key_pages[table[b, t], :filled] = problem.key[b, t * P:t * P + filled]
            value_pages[table[b, t], :filled] = problem.value[b, t * P:t * P + filled]
    return PagedCache(key_pages, value_pages, table.astype(np.int32), lengths.astype(np.int32))


def pool_only(problem: Any) -> Any:
    """``problem`` as a plugin that declares ``paged`` is handed it: the pool built from its
    logical key and value kept in ``paging.pool`` (``paged_cache`` returns it), and the key and
    value replaced by ``GARBAGE``-sized values, what the same table reads from a pool of
    garbage (seed ``paging.seed + 1``). Shapes stay, and so does every check of the problem
    (a block two sequences share holds the same values in both); the answer is only in the
    pool. A problem without paging, or one already handed, is returned as it is."""
    pg = problem.paging
    if pg is None or pg.pool is not None:
        return problem
    cache = paged_cache(problem)
    rng = np.random.default_rng(pg.seed + 1)
    table, S = np.asarray(pg.block_table), problem.S

    def poison(like: np.ndarray) -> np.ndarray:  # (B, S, E) read from a pool of garbage
        pool = GARBAGE * rng.standard_normal((pg.num_blocks, pg.page_size, like.shape[2]))
        return gather(pool, table, S).astype(like.dtype)

    key = poison(problem.key)
    value = key if problem.value is problem.key else poison(problem.value)
    return dataclasses.replace(problem, key=key, value=value,
                               paging=dataclasses.replace(pg, pool=cache))


def gather(pages: np.ndarray, block_table: np.ndarray, S: int) -> np.ndarray:
    """The logical cache (B, S, ...) read from ``pages`` (N, P, ...) through the table
    (B, T): slot j of sequence b is slot j % P of block ``block_table[b, j // P]``."""
    B, T = block_table.shape
    rows = pages[block_table]  # (B, T, P, ...)
    return rows.reshape(B, T * pages.shape[1], *pages.shape[2:])[:, :S]  # (B, S, ...)
