"""Planted bugs in the suite's Triton kernels (forward and backward) fail conformance under
Triton's interpreter.

Each bug is one edit of ``implementations/kernels/triton_kernels.py``'s source, loaded as a user's
``--plugin`` whose kernel module is the edited copy: the cases must catch it on the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, conformance_plugins

pytest.importorskip("torch")
pytest.importorskip("triton")

KERNEL = ROOT / "implementations" / "kernels" / "triton_kernels.py"
BUGS = {  # name -> (source text, its buggy replacement, -k of the cases that must catch it)
    # The running output is not rescaled when the row max grows (FlashAttention's alpha).
    "missing_rescale": ("acc = acc * alpha[:, None] + tl.dot(p, v)", "acc = acc + tl.dot(p, v)",
                        "long_rows or odd_lengths"),
    # Off by one on the diagonal: query i no longer sees key i.
    "causal_off_by_one": ("visible & (cols[None, :] <= rows[:, None] + causal_offset)",
                          "visible & (cols[None, :] < rows[:, None] + causal_offset)",
                          "masking and causal"),
    # The key loop stops one block early: the causal diagonal block is skipped (a causal
    # case over several query and key blocks).
    "causal_block_skipped": ("tl.maximum((pid_m + 1) * BLOCK_M + causal_offset, 0)",
                             "tl.maximum(pid_m * BLOCK_M + causal_offset, 0)",
                             "tiles and causal_513"),
}
# Backward bugs: the forward is right, so only the gradient cases can catch them; they run in
# the forward bugs' conformance run (one plugin class each), each failing the gradient case named.
BACKWARD_BUGS = {  # name -> (source text, its buggy replacement, a gradient case it must fail)
    # The weights dk/dv recomputes lose the softmax normalisation: exp(s), not exp(s - lse).
    "dkdv_unnormalised": ("tl.exp2(s - (lse * 1.4426950408889634)[:, None])", "tl.exp2(s)",
                          "plain"),
    # dk without the softmax scale (d s / d k = scale * q).
    "dk_unscaled": ("(dk * scale).to(dk_ptr.dtype.element_ty)", "dk.to(dk_ptr.dtype.element_ty)",
                    "plain"),
    # A kv head's dk keeps only the last query head of its GQA group, not their sum.
    "gqa_dk_last_head": ("dk += tl.dot(tl.trans(dst), q)", "dk = tl.dot(tl.trans(dst), q)", "gqa"),
    # dq without the rowsum(dO * O) term: ds = p * dp.
    "dq_no_delta": ("ds = (p * (dp - delta[:, None]))", "ds = (p * dp)", "plain"),
}
PLUGIN = """
import importlib.util, sys
from implementations.kernels.triton_flash import TritonFlash

spec = importlib.util.spec_from_file_location("buggy_kernels_{name}", {path!r})
buggy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(buggy)


class Buggy(TritonFlash):
    name = "bug.triton_{name}"
    kernels = buggy
"""


def _own_cases(name: str, keyword: str) -> str:
    """A -k clause selecting, of ``name``'s cases, those ``-k keyword`` selects."""
    return f"({name} and ({keyword}))"


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """One conformance run of every planted bug, forward and backward, each on the cases of its
    own ``-k`` (the selection a run of its own would make): each process lists every built-in,
    and the interpreter's first call compiles for seconds."""
    tmp_path = tmp_path_factory.mktemp("triton_bugs")
    source = KERNEL.read_text()
    args, keywords = [], []
    for bug, (right, wrong, cases) in BUGS.items():
        assert source.count(right) == 1, f"the kernel no longer has {right!r}"
        kernel = tmp_path / f"buggy_{bug}.py"
        kernel.write_text(source.replace(right, wrong))
        plugin = tmp_path / f"plugin_{bug}.py"
        plugin.write_text(PLUGIN.format(name=bug, path=str(kernel)))
        args += ["--plugin", str(plugin), "--impl", f"bug.triton_{bug}"]
        keywords.append(_own_cases(f"bug.triton_{bug}", cases))
    plugin = tmp_path / "plugin.py"
    for bug, (right, wrong, _) in BACKWARD_BUGS.items():
        assert source.count(right) == 1, f"the kernel no longer has {right!r}"
        kernel = tmp_path / f"buggy_{bug}.py"
        kernel.write_text(source.replace(right, wrong))
        with plugin.open("a") as f:  # one module-level block per bug, one class each
            f.write(PLUGIN.format(name=bug, path=str(kernel)).replace("class Buggy", f"class Buggy_{bug}")
                    .replace("buggy =", f"buggy_{bug} =").replace("(buggy)", f"(buggy_{bug})")
                    .replace("kernels = buggy", f"kernels = buggy_{bug}"))
        args += ["--plugin", f"{plugin}:Buggy_{bug}", "--impl", f"bug.triton_{bug}"]
        keywords.append(_own_cases(f"bug.triton_{bug}", "test_gradient and (plain or gqa)"))
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "suite.conformance.tests", "-q",
         *conformance_plugins(), "--conformance-json", str(out), *args,
         "--dtype", "float32", "-k", " or ".join(keywords)],
        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())["results"]


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_triton_bug_fails_under_the_interpreter(interpreted, bug):
    proc, results = interpreted
    mine = [r for r in results if r["impl"] == f"bug.triton_{bug}"]
    assert proc.returncode == 1
    assert mine and {r["device"] for r in mine} == {"cpu-interpret"}
    fails = [r for r in mine if r["outcome"] == "fail"]
    assert fails, [(r["case"], r["outcome"]) for r in mine]


def test_planted_triton_backward_bugs_fail_the_gradient_cases(interpreted):
    proc, results = interpreted
    assert proc.returncode == 1
    assert {r["device"] for r in results} == {"cpu-interpret"}
    for bug, (_, _, case) in BACKWARD_BUGS.items():
        mine = {r["case"]: r["outcome"] for r in results if r["impl"] == f"bug.triton_{bug}"}
        assert mine.get(case) == "fail", (bug, mine)
