"""Measuring one point of one implementation: the one place that does it.

``measure`` runs the steps of a sweep point in order and returns a typed ``Measurement``:
feature checks, the memory budget, prepare (compile included), the untimed warm-up call
whose output is checked, the timed calls (through a timer the caller passes: the sweep's
is pytest-benchmark's fixture), and a ``Status`` for whatever stopped it. ``prepare`` and
``Prepared.call`` are the same steps for a caller with its own timer (``suite.sweep.fidelity``)
or its own capture (``suite.conformance.repro``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, Optional

from suite.plugins.fetch_check import VERIFIED, check_output
from suite.plugins.interface import (
    Implementation,
    Unsupported,
    array_library,
    declared,
    expressible,
    handed,
    interpreted,
)
from suite.results.vocabulary import Status
from suite.sweep import timing
from suite.sweep.point import MASK_FEATURE, Point
from suite.timeouts import Timeout

REASON_CHARS = 500  # a recorded reason is cut here: the results file stays readable

# timer(fn, warm_s) times ``fn`` (one call: run + barrier) and returns how it did (a mode
# name); ``warm_s`` is the untimed warm-up call's seconds, so the timer can plan rounds.
Timer = Callable[[Callable[[], None], float], str]


@dataclasses.dataclass
class Prepared:
    """An implementation's prepared state for one problem, and the seconds it took."""

    impl: Implementation
    state: Any
    prepare_s: float  # prepare's wall time, compile included
    compile_s: Optional[float]  # what the plugin says compiling took, if it says

    def call(self) -> Any:
        """One call, synchronized: the plugin's run and its device barrier; the handle."""
        handle = self.impl.run(self.state)
        self.impl.synchronize(self.state)
        return handle


def prepare(impl: Implementation, problem: Any, device: str, dtype: str,
            grad: bool = False) -> Prepared:
    """``impl.prepare`` on ``problem`` (one key/value source: value = key), timed."""
    start = time.perf_counter()
    # the problem as the plugin takes it: one key/value source, its kv grouping, a paged
    # cache's pool alone
    state = impl.prepare(handed(impl, expressible(impl, problem)), device, dtype, grad=grad)
    prepare_s = time.perf_counter() - start
    compile_s = state.get("compile_s") if isinstance(state, dict) else getattr(
        state, "compile_s", None)
    return Prepared(impl, state, prepare_s, compile_s)


@dataclasses.dataclass
class Measurement:
    """One point of one implementation: its status, and what was measured of it.

    ``info`` is the point's record (pytest-benchmark's ``extra_info``): the point, the
    implementation, FLOPs, and for a measured point the seconds of each step (``*_s``),
    ``peak_bytes`` and the timer's ``benchmark_mode``.
    """

    status: Status
    reason: Optional[str]
    info: Dict[str, Any]


def point_info(impl: Implementation, name: str, point: Point) -> Dict[str, Any]:
    """The record every outcome of a point starts from (implementation, point, FLOPs)."""
    return {"impl": name, "framework": impl.framework, "array_library": array_library(impl),
            "framework_version": impl.framework_version(), **point.info(),
            **timing.flops(point)}


def missing(impl: Implementation, point: Point) -> list:
    """What ``impl`` lacks for ``point``: features, then the dtype on the point's device."""
    needs = {MASK_FEATURE[point.mask], "gqa" if point.K != point.H else None,
             "grad" if point.grad else None} - {None}
    out = sorted(needs - set(impl.features))
    if point.dtype not in impl.dtypes(point.device):
        out.append(f"dtype {point.dtype}")
    return out


def budget_bytes(device: str, budget_gb: Optional[float]) -> Optional[float]:
    """The memory a point may be predicted to need: ``budget_gb``, else half of free."""
    if budget_gb:
        return budget_gb * 2**30
    free = timing.available_bytes(device)
    return free * 0.5 if free else None


def classify(exc: BaseException) -> Status:
    """The status of a point that raised: timeout, unsupported, oom or error."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, Timeout):
        return Status.TIMEOUT
    if isinstance(exc, Unsupported):  # the plugin cannot express this point's problem
        return Status.UNSUPPORTED
    if isinstance(exc, MemoryError) or "OutOfMemory" in text or "RESOURCE_EXHAUSTED" in text \
            or "out of memory" in text.lower():
        return Status.OOM
    return Status.ERROR


def _raised(info: Dict[str, Any], exc: BaseException) -> Measurement:
    return Measurement(classify(exc), f"{type(exc).__name__}: {exc}"[:REASON_CHARS], info)


def measure(impl: Implementation, name: str, point: Point, timer: Timer, *,
            budget_gb: Optional[float] = None, problem: Any = None) -> Measurement:
    """Measure ``point`` (its device included) of ``impl``, registered as ``name``.

    ``problem`` defaults to the point's seeded problem (``suite.sweep.presets.point_problem``).
    Never raises for what the plugin does: every way a point ends is a ``Status``.
    """
    info = point_info(impl, name, point)
    if interpreted(point.device):  # an interpreter's times say nothing of the kernel's hardware
        return Measurement(Status.SKIPPED, f"{point.device}: interpreted, never timed", info)
    lacks = missing(impl, point)
    if lacks:
        return Measurement(Status.UNSUPPORTED, f"needs {', '.join(lacks)}", info)
    need = timing.predicted_bytes(point, declared(impl, "memory_model"))
    budget = budget_bytes(point.device, budget_gb)
    if budget is not None and need > budget:
        return Measurement(Status.SKIPPED, f"predicted {need / 2**30:.1f} GiB > budget "
                                           f"{budget / 2**30:.1f} GiB", info)
    if problem is None:
        from suite.sweep.presets import point_problem

        problem = point_problem(point)
    try:
        ready = prepare(impl, problem, point.device, point.dtype, grad=point.grad)
        start = time.perf_counter()
        handle = ready.call()  # untimed: the warm-up, and the call whose output is checked
        warm_s = time.perf_counter() - start
        invalid = check_output(impl.fetch(ready.state, handle), (point.B, point.L, point.E))
        check_s = time.perf_counter() - start
    except Exception as exc:  # recorded for this point; the sweep goes on
        return _raised(info, exc)
    if invalid:
        return Measurement(Status.INVALID_OUTPUT, invalid, info)
    info.update(compile_s=ready.compile_s, prepare_s=ready.prepare_s, warm_s=warm_s,
                check_s=check_s, verified=VERIFIED, status=Status.OK.value, reason=None)
    try:
        # The peak over the point's calls (buffers are freed between them), read outside
        # the timed calls: no extra untimed call just for memory.
        start = time.perf_counter()
        with timing.peak_memory(array_library(impl), point.device) as mem:
            mode = timer(ready.call, warm_s)  # the device barrier is inside the timed region
        bench_s = time.perf_counter() - start
    except Exception as exc:
        return _raised(info, exc)
    info.update(peak_bytes=mem["peak_bytes"], peak_method=mem["peak_method"],
                benchmark_s=bench_s, benchmark_mode=mode)
    return Measurement(Status.OK, None, info)
