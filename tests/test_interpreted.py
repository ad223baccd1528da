"""Kernels run by their interpreters (device cpu-interpret) are checked, never timed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from suite.conformance.summary import matrix_lines
from suite.plugin import INTERPRETED_CPU, interpreted
from tests.conftest import ROOT

TINY = ["--preset", "ci", "--lengths", "16", "--heads", "1", "--mask", "none", "--head-dim", "8",
        "--max-time", "0.01", "--min-rounds", "2"]


def test_the_interpreted_device_is_named_and_recognised():
    assert interpreted(INTERPRETED_CPU) and not interpreted("cpu") and not interpreted("cuda:0")


def test_the_matrix_marks_interpreted_rows():
    rows = [{"impl": "k", "device": INTERPRETED_CPU, "family": "masking", "outcome": "pass"},
            {"impl": "n", "device": "cpu", "family": "masking", "outcome": "pass"}]
    text = "\n".join(matrix_lines(rows))
    assert "k (interpreted)" in text and "n (interpreted)" not in text


def test_a_sweep_never_times_an_interpreted_kernel(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "sweep", "--out", str(tmp_path),
                           *TINY, "--impl", "triton.flash", "--impl", "numpy"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "sweep-ci.json").read_text())
    timed = {b["extra_info"]["impl"] for b in doc["benchmarks"]}
    assert timed == {"numpy"}  # the control is timed; the interpreted kernel is not
    skipped = [x for x in doc["mha_suite_not_measured"] if x["impl"] == "triton.flash"]
    assert skipped and all(x["status"] == "skipped" and "interpreted" in x["reason"]
                           and x["device"] == INTERPRETED_CPU for x in skipped), skipped
