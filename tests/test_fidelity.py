"""The fidelity self-check: both of its timers include the plugin's barrier."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import PLUGINS, ROOT
from tests.plugins.async_work import WORK_S


def fidelity(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "suite.sweep.fidelity", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_fidelity_times_work_that_completes_in_synchronize():
    proc = fidelity("--plugin", str(PLUGINS / "async_work.py"), "--impl", "async.honest",
                    "--length", "16", "--heads", "1", "--head-dim", "8", "--max-time", "0.3",
                    "--min-run-time", "0.3")
    line = next(x for x in proc.stdout.splitlines()  # the verdict, not the sweep's point line
                if x.strip().startswith("async.honest") and "independent" in x)
    sweep_ms, independent_ms, ratio = (float(x) for x in re.search(
        r"sweep\s+([\d.]+) ms.*independent\s+([\d.]+) ms\s+ratio ([\d.]+)", line).groups())
    assert sweep_ms >= WORK_S * 1e3 and independent_ms >= WORK_S * 1e3  # the work, not a launch
    assert abs(ratio - sweep_ms / independent_ms) < 0.01
    assert proc.returncode == (0 if 0.9 <= ratio <= 1.1 else 1), proc.stdout[-2000:]


def test_fidelity_unknown_implementation_is_one_line():
    proc = fidelity("--impl", "no.such")
    assert proc.returncode == 2
    assert proc.stderr.startswith("fidelity: error:") and "no.such" in proc.stderr
