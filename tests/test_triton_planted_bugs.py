"""Planted bugs in the suite's Triton kernel fail conformance under Triton's interpreter.

Each bug is one edit of ``implementations/triton_kernels.py``'s source, loaded as a user's
``--plugin`` whose kernel module is the edited copy: the cases must catch it on the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("torch")
pytest.importorskip("triton")

KERNEL = ROOT / "implementations" / "triton_kernels.py"
BUGS = {  # name -> (source text, its buggy replacement, -k of the cases that must catch it)
    # The running output is not rescaled when the row max grows (FlashAttention's alpha).
    "missing_rescale": ("acc = acc * alpha[:, None] + tl.dot(p, v)", "acc = acc + tl.dot(p, v)",
                        "long_rows or odd_lengths"),
    # Off by one on the diagonal: query i no longer sees key i.
    "causal_off_by_one": ("visible & (cols[None, :] <= offs_m[:, None] + causal_offset)",
                          "visible & (cols[None, :] < offs_m[:, None] + causal_offset)",
                          "masking and causal"),
    # The key loop stops one block early: the causal diagonal block is skipped (a causal
    # case over several query and key blocks).
    "causal_block_skipped": ("tl.maximum((pid_m + 1) * BLOCK_M + causal_offset, 0)",
                             "tl.maximum(pid_m * BLOCK_M + causal_offset, 0)",
                             "tiles and causal_513"),
}
PLUGIN = """
import importlib.util, sys
from implementations.triton_flash import TritonFlash

spec = importlib.util.spec_from_file_location("buggy_kernels_{name}", {path!r})
buggy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(buggy)


class Buggy(TritonFlash):
    name = "bug.triton_{name}"
    kernels = buggy
"""


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_triton_bug_fails_under_the_interpreter(tmp_path, bug):
    right, wrong, cases = BUGS[bug]
    source = KERNEL.read_text()
    assert source.count(right) == 1, f"the kernel no longer has {right!r}"
    kernel = tmp_path / f"buggy_{bug}.py"
    kernel.write_text(source.replace(right, wrong))
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN.format(name=bug, path=str(kernel)))
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "suite.conformance", "-q",
         "-p", "no:cacheprovider", "--conformance-json", str(out), "--plugin", str(plugin),
         "--impl", f"bug.triton_{bug}", "--dtype", "float32", "-k", cases],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert proc.returncode == 1
    assert {r["device"] for r in results} == {"cpu-interpret"}
    fails = [r for r in results if r["outcome"] == "fail"]
    assert fails, [(r["case"], r["outcome"]) for r in results]
