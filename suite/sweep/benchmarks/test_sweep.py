"""The sweep: one pytest-benchmark point per (implementation, device, grid point)."""

from __future__ import annotations

import pytest

from suite.conformance.sample import sweep_left_out
from suite.results.vocabulary import Status
from suite.sweep import timing
from suite.sweep.measure import measure, point_info
from suite.sweep.point import point_key
from suite.sweep.session import POINT


def test_point(benchmark, sweep_point, sweep_session, request):
    entry, device, point = sweep_point
    session = sweep_session
    impl = entry.impl
    # a timeout or harness error past measure() is recorded against the point's record
    request.node.stash[POINT] = point_info(impl, entry.name, point)
    if point_key(request.node.stash[POINT]) in session.done:
        pytest.skip("resumed: already measured")

    left = sweep_left_out(impl, device, point, session.spec) if session.spec.get("sample") \
        else None
    if left:  # the main job's sample: said in the results, the report and the console
        session.record_not_measured(request.node.stash[POINT], Status.SKIPPED, left)
        pytest.skip(f"{Status.SKIPPED}: {left}")

    def timer(fn, warm_s: float) -> str:  # pytest-benchmark times the calls
        return timing.run_benchmark(benchmark, fn, warm_s, session.timing)

    result = measure(impl, entry.name, point, timer,
                     budget_gb=session.spec.get("memory_budget_gb"))
    request.node.stash[POINT] = result.info
    if result.status != Status.OK:
        session.record_not_measured(result.info, result.status, result.reason)
        said = (entry.name, result.status, result.reason)
        if (result.status != Status.UNSUPPORTED or not result.reason.startswith("needs ")) \
                and said not in session.said:
            session.said.add(said)
            session.not_measured_note(entry.name, request.node.callspec.id, str(result.status),
                                      result.reason)
        pytest.skip(f"{result.status}: {result.reason}")
    benchmark.extra_info.update(result.info)
    stats = benchmark.stats.stats
    median = stats.median
    benchmark.extra_info["flops_per_s"] = result.info["flops"] / median if median > 0 else None
    # the rounds' spread, and whether it is too wide for the report's comparisons
    spread = timing.spread(median, stats.iqr, stats.iqr_outliers, stats.rounds)
    benchmark.extra_info["noisy"] = spread["noisy"]
    session.record_point(benchmark.stats.as_dict(include_data=False))  # finished: saved
    session.note_point(f"{entry.name:<18} {device:<6} {point.dtype:<8} L={point.L:<6} H={point.H:<3} "
                 f"{point.mask:<10} median {median * 1e3:9.3f} ms  "
                 f"{result.info['flops'] / median / 1e9:8.1f} GFLOP/s")
    if spread["noisy"]:
        session.note_point(f"noisy: {entry.name} {device} {point.dtype} L={point.L} H={point.H} "
                     f"{point.mask}: {spread['noisy']}; {timing.NOISY_ADVICE}")
