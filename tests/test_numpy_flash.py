"""numpy.flash against the float64 oracle and the float32 naive rule, and its memory growth.

Small tiles (``block_q``/``block_k``/``block_diag`` of a few rows) make every test cross
many tile edges, so lengths 113 and 203 end in partial tiles and causal masks cut tiles
into diagonal strips.
"""

from __future__ import annotations

import tracemalloc
from typing import Optional

import numpy as np
import pytest

from implementations.numpy.flash import NumpyFlashMHA
from implementations.numpy.mha import NumpyMHA
from implementations.numpy.tiles import CAUSAL_TILES, TILES, TiledAttention, tile_mask
from suite.plugins.adapters import AttendMask
from suite.spec.agreement import max_abs_err
from suite.spec.oracle import naive, oracle
from suite.spec.problem import Mask, Problem, make_problem

F64_TOL = 1e-10
F32_K, F32_ATOL = 2.0, 1e-6  # err(flash) <= 2 * err(naive float32) + 1e-6


def _impl(block_q: int = 16, block_k: int = 8, threads: int = 2, heads: int = 2,
          diag: int = 5):
    return NumpyFlashMHA(block_q=block_q, block_k=block_k, num_threads=threads,
                         heads_per_unit=heads, block_diag=diag)


def check(p: Problem, impl: Optional[NumpyFlashMHA] = None, dtypes=("float64", "float32")):
    """Assert the agreement rules for ``p``; return the float64 output."""
    __tracebackhide__ = True
    impl = impl or _impl()
    ref = oracle(p)[0]
    got = None
    for dtype in dtypes:
        got_t = impl(p, "cpu", dtype).output
        err = max_abs_err(got_t, ref)
        if dtype == "float64":
            got = got_t
            assert err <= F64_TOL, f"float64: err {err:.3g} > {F64_TOL:g}"
        else:
            err_naive = max_abs_err(naive(p, dtype)[0], ref)
            bound = F32_K * err_naive + F32_ATOL
            assert err <= bound, (f"{dtype}: err {err:.3g} > bound {bound:.3g} "
                                  f"(naive err {err_naive:.3g})")
    return got


def _mask_parts(rng: np.random.Generator, kinds: str, B: int, H: int, L: int, S: int) -> Mask:
    parts = {}
    if "valid_lens" in kinds:
        parts["valid_lens"] = rng.integers(1, S + 1, B)
    if "row_lens" in kinds:
        parts["valid_lens"] = rng.integers(0, S + 1, (B, L))
    if "causal_tl" in kinds:
        parts["causal"] = True
    if "causal_br" in kinds:
        parts.update(causal=True, causal_align="bottom_right")
    if "bool" in kinds:
        parts["allowed"] = rng.random((B, 1, L, S)) > 0.3
    if "headbool" in kinds:
        parts["allowed"] = rng.random((H, 1, S)) > 0.4
    if "bias" in kinds:
        parts["bias"] = rng.standard_normal((1, H, L, S))
    if "rowbias" in kinds:
        parts["bias"] = rng.standard_normal((L, 1))
    return Mask(**parts)


MASKS = ["none", "valid_lens", "row_lens", "causal_tl", "causal_br", "bool", "headbool", "bias",
         "rowbias", "valid_lens+causal_tl+bool+bias", "row_lens+causal_br+headbool+rowbias",
         "valid_lens+causal_br+bias", "causal_tl+headbool"]
SHAPES = [(2, 1, 1), (2, 113, 113), (1, 113, 203), (2, 203, 113), (1, 37, 64)]


@pytest.mark.parametrize("kinds", MASKS)
@pytest.mark.parametrize("B,L,S", SHAPES, ids=lambda v: str(v))
def test_masks_and_shapes(kinds, B, L, S):
    rng = np.random.default_rng([L, S, len(kinds)])
    H = 4
    p = make_problem(7, B, L, S, 16, H, mask=_mask_parts(rng, kinds, B, H, L, S)).validate()
    check(p)


@pytest.mark.parametrize("causal", [False, True])
def test_default_tiles(causal):
    """The tuned defaults (one head of (512, 512) tiles; four heads of (256, 256) tiles and
    128-row diagonal strips when causal) at a length that ends in partial tiles."""
    impl = NumpyFlashMHA()
    assert impl.kernel.tiling(tile_mask(make_problem(0, 1, 4, 4, 8, 2, mask=Mask(causal=causal)),
                                  np.float32)) == (CAUSAL_TILES if causal else TILES)
    p = make_problem(4, 1, 700, 700, 64, 8, mask=Mask(causal=causal)).validate()
    check(p, impl)


@pytest.mark.parametrize("H,K", [(4, 1), (4, 2), (6, 3), (8, 2)])
@pytest.mark.parametrize("heads", [1, 2, 4])
def test_gqa(H, K, heads):
    rng = np.random.default_rng(H * K)
    mask = _mask_parts(rng, "valid_lens+causal_tl+headbool", 2, H, 45, 45)
    p = make_problem(3, 2, 45, 45, 4 * H, H, K, mask=mask).validate()
    check(p, _impl(heads=heads))


@pytest.mark.parametrize("tiles", [(1, 1, 1), (5, 3, 2), (7, 11, 3), (16, 8, 16), (64, 32, 16),
                                   (256, 512, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_tile_sizes_and_threads(tiles, threads):
    rng = np.random.default_rng(1)
    mask = _mask_parts(rng, "row_lens+causal_br+bool+bias", 2, 2, 29, 41)
    p = make_problem(5, 2, 29, 41, 8, 2, mask=mask).validate()
    check(p, _impl(*tiles[:2], threads=threads, diag=tiles[2]))


@pytest.mark.parametrize("scale,input_scale", [(0.05, 4.0), (-1.0, 1.0), (3.0, 1.0), (3.0, 4.0)])
def test_explicit_scale_and_large_logits(scale, input_scale):
    """Large logits exceed the lazy row max: the tile is redone with the standard step."""
    p = make_problem(11, 2, 50, 70, 16, 2, scale=scale, input_scale=input_scale).validate()
    check(p)


def test_huge_logits_float64():
    """Logits in the hundreds (float32 BLAS accumulation alone exceeds the naive rule there,
    for the plain kernel too), so only the algorithm is checked, in float64."""
    p = make_problem(11, 2, 50, 70, 16, 2, scale=-1.0, input_scale=4.0).validate()
    check(p, dtypes=("float64",))


def test_running_max_grows_across_tiles():
    """A bias rising along the keys makes each key tile's max exceed the running max."""
    B, H, L, S = 1, 2, 20, 96
    bias = np.broadcast_to(np.linspace(0.0, 90.0, S), (L, S)).copy()
    check(make_problem(2, B, L, S, 8, H, mask=Mask(bias=bias)).validate())


def test_shifted_head_leaves_the_next_unit_alone():
    """One head's logits climb (its rows get a nonzero m), the other's stay small; run on
    one worker, so the second head's units reuse the first one's buffers."""
    B, H, L, S = 1, 2, 24, 40
    bias = np.zeros((1, H, L, S))
    bias[0, 0] = np.linspace(0.0, 80.0, S)
    p = make_problem(3, B, L, S, 8, H, mask=Mask(bias=bias)).validate()
    check(p, _impl(block_q=8, block_k=8, threads=1, heads=1))


def test_logits_far_below_zero_do_not_underflow():
    """All logits near -200: exp against the lazy max 0 underflows, so rows are redone."""
    B, H, L, S = 2, 2, 19, 33
    rng = np.random.default_rng(4)
    bias = -200.0 + rng.standard_normal((L, S))
    out = check(make_problem(8, B, L, S, 8, H, mask=Mask(bias=bias)).validate())
    assert np.isfinite(out).all()


def test_fully_masked_rows_give_b_o():
    """Rows with no visible key: zero head output, so the output row is b_o."""
    B, H, L, S = 2, 2, 30, 20
    allowed = np.ones((B, 1, L, S), bool)
    allowed[0, :, 3] = False
    allowed[1, :, 17:25] = False
    lens = np.full((B, L), S)
    lens[0, 9] = 0
    p = make_problem(9, B, L, S, 8, H, mask=Mask(valid_lens=lens, allowed=allowed)).validate()
    out = check(p)
    for b, rows in ((0, [3, 9]), (1, list(range(17, 25)))):
        np.testing.assert_allclose(out[b, rows], np.broadcast_to(p.weights.b_o, (len(rows), 8)),
                                   rtol=0, atol=1e-12)


def test_bottom_right_causal_with_more_queries_than_keys():
    """Lq > Lk bottom-right: the first Lq - Lk queries see no key at all."""
    p = make_problem(6, 1, 40, 15, 8, 2, mask=Mask(causal=True, causal_align="bottom_right"))
    out = check(p.validate())
    np.testing.assert_allclose(out[0, :25], np.broadcast_to(p.weights.b_o, (25, 8)), atol=1e-12)


@pytest.mark.parametrize("garbage", [np.nan, 1e30, np.inf])
def test_padding_garbage_does_not_poison(garbage):
    """Keys/values past valid_lens hold NaN/huge values: the output is that of clean padding."""
    B, L, S = 2, 23, 41
    lens = np.array([17, 30])
    clean = make_problem(12, B, L, S, 16, 4, mask=Mask(valid_lens=lens))
    key, value = clean.key.copy(), clean.value.copy()
    for b, n in enumerate(lens):
        key[b, n:] = garbage
        value[b, n:] = garbage
    dirty = Problem(clean.query, key, value, clean.weights, 4, mask=clean.mask).validate()
    impl = _impl()
    for dtype in ("float64", "float32"):
        got = impl(dirty, "cpu", dtype).output
        assert np.isfinite(got).all(), dtype
        np.testing.assert_array_equal(got, impl(clean, "cpu", dtype).output)
    check(dirty)


def test_float16_runs_within_the_naive_rule():
    p = make_problem(13, 2, 33, 47, 16, 2, mask=Mask(causal=True)).validate()
    check(p, dtypes=("float16",))


def test_causal_skips_tiles_above_the_diagonal(monkeypatch):
    """Causal attention computes about half the scores: whole tiles below the diagonal and
    row strips across it, so only strip-sized triangles above it are computed."""
    sizes = []
    logits = TiledAttention._logits

    def counting(s, *args):
        sizes.append(s.size)
        logits(s, *args)

    monkeypatch.setattr(TiledAttention, "_logits", staticmethod(counting))
    L, diag = 64, 2
    impl = NumpyFlashMHA(block_q=8, block_k=8, num_threads=1, heads_per_unit=1, block_diag=diag)
    p = make_problem(1, 1, L, L, 4, 1).validate()
    impl(p, "cpu", "float32")
    assert (len(sizes), sum(sizes)) == (64, L * L)
    sizes.clear()
    impl(dataclass_replace_mask(p, Mask(causal=True)), "cpu", "float32")
    needed = L * (L + 1) // 2
    assert needed <= sum(sizes) <= needed + L * diag // 2, (sum(sizes), needed)


def dataclass_replace_mask(p: Problem, mask: Mask) -> Problem:
    import dataclasses
    return dataclasses.replace(p, mask=mask)


def test_declares_no_weights_and_refuses_them():
    impl = _impl()
    assert "weights" not in impl.features and "grad" not in impl.features
    p = make_problem(0, 1, 4, 4, 8, 2)
    with pytest.raises(ValueError, match="need_weights"):
        impl.prepare(p, "cpu", "float32", need_weights=True)
    with pytest.raises(ValueError, match="block_q"):
        NumpyFlashMHA(block_q=0)
    with pytest.raises(ValueError, match="block_diag"):
        NumpyFlashMHA(block_diag=0)


def _attend_peak_bytes(impl, L: int, H: int = 4, D: int = 16) -> int:
    """tracemalloc peak of the attention core alone at query = key length L."""
    rng = np.random.default_rng(L)
    q, k, v = (rng.standard_normal((1, H, L, D)).astype(np.float32) for _ in range(3))
    mask = None if isinstance(impl, NumpyFlashMHA) else AttendMask()  # unmasked, each its own
    impl.attend(q[:, :, :8], k[:, :, :8], v[:, :, :8], mask, np.float32(0.25), False)  # warm
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        impl.attend(q, k, v, mask, np.float32(0.25), False)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_peak_memory_grows_linearly():
    """4x the length: the plain kernel's peak grows ~16x (L*S scores), flash's ~4x."""
    flash = NumpyFlashMHA(block_q=64, block_k=64, num_threads=2, heads_per_unit=2)
    small, large = _attend_peak_bytes(flash, 256), _attend_peak_bytes(flash, 1024)
    assert large / small < 6, f"flash peak {small} -> {large} bytes ({large / small:.1f}x)"
    # The same measurement tells quadratic growth apart (so this test can fail).
    plain_small, plain_large = (_attend_peak_bytes(NumpyMHA(), n) for n in (256, 1024))
    assert plain_large / plain_small > 10, (plain_small, plain_large)
    assert large < plain_large / 4
