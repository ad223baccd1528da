"""``mha-suite repro`` and its ``replay.py`` print no warning of the suite's own making: the
judge's oracle caches its passes read-only, which made the replayed problem's weights
read-only too, and ``torch.nn``'s loader (``torch.as_tensor`` of ``W_o.T``) printed torch's
"NumPy array is not writable" warning in the replay (issue #52's suite faults)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_repro_and_its_replay_print_no_not_writable_warning(cli, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "nn"
    made = cli("repro", "torch.nn-cpu-float32-masking/combined", "--out", str(out))
    assert made.returncode == 0, made.stderr[-2000:]
    assert "not writable" not in made.stdout + made.stderr, made.stderr[-2000:]
    ran = subprocess.run([sys.executable, str(out / "replay.py")], capture_output=True,
                         text=True, cwd=ROOT, timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-2000:]
    assert ran.stdout.startswith("torch.nn on cpu/float32, case masking/combined: pass")
    assert "not writable" not in ran.stdout + ran.stderr, ran.stderr[-2000:]
    err = float(ran.stdout.split("saved float64 oracle: max abs error ")[1].split(",")[0])
    assert err < 1e-5, ran.stdout
