"""The matmul peak: long enough to repeat, measured before and after, the higher used."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from suite.sweep import timing


class FakeClock:
    """perf_counter that advances by the next duration each time a call finishes."""

    def __init__(self, durations):
        self.now, self.durations, self.reads = 0.0, iter(durations), 0

    def __call__(self):
        self.reads += 1
        if self.reads % 2 == 0:  # the read after a call: that call's duration has passed
            self.now += next(self.durations)
        return self.now


def test_best_seconds_repeats_until_the_total_and_keeps_the_fastest(monkeypatch):
    clock = FakeClock(itertools.cycle([0.3, 0.2, 0.25]))
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    calls = []
    best = timing._best_seconds(lambda: calls.append(1), lambda x: x, min_total_s=1.0)
    assert best == pytest.approx(0.2)
    assert len(calls) == 1 + 4  # warm-up, then 0.3 + 0.2 + 0.25 + 0.3 = 1.05 s >= 1 s


def test_best_seconds_takes_at_least_three_repeats(monkeypatch):
    monkeypatch.setattr(timing.time, "perf_counter", FakeClock(itertools.repeat(5.0)))
    calls = []
    timing._best_seconds(lambda: calls.append(1), lambda x: x, min_total_s=1.0)
    assert len(calls) == 1 + 3


def test_combine_peaks_uses_the_higher_and_records_the_spread():
    higher, runs = timing.combine_peaks({"numpy:cpu:float32": 100.0, "torch:cpu:float32": 80.0},
                                        {"numpy:cpu:float32": 90.0, "jax:cpu:float32": 70.0})
    assert higher == {"numpy:cpu:float32": 100.0, "torch:cpu:float32": 80.0,
                      "jax:cpu:float32": 70.0}
    assert runs["numpy:cpu:float32"] == {"before": 100.0, "after": 90.0,
                                         "spread": pytest.approx(0.1)}
    assert runs["torch:cpu:float32"]["spread"] is None  # measured once: no spread


def test_numpy_peak_is_positive_and_unknown_frameworks_have_none():
    assert timing.matmul_peak("numpy", "cpu", "float32", n=64, min_total_s=0.01) > 0
    assert timing.matmul_peak("numpy", "cpu", "bfloat16") is None
    assert timing.matmul_peak("nope", "cpu", "float32") is None


def test_timing_asks_jax_not_the_implementations_for_its_device():
    source = open(timing.__file__).read()
    assert "from implementations" not in source and "import implementations" not in source


_SEES_AGAIN = """
import numpy as np
from suite.sweep import timing

def touch(n_bytes):
    a = np.ones(n_bytes // 8)  # written: every page resident
    return float(a[-1])

if not timing.fix_malloc_thresholds():
    print("not glibc")
    raise SystemExit(0)
size = 16 * 2**20  # below glibc's largest dynamic mmap threshold (32 MiB)
touch(size)  # freed: by default glibc would keep the next one in its heap
for _ in range(2):
    with timing.peak_memory("numpy", "cpu") as mem:
        touch(size)
    print(mem["peak_method"], mem["peak_bytes"])
"""


def test_cpu_memory_sees_a_buffer_again_after_an_equal_one_was_freed():
    # A fresh process, as a sweep's: a test runner's worker (pytest-xdist, its threads and
    # the heaps earlier tests left) is not the process whose memory the sweep measures.
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _SEES_AGAIN], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    if proc.stdout.startswith("not glibc"):
        pytest.skip("not glibc: malloc thresholds cannot be pinned")
    size = 16 * 2**20
    runs = [line.split() for line in proc.stdout.splitlines()]
    assert len(runs) == 2, proc.stdout
    for method, peak_bytes in runs:
        assert method == "rss_hwm_delta"
        assert float(peak_bytes) >= 0.9 * size


def test_every_cpu_framework_gets_the_same_memory_method():
    methods = set()
    for framework in ("numpy", "torch", "jax", "mine"):
        with timing.peak_memory(framework, "cpu") as mem:
            pass
        methods.add(mem["peak_method"])
    assert methods == {"rss_hwm_delta"}


def test_the_peak_product_is_the_default_unless_the_environment_names_one(monkeypatch):
    """$MHA_SUITE_PEAK_PRODUCT (the tests' conftest sets a small one for their sweeps)."""
    monkeypatch.delenv(timing.PEAK_PRODUCT_ENV, raising=False)
    assert timing._peak_product() == (2048, timing.PEAK_MIN_TOTAL_S)
    monkeypatch.setenv(timing.PEAK_PRODUCT_ENV, "64,0.01")
    assert timing._peak_product() == (64, 0.01)
    asked = []
    monkeypatch.setattr(timing, "matmul_peak", lambda *a, **k: asked.append(k) or 1.0)
    assert timing.matmul_peaks([("numpy", "cpu", "float32")]) == {"numpy:cpu:float32": 1.0}
    assert asked == [{"n": 64, "min_total_s": 0.01}]
    monkeypatch.setenv(timing.PEAK_PRODUCT_ENV, "big")
    with pytest.raises(ValueError, match="MHA_SUITE_PEAK_PRODUCT: expected 'n,seconds'"):
        timing._peak_product()
