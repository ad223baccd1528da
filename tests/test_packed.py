"""The packed family (#40 item 4): sequences back to back in one row, each token attending
within its own sequence (``Mask.segments``)."""

import dataclasses

import numpy as np
import pytest

from suite.conformance.cases import by_family
from suite.spec.oracle import oracle
from suite.spec.problem import InputError, Mask, Problem, seq_lens
from tests.conftest import planted, run_catalog_case

PACKED = by_family()["packed"]


def _alone(p: Problem, b: int, start: int, end: int) -> Problem:
    """Sequence start..end-1 of row b as a problem of its own (no segments)."""
    allowed = None if p.mask.allowed is None else \
        np.asarray(p.mask.allowed)[..., start:end, start:end]
    one = lambda a: a[b:b + 1, start:end]  # noqa: E731
    return dataclasses.replace(p, query=one(p.query), key=one(p.key), value=one(p.value),
                               mask=Mask(causal=p.mask.causal, allowed=allowed))


@pytest.mark.parametrize("case", PACKED, ids=lambda c: c.name)
def test_each_sequence_is_its_own_attention(case):
    """The oracle of a packed row, sequence by sequence, is the attention of that sequence
    alone: the canonical mask cuts at every boundary and nowhere else."""
    _each_sequence_alone(case.problem(), case.name)


def _each_sequence_alone(p: Problem, label: str) -> np.ndarray:
    """Assert that the oracle's packed rows are, sequence by sequence, the attention of that
    sequence alone; the packed output."""
    out = oracle(p)[0]
    for b, lens in enumerate(seq_lens(p.mask.segments)):
        start = 0
        for n in lens:
            alone = oracle(_alone(p, b, start, start + n))[0]
            np.testing.assert_allclose(out[b, start:start + n], alone[0], rtol=1e-12,
                                       atol=1e-12, err_msg=f"{label} row {b} at {start}")
            start += n
    return out


def test_a_leak_into_the_loud_neighbour_is_far_off():
    """What a kernel that ignores the boundaries computes differs from the oracle by far
    more than any rounding in the first sequence of each row."""
    p = next(c for c in PACKED if c.name == "loud_neighbour").problem()
    leaky = oracle(dataclasses.replace(p, mask=Mask()))[0]
    right = oracle(p)[0]
    first = p.mask.segments == 0
    assert np.abs(leaky - right)[first].max() > 10.0


@pytest.mark.parametrize("segments, expected", [
    (np.array([[0, 0, 1, 1], [0, 1, 1, 2]]), None),
    (np.array([[0, 0, 2, 2], [0, 1, 1, 1]]), "sequence ids 0, 1, 2, ... in order"),
    (np.array([[1, 1, 1, 1], [0, 1, 1, 1]]), "sequence ids 0, 1, 2, ... in order"),
    (np.array([[0, 0, 1]]), "shape (B, L) = (2, 4)"),
    (np.array([[0.0, 0, 1, 1], [0, 0, 1, 1]]), "integers"),
])
def test_segments_are_checked_in_one_line(segments, expected):
    from suite.spec.problem import make_problem

    p = make_problem(0, 2, 4, 4, 8, 2, mask=Mask(segments=segments))
    if expected is None:
        p.validate()
        assert "packed" in p.features()
        return
    with pytest.raises(InputError, match="mask.segments") as info:
        p.validate()
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_cross_shapes_cannot_be_packed():
    from suite.spec.problem import make_problem

    p = make_problem(0, 1, 4, 6, 8, 2, mask=Mask(segments=np.array([[0, 0, 1, 1]])))
    with pytest.raises(InputError, match="a self-attention shape"):
        p.validate()


def _run(impl, name: str, dtype: str = "float64"):
    return run_catalog_case(impl, "packed", name, dtype)


def _planted():
    return planted("packed_planted")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_the_numpy_reference_passes_every_packed_case(dtype):
    from implementations.numpy.mha import NumpyMHA

    for c in PACKED:
        out = _run(NumpyMHA(), c.name, dtype)
        assert out.outcome == "pass", (c.name, out.reason)


@pytest.mark.parametrize("bug, passes", [
    ("IgnoresSequences", {"one_sequence"}),
    # one-token sequences at the start of a row, and a single sequence: nothing to cross
    ("BoundaryOneLate", {"one_sequence"}),
])
def test_a_token_that_sees_another_sequence_fails(bug, passes):
    impl = getattr(_planted(), bug)()
    for c in PACKED:
        out = _run(impl, c.name, "float32")
        assert (out.outcome == "pass") == (c.name in passes), (c.name, out.outcome, out.reason)


def test_jagged_sdpa_on_a_torch_without_jagged_tensors_is_unsupported_not_an_error(monkeypatch):
    """torch>=2.2 is the declared range; a release without nested_tensor_from_jagged says so."""
    torch = pytest.importorskip("torch")
    from implementations.torch.sdpa import TorchSDPAJagged

    assert _run(TorchSDPAJagged(), "docs", "float32").outcome == "pass"
    monkeypatch.delattr(torch.nested, "nested_tensor_from_jagged")
    out = _run(TorchSDPAJagged(), "docs", "float32")
    assert out.outcome == "unsupported" and "nested_tensor_from_jagged" in out.reason, out.reason


def test_jagged_sdpa_keeps_torchs_backend_log_as_the_reason_not_on_the_terminal():
    """torch logs each backend's refusal of a causal jagged call (eight WARNING lines a call,
    71 lines in a main job's sweep): the refused case names them, no handler prints them."""
    pytest.importorskip("torch")
    import logging

    from implementations.torch.sdpa import TorchSDPAJagged

    class Seen(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    log, seen = logging.getLogger("torch.nested._internal.sdpa"), Seen()
    log.addHandler(seen)
    try:
        out = _run(TorchSDPAJagged(), "causal_docs", "float32")
    finally:
        log.removeHandler(seen)
    assert out.outcome == "unsupported" and "is_causal" in out.reason, out.reason
    assert not seen.lines, seen.lines


def test_uncompiled_flex_attention_says_nothing_of_the_path_it_is_named_for():
    """torch.flex[eager] calls FlexAttention uncompiled on purpose: its warning that the call
    is not the fused kernel (a dozen lines) is not shown; other warnings still are."""
    pytest.importorskip("torch")
    import warnings

    from implementations.torch.compiled import TorchFlexEager

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _run(TorchFlexEager(), "docs", "float32").outcome == "pass"
    assert not [w for w in seen if "without torch.compile" in str(w.message)], seen


# --- a score modifier in packed sequences (issue 50) ------------------------------------------
def _at_positions(seed: int = 0):
    """A packed causal problem (5+7 and 3+4+5) with a modifier that reads absolute positions,
    not only their difference: cos(j) and i * sin(j) change with where a sequence starts."""
    from suite.conformance.families.packed import packed_problem
    from suite.spec.variants import ScoreMod

    mod = ScoreMod("at_positions", lambda s, b, h, i, j, xp: s + 1.5 * xp.cos(j)
                   - 0.2 * i * xp.sin(j) + 0.1 * h)
    p = packed_problem(seed, [[5, 7], [3, 4, 5]], causal=True, input_scale=2.0)
    return dataclasses.replace(p, score_mod=mod).validate()


def test_a_score_mod_in_a_packed_row_reads_positions_within_its_sequence():
    """The oracle hands a packed token's modifier its position in its own sequence (as ALiBi
    and the table read it): each sequence's rows are those of the sequence alone, also for a
    modifier of absolute positions; the row and slot indices of the row would give another
    answer (so this test can tell the two readings apart)."""
    p = _at_positions()
    out = _each_sequence_alone(p, "position modifier")
    seg = p.mask.segments
    same = (seg[:, :, None] == seg[:, None, :])[:, None]  # (B, 1, L, L) the sequences' blocks
    by_index = oracle(dataclasses.replace(p, mask=Mask(causal=True, allowed=same)))[0]
    later = seg > 0  # a sequence that does not start the row
    assert np.abs(by_index - out)[later].max() > 1e-1
    np.testing.assert_allclose(by_index[~later], out[~later], rtol=1e-12, atol=1e-12)


def test_a_packed_path_that_drops_the_score_mod_fails_and_the_references_pass():
    """score_mod_docs: numpy and torch.eager pass; a plugin whose packed path leaves the
    modifier out (its padded path keeps it) fails it (and score_mod_positions_docs,
    score_mod_agrees_with_padded) and passes the packed cases without a modifier."""
    from implementations.numpy.mha import NumpyMHA

    assert _run(NumpyMHA(), "score_mod_docs", "float32").outcome == "pass"
    bug = planted("score_mod_planted").PackedDropsScoreMod()
    for c in PACKED:
        out = _run(bug, c.name, "float32")
        assert (out.outcome == "fail") == c.name.startswith("score_mod_"), (c.name, out.reason)
    pytest.importorskip("torch")
    from implementations.torch.eager import TorchEager

    assert _run(TorchEager(), "score_mod_docs", "float32").outcome == "pass"


def test_a_modifier_read_at_the_packed_rows_indices_fails_only_the_positions_case():
    """``score_mod_positions_docs`` poses a modifier of positions as they are (position_wave):
    a path that hands it the packed row's own indices, not each token's position within its
    sequence, fails it; distance_wave (``score_mod_docs``) cannot tell the two apart. The
    built-ins pass both."""
    from implementations.numpy.mha import NumpyMHA

    class RowIndices(NumpyMHA):
        name = "planted.score_mod_row_indices"

        def modify(self, scores, mod, mask=None):
            return super().modify(scores, mod)  # the mask's segments never reach it

    assert run_catalog_case(RowIndices(), "packed", "score_mod_positions_docs",
                            "float32").outcome == "fail"
    assert run_catalog_case(RowIndices(), "packed", "score_mod_docs", "float32").outcome == "pass"
    for impl in (NumpyMHA(),):
        assert run_catalog_case(impl, "packed", "score_mod_positions_docs",
                                "float32").outcome == "pass"
