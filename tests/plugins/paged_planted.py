"""Planted paged-cache bugs on the NumPy reference (``read_pages``: the projected pool read
through the block table): the paged family must fail each, and the reference pass."""

import dataclasses

import numpy as np

from implementations.numpy.mha import NumpyMHA
from suite.spec.paging import blocks_used, lengths_of


class OffByOneBlock(NumpyMHA):
    """Reads logical block t from the table's entry t + 1 (the last entry for the last
    block): the block table read off by one block."""

    name = "bug.paged_off_by_one_block"

    def read_pages(self, pages, block_table, lengths, S):
        shifted = np.concatenate([block_table[:, 1:], block_table[:, -1:]], axis=1)
        return super().read_pages(pages, shifted, lengths, S)


class FixedPageSize(NumpyMHA):
    """Ignores the pool's page size and reads pages of 4 slots (a kernel built for one block
    size): slot j is slot j % 4 of block ``block_table[b, j // 4]`` of a pool cut in 4s."""

    name = "bug.paged_fixed_page_size"
    PAGE = 4

    def read_pages(self, pages, block_table, lengths, S):
        flat = pages.reshape(-1, pages.shape[-1])  # (N * P, X): the pool's slots in order
        j = np.arange(S)
        blocks = np.take(block_table, j // self.PAGE, axis=1, mode="wrap")  # (B, S)
        slots = blocks * self.PAGE + j % self.PAGE  # (B, S)
        return np.take(flat, slots, axis=0, mode="wrap")  # (B, S, X)


class WritesSharedBlock(NumpyMHA):
    """Appends each sequence's next token (zeros here) into the slot after its length in its
    own last block, in place: no copy-on-write, so a block another sequence shares and fills
    further is overwritten under it."""

    name = "bug.paged_writes_shared_block"

    def read_pages(self, pages, block_table, lengths, S):
        pages = pages.copy()
        P = pages.shape[1]
        for b, n in enumerate(lengths):
            if n // P < block_table.shape[1]:
                pages[block_table[b, n // P], n % P] = 0  # the next token's slot
        return super().read_pages(pages, block_table, lengths, S)


class ReadsLogical(NumpyMHA):
    """Declares ``paged`` and never opens the pool: attends the problem's logical key and
    value (the plugin handed the table, and the cache it was built from beside it)."""

    name = "bug.paged_reads_logical"

    def prepare(self, problem, device, dtype, **kw):
        return super().prepare(dataclasses.replace(problem, paging=None), device, dtype, **kw)


class ReadsWholePages(NumpyMHA):
    """Reads every slot of a sequence's filled blocks: its length rounded up to a whole page
    (a kernel that masks by pages, not by the sequence's length), so the tail of the last
    page is attended."""

    name = "bug.paged_reads_whole_pages"

    def attention_mask(self, problem, dtype):
        if problem.paging is not None:
            P, S = problem.paging.page_size, problem.S
            whole = np.minimum(blocks_used(lengths_of(problem), P) * P, S)
            problem = dataclasses.replace(problem, mask=dataclasses.replace(
                problem.mask, valid_lens=whole))
        return super().attention_mask(problem, dtype)


class VariantsDroppedWhenPaged(NumpyMHA):
    """Reads the pool right and leaves the score variants out of its paged path (its
    contiguous path keeps them): a paged kernel written after the prefill one."""

    name = "bug.paged_variants_dropped"

    def prepare(self, problem, device, dtype, **kw):
        if problem.paging is not None:
            problem = dataclasses.replace(problem, softcap=None, sinks=None, alibi=None,
                                          rel_bias=None, score_mod=None)
        return super().prepare(problem, device, dtype, **kw)
