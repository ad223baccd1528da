"""The sweep session: one object per sweep that holds its grid, results and saving.

Like pytest-benchmark's ``BenchmarkSession(config)``: ``mha-suite sweep`` builds a
``SweepSession`` from its spec (plain data, in the same process: no file in between) and
hands it to ``pytest.main`` as a plugin; the hooks below are its methods, and the test of a
point (``suite.sweep.benchmarks.test_sweep``) reaches it through ``SweepSession.of(config)``.

Results are pytest-benchmark JSON, merged into the results file (``suite.results.records``) as
points finish (the first at once, then at ``records.SavePeriod``'s pace; all of them on
Ctrl-C, SIGTERM and at the end), with the points that could not be measured in
``mha_suite_not_measured``; a point is saved only once it finished, so an interrupted point
is never recorded. ``--resume`` runs only the points not measured in the file.
"""

from __future__ import annotations

import platform
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import pytest

from suite.plugins import interface
from suite.plugins.selection import Selection
from suite.results import records
from suite.results.vocabulary import Status, first_of
from suite.sweep import timing
from suite.timeouts import Timeout

PLUGIN_NAME = "mha_suite_sweep_session"
SESSION = pytest.StashKey["SweepSession"]()  # this run's session, set at configure
POINT = pytest.StashKey[dict]()  # the point's record so far, set by test_point


class SweepSession:
    """A sweep's spec (grid, timing, output), its finished points, and their saving."""

    def __init__(self, spec: Dict[str, Any], selection: Optional[Selection] = None) -> None:
        self.spec = spec
        self.selection = selection
        self.config: Optional[pytest.Config] = None
        self.done: Set[tuple] = set()
        self.points: List[dict] = []
        self.not_measured: List[dict] = []
        # (implementation, status, reason) said on the console: each once, its other points
        # counted in the summary and kept in the results (six interpreted kernels printed 108
        # identical "never timed" lines in the main job)
        self.said: Set[tuple] = set()
        # A brief sweep (the main job) says each (status, reason) once at its end, naming
        # the implementations: (status, reason) -> names, in the order met.
        self.said_later: Dict[tuple, List[str]] = {}
        self.run_info: Optional[Dict[str, Any]] = None
        self.count = 0  # points finished in this run (measured or not)
        self.saved = 0  # ... of which saved
        self.threads: Dict[str, Any] = {}
        self.progress = None
        self.task = None
        self.combos: Set[Tuple[str, str, str]] = set()
        self.peak_combos: List[Tuple[str, str, str]] = []
        self.started = time.perf_counter()
        self.peak_s = 0.0
        self.save_s = 0.0
        self.period = records.SavePeriod()  # when the results file is next rewritten
        self.interrupted: Optional[str] = None
        self.save_error: Optional[str] = None  # the first failed save: the run stops there
        self.written: Optional[Path] = None  # the file saved into (this machine's own file
        # when --out's holds another machine's points)

    @staticmethod
    def of(config: pytest.Config) -> Optional[SweepSession]:
        return config.stash.get(SESSION, None)

    @property
    def timing(self) -> Dict[str, Any]:
        return self.spec["timing"]

    @property
    def out(self) -> str:
        return self.spec["out"]

    # -- hooks ---------------------------------------------------------------------------

    def pytest_configure(self, config: pytest.Config) -> None:
        self.config = config
        config.stash[SESSION] = self
        if self.selection is None:
            self.selection = Selection.from_config(config)
        timing.fix_malloc_thresholds()  # before the points allocate: comparable CPU memory
        if self.spec.get("resume"):
            own = records.machine_path(self.out, {"machine_info": {"node": platform.node()}})
            self.done = records.measured_keys(self.out) | records.measured_keys(own)
        self.threads = timing.pin_threads(self.spec.get("threads"))
        # the sweep's wall time runs from here: collection (registry, imports) included
        self.started = time.perf_counter()

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # SIGTERM (a CI job cancelled, `kill`) is handled as Ctrl-C: finished points are kept.
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            def terminate(signum, frame):
                self.interrupted = "SIGTERM"
                raise KeyboardInterrupt("SIGTERM")

            signal.signal(signal.SIGTERM, terminate)

    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: List[pytest.Item]) -> None:
        # Measure the machine before any point (a matmul right before a timed point slows it).
        for item in items:
            cs = getattr(item, "callspec", None)
            param = cs.params.get("sweep_point") if cs else None
            if isinstance(param, tuple):  # not pytest's placeholder of an empty grid
                entry, device, point = param
                self.combos.add((interface.array_library(entry.impl), device, point.dtype))
        start = time.perf_counter()
        self.run_info = records.run_info(config)
        self.peak_s = time.perf_counter() - start
        if not self.spec.get("progress", True):  # --no-progress: plain lines only
            return
        from suite.progress import progress_bar

        self.progress = progress_bar("sweep")
        self.progress.start()
        self.task = self.progress.add_task("sweep", total=len(items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(self, config: pytest.Config,
                                             machine_info: dict) -> None:
        """The sweep's own facts: pinned threads, preset, shard, and the matmul peak of every
        framework:device:dtype it times (measured before the points, and again after them
        in pytest_sessionfinish; the share of peak uses the higher)."""
        combos = sorted(self.combos)
        peaks = timing.matmul_peaks(combos)
        self.peak_combos = combos
        machine_info.setdefault("mha_suite", {}).update(
            threads=self.threads, matmul_peak_flops=peaks,
            matmul_peak_runs=timing.combine_peaks(peaks, {})[1],
            preset=self.spec.get("preset"), shard=self.spec.get("shard"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        """A point that failed past test_point's own handling (pytest-timeout's --timeout, a
        harness error) is recorded as not measured, with the reason, and the sweep goes on."""
        report = yield
        if report.when == "call" and report.failed and POINT in item.stash:
            text = call.excinfo.exconly() if call.excinfo else str(report.longrepr)
            status = Status.TIMEOUT if call.excinfo and call.excinfo.errisinstance(Timeout) \
                else Status.ERROR
            self.record_not_measured(item.stash[POINT], status, text.strip()[:500])
            self.note(f"{status}: {item.nodeid.rsplit('[', 1)[-1].rstrip(']')}: "
                      f"{text.strip().splitlines()[0][:200]}")
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        if self.period.due():
            self.save()
        if self.progress is not None:
            self.progress.advance(self.task)
        if self.save_error:  # a full disk or a file-size limit: nothing more can be kept
            raise KeyboardInterrupt(self.save_error)
        stop = self.spec.get("stop_after")
        if stop is not None and self.count >= stop:
            self.interrupted = self.interrupted or "interrupted"
            raise KeyboardInterrupt(f"--stop-after {stop}")  # the tests' stand-in for Ctrl-C

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self.interrupted = self.interrupted or "interrupted"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        facts = ((self.run_info or {}).get("machine_info") or {}).get("mha_suite")
        if facts and self.count and not self.save_error:  # the peak again, after the points
            before = {k: v["before"] for k, v in facts["matmul_peak_runs"].items()
                      if v["before"] is not None}
            start = time.perf_counter()
            after = timing.matmul_peaks(self.peak_combos)
            self.peak_s += time.perf_counter() - start
            facts["matmul_peak_flops"], facts["matmul_peak_runs"] = timing.combine_peaks(
                before, after)
        if facts and self.points:
            facts["sweep_time"] = summary = self.time_summary()
            self.note("sweep time: " + format_summary(summary))
        if not self.save_error:
            self.save(facts_changed=bool(facts and self.count))
        if self.progress is not None:
            self.progress.stop()
        if self.save_error:
            print(f"mha-suite: error: {self.save_error}; the {_points(self.saved)} saved "
                  f"before are kept in {self.out}", file=sys.stderr)
        elif self.interrupted:
            n = len(self.points) + len(self.not_measured)
            print(f"mha-suite: {self.interrupted}: the {_points(n)} finished in this run are "
                  f"saved in {self.written or self.out}; the point in progress was not "
                  "(run again with --resume to finish)", file=sys.stderr)

    # -- the points ------------------------------------------------------------------------

    def note_point(self, line: str) -> None:
        """A measured point's line, unless the sweep is brief (``--brief``: the main job)."""
        if not self.spec.get("brief"):
            self.note(line)

    def note(self, line: str) -> None:
        """A line above the progress bar, as written: names such as ``torch.sdpa[flash]`` hold
        brackets that rich would read as markup and drop."""
        if self.progress is not None:
            from rich.markup import escape

            self.progress.console.print(escape(line), highlight=False)
        else:
            print(line)

    def not_measured_note(self, name: str, point_id: str, status: str, reason: str) -> None:
        """An implementation's first point not measured for ``reason``: said now, or in a
        brief sweep once per reason at its end (``not_measured_lines``)."""
        if self.spec.get("brief"):
            names = self.said_later.setdefault((status, reason), [])
            if name not in names:
                names.append(name)
            return
        self.note(f"{status}: {point_id}: {reason}"[:300]
                  + " (said once per implementation and reason)")

    def not_measured_lines(self, shown: int = 3) -> List[str]:
        """A brief sweep's lines for what it did not measure: one per status and reason."""
        out = []
        for (status, reason), names in self.said_later.items():
            out.append(f"{status}: {first_of(names, shown)}: {reason}"[:300])
        return out

    def record_point(self, benchmark_dict: Dict[str, Any]) -> None:
        """A finished, checked point (pytest-benchmark's dict of it), saved at its teardown."""
        self.points.append(benchmark_dict)
        self.count += 1

    def record_not_measured(self, info: Dict[str, Any], status: Status, reason: str) -> None:
        self.not_measured.append({**info, "status": Status(status).value, "reason": reason})
        self.count += 1

    def not_measured_counts(self) -> Counter:
        return Counter(x["status"] for x in self.not_measured)

    def save(self, facts_changed: bool = False) -> None:
        """Merge this run's finished points into the results file (when there are new ones,
        or the run's facts changed: the peak after the points, the time summary). A save
        that fails (a full disk, a file-size limit) stops the run: the file keeps the
        points saved before."""
        if self.save_error or self.run_info is None or not self.count or (
                self.count == self.saved and not facts_changed):
            return
        started = time.monotonic()
        try:
            written = records.save_sweep(self.out, self.run_info, self.points,
                                         self.not_measured, self.spec.get("preset"))
        except (OSError, records.ResultsError) as exc:
            self.save_error = f"--out: cannot save {self.out}: " + records.os_reason(exc)
            return
        if str(written) != self.out and self.written != written:
            self.note(f"{self.out} holds another machine's points: this machine's are saved "
                      f"in {written}")
        self.written = written
        self.saved = self.count
        self.save_s += time.monotonic() - started
        self.period.saved(started)

    def time_summary(self) -> Dict[str, Any]:
        """Where this run's wall time went, in seconds, and wall / (timed + compile): the
        timed samples are pytest-benchmark's totals of the rounds."""
        points = self.points
        total = {k: sum((b["extra_info"].get(k) or 0.0) for b in points)
                 for k in ("prepare_s", "compile_s", "check_s", "benchmark_s")}
        timed = sum(b["stats"]["total"] for b in points)
        wall = time.perf_counter() - self.started
        accounted = total["prepare_s"] + total["check_s"] + total["benchmark_s"] \
            + self.peak_s + self.save_s
        return {"points": len(points), "wall_s": wall, "timed_s": timed,
                "compile_s": total["compile_s"], "prepare_s": total["prepare_s"],
                "check_s": total["check_s"],
                "benchmark_untimed_s": total["benchmark_s"] - timed, "peak_s": self.peak_s,
                "save_s": self.save_s, "other_s": wall - accounted,
                "ratio": wall / (timed + total["compile_s"]) if timed else None}


def format_summary(x: Dict[str, Any]) -> str:
    ratio = "n/a" if x["ratio"] is None else f"{x['ratio']:.2f}x"
    return (f"{x['wall_s']:.1f} s wall for {x['timed_s']:.1f} s timed + {x['compile_s']:.1f} s "
            f"compile ({ratio}); {x['points']} points; prepare {x['prepare_s']:.1f} s (compile "
            f"included), warm-up+check {x['check_s']:.1f} s, benchmark untimed "
            f"{x['benchmark_untimed_s']:.1f} s, matmul peak {x['peak_s']:.1f} s, saving "
            f"{x['save_s']:.1f} s, other (collection, imports, skips) {x['other_s']:.1f} s")


def _points(n: int) -> str:
    return f"{n} point" if n == 1 else f"{n} points"
