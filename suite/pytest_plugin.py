"""pytest plugin (entry point ``pytest11``): the options that choose implementations.

Options flow one way: command line -> session (``selected_entries``) -> fixtures.
Loaded in every pytest session of an environment with mha-suite installed, so it
imports nothing heavy.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import pytest

from suite import timeouts
from suite.plugins import registry as _registry
from suite.plugins.selection import Selection, add_impl_plugin
from suite.timeouts import TIMED_OUT, Timeout, timed_out  # noqa: F401  (their home until now)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mha-suite", "MHA implementations under test")
    add_impl_plugin(group)
    group.addoption("--device", action="append", default=[], metavar="DEVICE",
                    help="run only on these devices, e.g. cpu, cuda (prefix match; repeatable)")
    group.addoption("--dtype", action="append", default=[], metavar="DTYPE",
                    help="run only these dtypes (repeatable)")
    group.addoption("--repeat", type=int, default=1, metavar="N",
                    help="run each conformance case N times, each on a fresh instance "
                         "(recompiling where the plugin compiles); a case whose outcome "
                         "changes is reported as flaky, with each outcome (default 1)")
    group.addoption("--hypothesis-examples", type=int, default=None, metavar="N",
                    help="examples per implementation for the property-based shapes family "
                         "(derandomised; default 25, 6 for a plugin that compiles each shape, "
                         "5 for an interpreted kernel; raise for longer searches)")
    group.addoption("--sample", action="store_true", default=False,
                    help="run the main job's sample of the cases (suite.conformance.sample): every family, "
                         "a few cases each; what it leaves is counted and saved")
    group.addoption("--cover", action="store_true", default=False,
                    help="run CI's covering selection of the cases (suite.conformance.cover): the main "
                         "job's sample, every lane length once per implementation, and cases "
                         "named by every known-failure entry; what it leaves is counted")
    group.addoption("--shard", default=None, metavar="I/N",
                    help="run part I of N of the selected cases (1-based; units of one "
                         "implementation's family on one device and dtype, dealt round-robin: "
                         "suite.sweep.shard); one results file per part, the report reads them all")
    group.addoption("--brief-summary", action="store_true", default=False,
                    help="after the run, totals per outcome and the implementations with a "
                         "failure or error only (the matrix is the report's; the main job)")
    group.addoption("--strict-declarations", action="store_true", default=False,
                    help="fail the run where a known-failure entry or a known library "
                         "behaviour held here and no case needed it (stale or wrong)")
    group.addoption("--known-failures", action="append", default=[], metavar="FILE",
                    help="more known failures: [[failure]] records (.toml) or the short "
                         "form (test id glob {condition} # reason, one a line)")
    group.addoption("--sweep-spec", default=None, metavar="PATH",
                    help="the sweep grid and output (JSON written by mha-suite sweep)")
    group.addoption("--progress", action="store_true", default=False,
                    help="a progress bar with an ETA instead of pytest's per-test letters")
    group.addoption("--conformance-json", default=None, metavar="PATH",
                    help="write conformance outcomes (err, baseline err, ratio) to PATH")


def session_registry(config: pytest.Config) -> _registry.Registry:
    """The registry for this session: the process's, for --plugin and the environment
    (the CLI that started an in-process session has built it already)."""
    return Selection.from_config(config).registry()


def selected_entries(config: pytest.Config, available_only: bool = False
                     ) -> List[_registry.Entry]:
    return Selection.from_config(config).entries(available_only=available_only)


def device_selected(config: pytest.Config, device: str) -> bool:
    return Selection.from_config(config).device(device)


def dtype_selected(config: pytest.Config, dtype: str) -> bool:
    return Selection.from_config(config).dtype(dtype)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mha_impl(name): the implementation a test runs")
    # A pytest-xdist controller collects nothing, so it never loads the conformance conftest:
    # the conformance session (which gathers the workers' records from their reports, writes
    # the JSON and prints the matrix) is registered here for a distributed conformance run.
    distributed = getattr(config.option, "numprocesses", None) or getattr(config.option, "tx", None)
    if (distributed and not hasattr(config, "workerinput") and not config.option.collectonly
            and _conformance_run(config)):
        from suite.conformance.session import ConformanceSession

        ConformanceSession.ensure(config)
    if _conformance_run(config) and not _logging_asked(config):
        # pytest's log capture attaches its handlers to every non-propagating logger around
        # each phase of each test: torch's dozens made it 12 ms of a case's harness cost, a
        # tenth of a NumPy case (docs/measured/profile.md). A conformance case's outcome is
        # its record, and what a plugin logs still reaches the captured stderr (logging's
        # last resort, WARNING and up). Blocked as ``-p no:logging`` blocks it (pytest's
        # registers in its own trylast pytest_configure, after this one).
        config.pluginmanager.set_blocked("logging-plugin")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # (at session start: pytest's own unraisable-exception hook is installed by then)
    if _conformance_run(session.config):
        sys.unraisablehook = interrupt_again(sys.unraisablehook)


def interrupt_again(previous):
    """``sys.unraisablehook`` that delivers again an interrupt Python could not raise: a
    Ctrl-C (or the SIGTERM a conformance run turns into one) that lands inside a callback
    Python runs for itself (JAX's garbage-collection callback, a finalizer) is "ignored" there,
    and pytest then prints its traceback as a warning. Here the main thread is interrupted
    anew, where the run's handlers save what finished and say so in one line. Any other
    unraisable exception goes to ``previous``."""
    import _thread
    import threading

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # from another thread, a moment later: tripped here, it is raised in this hook
            threading.Timer(0.01, _thread.interrupt_main).start()
            return
        previous(unraisable)

    return hook


def _logging_asked(config: pytest.Config) -> bool:
    """True where the command line or the ini file asks pytest's logging for something."""
    options = ("log_level", "log_file", "log_cli_level", "log_file_level", "log_format")
    if any(getattr(config.option, o, None) for o in options):
        return True
    try:
        return bool(config.getini("log_cli") or config.getini("log_level")
                    or config.getini("log_file"))
    except (ValueError, KeyError):  # pytest run without its logging plugin
        return False


def _conformance_run(config: pytest.Config) -> bool:
    return any(str(a).startswith("suite.conformance") for a in config.args)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """A conformance run's ``--dist loadgroup`` that survives a worker killed mid-case (a
    compiler segfault): pytest-xdist 3.8's loadgroup queues the crashed case and finished
    work again on the replacement worker, which crashes again, then stops with KeyError
    (pytest-dev/pytest-xdist#1189, #1362) or hangs (#1323). Here the crashed case is reported
    once, as xdist reports it, and only the dead worker's unfinished cases move on."""
    if config.getvalue("dist") != "loadgroup" or not _conformance_run(config):
        return None
    return crash_safe_loadgroup()(config, log)


def crash_safe_loadgroup() -> type:
    """``LoadGroupScheduling`` that groups a conformance run's cases by their node ids
    (``_split_scope``), and whose ``remove_node`` forgets the dead worker's collection,
    requeues its unfinished cases but the one it died in, and reschedules only workers
    that have registered their collection, each to at least two cases or to shutdown."""
    from collections import OrderedDict

    from xdist.scheduler import LoadGroupScheduling

    from suite.conformance.session import group_of

    class CrashSafeLoadGroup(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            """A conformance case's unit of work is its group (``group_of``: one
            implementation's cases of one family), read from its node id: pytest-xdist's
            own way of telling its controller the worker's ``xdist_group`` marker (``@group``
            appended to the node id) does nothing under pytest 9.2, and each case went to
            whichever worker was free (measured: numpy/masking split over both workers)."""
            return group_of(nodeid) or super()._split_scope(nodeid)

        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            if not self._pending_of(workload):  # a worker that finished: as xdist does
                return None
            # a crashed one: its collection no longer counts toward a completed collection
            self.registered_collections.pop(node, None)
            crashitem = None
            for scope, unit in workload.items():
                left = OrderedDict((nid, False) for nid, done in unit.items() if not done)
                if crashitem is None and left:  # the first unfinished case was running
                    crashitem = next(iter(left))
                    del left[crashitem]
                if left:
                    self.workqueue[scope] = left
            for other in list(self.assigned_work):
                self._reschedule(other)
            return crashitem

        def _reschedule(self, node):
            if node not in self.registered_collections:  # a replacement may still collect
                return
            super()._reschedule(node)
            # A worker runs an item only once it holds the next (or is told to shut down):
            # a replacement given one unit of one item (what is left of a crashed group)
            # waited forever, and the run with it (two workers crashed, measured).
            while (not node.shutting_down and self.workqueue
                   and self._pending_of(self.assigned_work[node]) < 2):
                self._assign_work_unit(node)
            if not self.workqueue and not node.shutting_down:
                node.shutdown()

    return CrashSafeLoadGroup


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """mha-suite's machine facts (CPU model, cores, GPUs, library versions), in both kinds
    of results file, under ``machine_info["mha_suite"]``."""
    from suite.results.records import machine_extension

    machine_info.setdefault("mha_suite", {}).update(machine_extension())


def _runs_a_plugin(item: pytest.Item) -> bool:
    """A conformance case or a sweep point (other test suites keep pytest-timeout's way)."""
    names = getattr(item, "fixturenames", ())
    return "target" in names or "sweep_point" in names


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> Optional[bool]:
    """pytest-timeout's alarm raising ``Timeout`` inside the plugin's call, so the case or
    point is recorded with one line and the run goes on (instead of a stack dump). A plugin
    stuck in native code never sees the alarm: kill the run, and --resume a sweep."""
    if not settings.timeout or settings.method != "signal" or not _runs_a_plugin(item):
        return None

    timeouts.arm(item, settings.timeout)
    return True


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> Optional[bool]:
    if not _runs_a_plugin(item):
        return None
    timeouts.disarm()
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test that timed out is reported in one line, not with the plugin's traceback."""
    report = yield
    if call.excinfo is not None and call.excinfo.errisinstance(Timeout):
        report.longrepr = f"{item.nodeid}: {call.excinfo.value}"
    return report
