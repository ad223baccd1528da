"""triton.flash's backward on problems the gradient cases are too small for, under Triton's
interpreter: several query and key blocks (32 x 32 interpreted), bottom-right causal with
L != S (rows that see no key), per-row key lengths (some 0) and GQA, judged by the gradient
cases' own rule (``gradients/masked``'s judge: every input and weight gradient against the
float64 oracle's). A planted bug in the dk/dv kernel's causal block range, which the short
gradient cases cannot reach, must fail here.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.conftest import ROOT

pytest.importorskip("torch")
# Before triton itself: this module sets TRITON_INTERPRET=1 without a GPU, and triton decides
# interpreter or compiler when its own @triton.jit helpers (tl.zeros, ...) are decorated.
from implementations.kernels import triton_flash  # noqa: E402  (after the skip)
from implementations.kernels.triton_flash import TritonFlash  # noqa: E402
from suite.conformance import catalog
from suite.conformance.judge import Outcome
from suite.spec.problem import Mask, make_problem

L_ROWS = 40


def _lens(S: int) -> np.ndarray:
    """(B, L) per-row key lengths: a growing window, and a batch item whose first rows see no key."""
    first = np.minimum(3 + np.arange(L_ROWS), S)
    second = np.where(np.arange(L_ROWS) < 10, 0, S - 30)
    return np.stack([first, second])


PROBLEMS = {  # name -> (B, L, S, E, H, K, mask): each over several query and key blocks
    # bottom-right causal with L < S, per-row lengths, GQA (H = 4 query heads, K = 2 kv heads)
    "bottom_right_lens_gqa": (2, L_ROWS, 70, 64, 4, 2,
                              Mask(valid_lens=_lens(70), causal=True, causal_align="bottom_right")),
    # bottom-right with L > S: the first 25 rows see no key (the forward gives them zeros)
    "bottom_right_empty_rows": (2, 70, 45, 32, 2, 1, Mask(causal=True, causal_align="bottom_right")),
    # top-left with L > S: the causal diagonal crosses key blocks at other places
    "top_left_cross": (1, 70, 45, 64, 4, 2, Mask(causal=True)),
}


def judge(impl, name: str, dtype: str = "float32") -> Outcome:
    B, L, S, E, H, K, mask = PROBLEMS[name]
    p = make_problem(len(name), B, L, S, E, H, K, mask=mask)
    case = catalog.get("gradients", "masked")
    out = Outcome(impl.name, "cpu-interpret", dtype, "gradients", name, 0, "pass")
    return case.judge_problem(impl, out, p)


def interpreted() -> bool:
    return "cpu-interpret" in TritonFlash().devices()


pytestmark = [
    pytest.mark.skipif(triton_flash.triton is None, reason="triton is not installed"),
    pytest.mark.skipif(triton_flash.triton is not None and not interpreted(),
                       reason="a GPU is present: these run interpreted"),
]


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_backward_over_blocks_matches_the_oracle(name):
    out = judge(TritonFlash(), name)
    assert out.outcome == "pass", out.reason
    assert out.comparisons and all(c.passed for c in out.comparisons)


def test_planted_causal_block_range_bug_fails(tmp_path):
    """dk/dv start one query block late: the rows that first see a key block are skipped."""
    source = (ROOT / "implementations" / "kernels" / "triton_kernels.py").read_text()
    right = "start = tl.maximum(pid_n * BLOCK_N - causal_offset, 0) // BLOCK_M * BLOCK_M"
    assert source.count(right) == 1, f"the kernel no longer has {right!r}"
    wrong = "start = tl.maximum(pid_n * BLOCK_N - causal_offset, 0) // BLOCK_M * BLOCK_M + BLOCK_M"
    path = tmp_path / "buggy_triton_block_range.py"
    path.write_text(source.replace(right, wrong))
    spec = importlib.util.spec_from_file_location("buggy_triton_block_range", path)
    buggy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(buggy)

    class Buggy(TritonFlash):
        name = "bug.triton_block_range"
        kernels = buggy

    out = judge(Buggy(), "top_left_cross")
    assert out.outcome == "fail", out.reason
    assert "grad key" in out.reason or "grad w_k" in out.reason, out.reason
