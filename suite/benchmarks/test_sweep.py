"""The sweep: one pytest-benchmark point per (implementation, device, grid point)."""

from __future__ import annotations

import time
from typing import Any, Dict

import pytest

from suite import timing
from suite.benchmarks.conftest import (
    POINT,
    STATE,
    _spec,
    note,
    record_not_measured,
    record_point,
)
from suite.outputs import VERIFIED, check_output
from suite.plugin import Unsupported, array_library, expressible, interpreted
from suite.point import point_key
from suite.pytest_plugin import Timeout
from suite.sweep import MASK_FEATURE, point_problem


def _not_measured(request: pytest.FixtureRequest, extra: Dict[str, Any],
                  exc: BaseException) -> None:
    """Record a point that raised (timeout, oom or error) and skip it; the sweep goes on."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, Timeout):
        status = "timeout"
    elif isinstance(exc, Unsupported):  # the plugin cannot express this point's problem
        status = "unsupported"
    elif isinstance(exc, MemoryError) or "OutOfMemory" in text or "RESOURCE_EXHAUSTED" in text \
            or "out of memory" in text.lower():
        status = "oom"
    else:
        status = "error"
    reason = text[:500]
    record_not_measured(request.config, extra, status, reason)
    note(request.config, f"{status}: {request.node.callspec.id}: {reason}"[:300])
    pytest.skip(f"{status}: {reason}")


def test_point(benchmark, sweep_point, request):
    entry, device, point = sweep_point
    config = request.config
    state = config.stash[STATE]
    impl = entry.impl
    B, L, H, dtype = point.B, point.L, point.H, point.dtype
    extra: Dict[str, Any] = {
        "impl": entry.name, "framework": impl.framework, "array_library": array_library(impl),
        "framework_version": impl.framework_version(), **point.info(), **timing.flops(point)}
    request.node.stash[POINT] = extra  # a timeout or harness error is recorded against it
    if point_key(extra) in state["done"]:
        pytest.skip("resumed: already measured")
    if interpreted(device):  # an interpreter's times say nothing of the kernel on its hardware
        record_not_measured(config, extra, "skipped", f"{device}: interpreted, never timed")
        pytest.skip(f"{device}: interpreted, never timed")
    needs = {MASK_FEATURE[point.mask], "gqa" if point.K != H else None,
             "grad" if point.grad else None} - {None}
    missing = sorted(needs - set(impl.features))
    if dtype not in impl.dtypes(device):
        missing.append(f"dtype {dtype}")
    if missing:
        record_not_measured(config, extra, "unsupported", f"needs {', '.join(missing)}")
        pytest.skip(f"unsupported: needs {', '.join(missing)}")
    model = getattr(impl, "memory_model", "quadratic")
    need = timing.predicted_bytes(point, model)
    budget_gb = _spec(config).get("memory_budget_gb")
    free = timing.available_bytes(device)
    budget = budget_gb * 2**30 if budget_gb else (free * 0.5 if free else None)
    if budget is not None and need > budget:
        reason = f"predicted {need / 2**30:.1f} GiB > budget {budget / 2**30:.1f} GiB"
        record_not_measured(config, extra, "skipped", reason)
        pytest.skip(reason)
    p = expressible(impl, point_problem(point))  # one key/value source: value = key
    try:
        start = time.perf_counter()
        st = impl.prepare(p, device, dtype, grad=point.grad)
        prepare_s = time.perf_counter() - start
        compile_s = st.get("compile_s") if isinstance(st, dict) else getattr(st, "compile_s", None)
        start = time.perf_counter()
        handle = impl.run(st)  # untimed: the warm-up, and the call whose output is checked
        impl.synchronize(st)
        warm_s = time.perf_counter() - start
        invalid = check_output(impl.fetch(st, handle), (B, L, point.E))  # untimed
        check_s = time.perf_counter() - start
    except Exception as exc:  # recorded for this point; the sweep goes on
        _not_measured(request, extra, exc)
    if invalid:
        record_not_measured(config, extra, "invalid-output", invalid)
        note(config, f"invalid-output: {request.node.callspec.id}: {invalid}"[:300])
        pytest.skip(f"invalid-output: {invalid}")
    extra.update(compile_s=compile_s, prepare_s=prepare_s, warm_s=warm_s, check_s=check_s,
                 verified=VERIFIED, status="ok", reason=None)
    benchmark.extra_info.update(extra)

    def timed():
        impl.run(st)
        impl.synchronize(st)  # the device barrier is inside the timed region

    try:
        # The peak over the point's calls (buffers are freed between them), read outside
        # the timed calls: no extra untimed call just for memory.
        start = time.perf_counter()
        with timing.peak_memory(array_library(impl), device) as mem:
            mode = timing.run_benchmark(benchmark, timed, warm_s, _spec(config)["timing"])
        bench_s = time.perf_counter() - start
    except Exception as exc:
        _not_measured(request, extra, exc)
    benchmark.extra_info.update(peak_bytes=mem["peak_bytes"], peak_method=mem["peak_method"],
                                benchmark_s=bench_s, benchmark_mode=mode)
    median = benchmark.stats.stats.median
    benchmark.extra_info["flops_per_s"] = extra["flops"] / median if median > 0 else None
    record_point(config, benchmark.stats.as_dict(include_data=False))  # finished: saved
    note(config, f"{entry.name:<18} {device:<6} {dtype:<8} L={L:<6} H={H:<3} {point.mask:<10} "
                 f"median {median * 1e3:9.3f} ms  {extra['flops'] / median / 1e9:8.1f} GFLOP/s")
