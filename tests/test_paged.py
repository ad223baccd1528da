"""The paged family (#40 item 3): the decode form's key/value cache in a shared pool of
blocks read through a per-sequence block table (``Problem.paging``, ``suite.spec.paging``)."""

import dataclasses

import numpy as np
import pytest

from suite.conformance.cases import by_family
from suite.spec.oracle import oracle
from suite.spec.paging import (
    GARBAGE,
    Paging,
    blocks_used,
    gather,
    lengths_of,
    paged_cache,
)
from suite.spec.problem import InputError
from tests.conftest import planted, run_catalog_case

PAGED = by_family()["paged"]


@pytest.mark.parametrize("case", PAGED, ids=lambda c: c.name)
def test_the_pool_holds_each_sequence_and_garbage_elsewhere(case):
    """Read through the table, the pool gives each sequence's filled slots exactly; every
    slot no sequence fills (unused blocks, a last block's tail) is garbage-sized."""
    p = case.problem()
    cache = paged_cache(p)
    P = p.paging.page_size
    filled = np.zeros(cache.key_pages.shape[:2], bool)  # (N, P)
    for b, n in enumerate(cache.lengths):
        for pages, logical in ((cache.key_pages, p.key), (cache.value_pages, p.value)):
            np.testing.assert_array_equal(gather(pages, cache.block_table, p.S)[b, :n],
                                          logical[b, :n], err_msg=f"{case.name} sequence {b}")
        for t in range(int(blocks_used(n, P))):
            filled[cache.block_table[b, t], :min(P, n - t * P)] = True
    assert (~filled).any(), "every case's pool has slots no sequence fills"
    for pages in (cache.key_pages, cache.value_pages):
        assert np.abs(pages[~filled]).mean() > GARBAGE / 2, case.name
    # the paging changes no answer: the oracle judges the logical problem
    np.testing.assert_array_equal(oracle(p)[0], oracle(dataclasses.replace(p, paging=None))[0])


def test_the_shared_prefix_case_shares_blocks_one_sequence_ends_inside():
    p = next(c for c in PAGED if c.name == "shared_prefix").problem()
    table, lengths = p.paging.block_table, np.asarray(p.mask.valid_lens)
    assert table[1, :2].tolist() == table[0, :2].tolist() and table[2, 0] == table[0, 0]
    assert lengths[1] % p.paging.page_size and lengths[1] < lengths[0]


def _problem(**paging):
    p = next(c for c in PAGED if c.name == "one_row_shuffled").problem()
    return dataclasses.replace(p, paging=dataclasses.replace(p.paging, **paging))


def _shared_with_other_tokens():
    p = next(c for c in PAGED if c.name == "shared_prefix").problem()
    key = p.key.copy()
    key[1, 5] += 1.0  # sequence 1's slot 5 lives in a block sequence 0 fills too
    return dataclasses.replace(p, key=key)


@pytest.mark.parametrize("build, expected", [
    (lambda: _problem(page_size=0), "paging.page_size: expected a positive int"),
    (lambda: _problem(block_table=np.zeros((3, 3), np.int64)),
     "paging.block_table: expected shape (B, ceil(S / page_size)) = (3, 4)"),
    (lambda: _problem(num_blocks=5), "block ids in [0, num_blocks) = [0, 5)"),
    (lambda: _problem(block_table=np.zeros((3, 4), np.float64)), "integers"),
    (lambda: _problem(block_table=np.zeros((3, 4), np.int64)),
     "distinct blocks within one sequence's filled entries"),
    (_shared_with_other_tokens, "shared by sequences 0 and 1, to hold the same tokens"),
    (lambda: dataclasses.replace(_problem(), mask=dataclasses.replace(
        _problem().mask, valid_lens=np.full((3, 1), 4))), "mask.valid_lens of shape (B,)"),
    (lambda: dataclasses.replace(_problem(), paging=(4, None)), "a suite.spec.paging.Paging"),
])
def test_bad_paging_is_one_clear_line(build, expected):
    with pytest.raises(InputError) as info:
        build().validate()
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_paged_problem_needs_the_feature():
    p = PAGED[0].problem()
    assert "paged" in p.features() and "paged" not in dataclasses.replace(
        p, paging=None).features()


def test_a_reproducer_keeps_the_paging(tmp_path):
    from suite.conformance.repro import load_problem, save_problem

    p = next(c for c in PAGED if c.name == "shared_prefix").problem()
    save_problem(tmp_path / "problem.npz", p)
    back, _ = load_problem(tmp_path / "problem.npz")
    assert isinstance(back.paging, Paging) and back.paging.page_size == p.paging.page_size
    np.testing.assert_array_equal(back.paging.block_table, p.paging.block_table)
    for a, b in zip(paged_cache(back), paged_cache(p)):
        np.testing.assert_array_equal(a, b)


def _run(impl, name: str, dtype: str = "float64"):
    return run_catalog_case(impl, "paged", name, dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_the_numpy_reference_passes_every_paged_case(dtype):
    from implementations.numpy.mha import NumpyMHA

    for c in PAGED:
        out = _run(NumpyMHA(), c.name, dtype)
        assert out.outcome == "pass", (c.name, out.reason)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_eager_passes_every_paged_case(dtype):
    pytest.importorskip("torch")
    from implementations.torch.eager import TorchEager

    for c in PAGED:
        out = _run(TorchEager(), c.name, dtype)
        assert out.outcome == "pass", (c.name, out.reason)


def test_a_plugin_without_the_feature_is_unsupported():
    from implementations.numpy.flash import NumpyFlashMHA

    out = _run(NumpyFlashMHA(), PAGED[0].name, "float32")
    assert out.outcome == "unsupported" and "paged" in out.reason, out.reason


# The cases where a sequence's length alone (no causal mask at an offset) hides its last
# page's tail.
MID_PAGE = {"length_ends_mid_page", "shared_block_tail", "wide_pages_mid_page"}


def test_the_length_alone_hides_a_page_tail_in_the_mid_page_cases():
    """Each mid-page case: no causal mask, every sequence ends inside its last page, and a
    read of that tail changes the answer (the oracle with the lengths rounded up to whole
    pages differs in every row)."""
    for c in PAGED:
        if c.name not in MID_PAGE:
            continue
        p = c.problem()
        lengths, P = lengths_of(p), p.paging.page_size
        assert not p.mask.causal and p.mask.query_offset is None, c.name
        assert (lengths % P).all(), (c.name, lengths.tolist())
        whole = np.minimum(blocks_used(lengths, P) * P, p.S)
        wrong = dataclasses.replace(p, mask=dataclasses.replace(p.mask, valid_lens=whole))
        assert (np.abs(oracle(wrong)[0] - oracle(p)[0]).max(axis=(1, 2)) > 1e-2).all(), c.name


@pytest.mark.parametrize("case", PAGED, ids=lambda c: c.name)
def test_the_plugin_is_handed_the_pool_as_the_only_copy(case):
    """What a paged plugin is handed (``call``'s ``handed``): ``paged_cache`` of it is the
    pool of the true problem, its key and value hold none of the sequences' tokens, and it
    validates (a shared block still holds the same values in both sequences)."""
    from implementations.numpy.mha import NumpyMHA
    from suite.plugins.interface import handed

    p = case.problem()
    given = handed(NumpyMHA(), p)
    given.validate()
    for a, b in zip(paged_cache(given), paged_cache(p)):
        np.testing.assert_array_equal(a, b)
    for name in ("key", "value"):
        got, true = getattr(given, name), getattr(p, name)
        assert got.shape == true.shape and got.dtype == true.dtype
        assert np.abs(got).min() > 0 and np.abs(got).mean() > GARBAGE / 2, name
        assert not np.isclose(got, true).any(), name
    assert handed(NumpyMHA(), given) is given  # handed once: no second pool of garbage
    assert oracle(p)[0] is not None and p.paging.pool is None  # the oracle's problem intact


# The paged cases that carry a score variant (issue 50).
VARIANT_CASES = {"softcap_one_row", "sinks_gqa", "alibi_rows_at_offsets", "sinks_window",
                 "score_mod_rows_at_offsets", "softcap_agrees_with_unpaged"}


@pytest.mark.parametrize("bug, passes", [
    ("OffByOneBlock", set()),
    # every case but those with pages of 16, 5 and 3 slots has the page size it assumes
    ("FixedPageSize", {"shared_prefix", "one_row_shuffled", "block_boundary", "gqa",
                       "few_rows", "rows_at_offsets", "length_ends_mid_page",
                       "shared_block_tail", "softcap_one_row", "alibi_rows_at_offsets",
                       "sinks_window", "score_mod_rows_at_offsets"}),
    # only a block shared past one sequence's length is written under another
    ("WritesSharedBlock", {c.name for c in PAGED} - {"shared_prefix", "shared_block_tail"}),
    # the pool never opened: the logical key and value it is handed beside it are garbage
    ("ReadsLogical", set()),
    # a last page read whole: only the rows masked by their length alone see its tail (in
    # the other cases causality at the offset hides it too)
    ("ReadsWholePages", {c.name for c in PAGED} - MID_PAGE),
    # the variants left out of the paged path only: every case that carries one fails (the
    # cap's agreement case by its own unpaged read too)
    ("VariantsDroppedWhenPaged", {c.name for c in PAGED} - VARIANT_CASES),
])
def test_a_misread_page_fails(bug, passes):
    impl = getattr(planted("paged_planted"), bug)()
    for c in PAGED:
        out = _run(impl, c.name, "float32")
        assert (out.outcome == "pass") == (c.name in passes), (c.name, out.outcome, out.reason)
        if out.outcome != "pass":
            assert out.outcome == "fail", (c.name, out.outcome, out.reason)


def _run_interpreted(impl, name: str, dtype: str):
    from suite.conformance import catalog
    from suite.conformance.judge import Outcome
    from suite.plugins.interface import INTERPRETED_CPU

    (case,) = [c for c in catalog.of_family("paged") if c.name == name]
    return case.run(impl, Outcome(impl.name, INTERPRETED_CPU, dtype, case.family, case.name,
                                  case.seed, "pass"))


ONE_ROW_AT_THE_END = {"shared_prefix", "one_row_shuffled", "wide_pages", "page_not_dividing",
                      "block_boundary", "gqa"} | MID_PAGE


# Built-in verdicts on every paged case (36 s interpreted): CI's covering check runs the
# paged family's sample on these kernels, `nox -s check_full` this test and every case.
@pytest.mark.slow
@pytest.mark.parametrize("kernel, dtype", [
    # the TPU kernel reads its pages at bfloat16 precision in every dtype (its docstring)
    ("PallasTpuPaged", "bfloat16"),
    ("PallasGpuPaged", "float32"),
])
def test_the_pallas_paged_kernels_read_the_pool_through_their_table(kernel, dtype):
    """JAX's Pallas paged_attention kernels, interpreted: every case of one row at its
    cache's end passes, Gemma 2's cap included; rows at offsets or several rows are
    unsupported, with the reason, and so are the variants the kernels take no argument for."""
    pytest.importorskip("jax")
    from implementations.kernels import pallas as pallas_attention

    impl = getattr(pallas_attention, kernel)()
    for c in PAGED:
        out = _run_interpreted(impl, c.name, dtype)
        p = c.problem()
        if c.name == "softcap_one_row":  # the cap is the kernels' attn_logits_soft_cap
            assert out.outcome == "pass", (c.name, out.reason)
        elif p.has_variants() and p.softcap is None:  # no sinks, ALiBi or score_mod
            assert out.outcome == "unsupported" and "needs" in out.reason, \
                (c.name, out.outcome, out.reason)
        elif c.name in ONE_ROW_AT_THE_END:
            assert out.outcome == "pass", (c.name, out.reason)
        else:
            assert out.outcome == "unsupported" and "one query per sequence" in out.reason, \
                (c.name, out.outcome, out.reason)


@pytest.mark.parametrize("kernel, dtype", [("PallasTpuPaged", "bfloat16"),
                                           ("PallasGpuPaged", "float32")])
def test_the_pallas_paged_kernels_are_given_the_table_not_the_logical_cache(kernel, dtype):
    """The same plugin handing the kernel a table shifted by one entry fails: the kernel
    reads the pool through the table the plugin gives it."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from implementations.kernels import pallas as pallas_attention

    class Shifted(getattr(pallas_attention, kernel)):
        name = "bug.pallas_paged_shifted_table"

        def attend_paged(self, q, k_pages, v_pages, block_table, lengths, mask, scale, S):
            shifted = jnp.concatenate([block_table[:, 1:], block_table[:, -1:]], axis=1)
            return super().attend_paged(q, k_pages, v_pages, shifted, lengths, mask, scale, S)

    out = _run_interpreted(Shifted(), "one_row_shuffled", dtype)
    assert out.outcome == "fail", (out.outcome, out.reason)


@pytest.mark.parametrize("kernel, dtype", [("PallasTpuPaged", "bfloat16"),
                                           ("PallasGpuPaged", "float32")])
def test_a_pallas_paged_kernel_called_without_its_cap_fails(kernel, dtype):
    """The kernels' own attn_logits_soft_cap computes the cap (#50 item 3): the same plugin
    that leaves it out fails the capped case (its uncapped answer is 1.8 off)."""
    pytest.importorskip("jax")
    from implementations.kernels import pallas as pallas_attention

    class Uncapped(getattr(pallas_attention, kernel)):
        name = "bug.pallas_paged_uncapped"

        def check_shapes(self, problem, device):
            super().check_shapes(problem, device)
            self.softcap = None

    out = _run_interpreted(Uncapped(), "softcap_one_row", dtype)
    assert out.outcome == "fail", out.reason


def test_a_jax_whose_kernel_takes_no_cap_makes_a_capped_case_unsupported():
    """The paged kernels gained attn_logits_soft_cap after splash, inside jax's declared
    range: where the installed kernel has no such argument, a capped case is unsupported in
    one line (not a TypeError), and an uncapped one goes on."""
    pytest.importorskip("jax")
    import dataclasses

    from implementations.kernels import pallas as pallas_attention
    from suite.plugins.interface import Unsupported

    def older(q, k_pages, v_pages, lengths, page_indices, *, pages_per_compute_block):
        raise AssertionError("not called")

    (case,) = [c for c in PAGED if c.name == "softcap_one_row"]
    p = case.problem()
    with pytest.raises(Unsupported, match=r"'s paged_attention takes no attn_logits_soft_cap"):
        pallas_attention.check_softcap("pallas.tpu.paged", p, older, "paged_attention")
    pallas_attention.check_softcap("pallas.tpu.paged", dataclasses.replace(p, softcap=None),
                                   older, "paged_attention")
