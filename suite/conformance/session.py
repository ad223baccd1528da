"""The conformance session: one object per pytest run that holds its records and options.

Like pytest-benchmark's ``BenchmarkSession(config)``: the hooks below are methods of one
``ConformanceSession`` registered as a pytest plugin, so no module global and no
string-keyed state carry a run. It is registered by the conformance conftest in a serial
run and by ``suite.pytest_plugin`` in a pytest-xdist controller (which collects nothing,
so never loads that conftest); outcomes travel from workers in each report's
``user_properties``.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import signal
import sys
import time
from typing import Dict, List, Optional, Set, Tuple

import pytest

from suite.conformance.families import contracts
from suite.conformance.known_failures import (
    KNOWN_FAILURES_FILE,
    KnownFailuresError,
    Listed,
    read_known_failures,
    unknown_error,
    unknown_implementations,
)
from suite.plugins.interface import builtin_ancestors
from suite.plugins.selection import Selection
from suite.results.records import SavePeriod

PLUGIN_NAME = "mha_suite_conformance_session"
# Family of the tests whose outcome names no family through a ``case`` parameter.
MODULE_FAMILY = {"test_gradients": "gradients", "test_properties": "properties",
                 "test_hypothesis": "hypothesis"}
# Records and matched known-failure patterns travel in each test report's user_properties,
# so the controller of a pytest-xdist run sees every worker's outcomes.
RECORD_KEY = "mha_suite_record"
KNOWN_KEY = "mha_suite_known_failure"  # an entry matched a test where its condition held
NEEDED_KEY = "mha_suite_known_needed"  # ... and absorbed the test's failure
PASSED_KEY = "mha_suite_known_passed"  # ... and the test passed (the entry is wrong there)
SESSION = pytest.StashKey["ConformanceSession"]()  # this run's session


_TARGET = re.compile(r"^(?P<impl>.+?)-(?P<device>cpu-interpret|cpu|cuda(?::\d+)?)-"
                     r"(?P<dtype>float64|float32|float16|bfloat16)(?:-(?P<case>[^/]+/.+))?$")


_PARAMS = re.compile(_TARGET.pattern.replace("(?P<case>[^/]+/.+)", "(?P<rest>.+)"))


def group_of(nodeid: str) -> Optional[str]:
    """The pytest-xdist group of a conformance test, read from its node id: the
    ``{implementation}/{family}`` the session marks it with (``xdist_group``); None for a
    test that runs no implementation. The scheduler reads it here
    (``suite.pytest_plugin.crash_safe_loadgroup``): pytest-xdist 3.8 passes the marker to
    its controller by appending ``@group`` to the worker's node id, which pytest 9.2 no
    longer reads (``Node._id``; pytest-dev/pytest-xdist#1386), so the marker alone left
    every case a unit of its own and an implementation's cases on every worker."""
    if nodeid.rfind("@") > nodeid.rfind("]"):  # a pytest-xdist that suffixed the group
        return nodeid.rsplit("@", 1)[1]
    path, _, test = nodeid.partition("::")
    _, _, params = test.rpartition("::")[2].partition("[")
    m = _PARAMS.match(params.removesuffix("]"))
    if not m:
        return None
    rest = m["rest"] or ""  # a case's family/name, a test's own parameter, or nothing
    fam = rest.split("/", 1)[0] if "/" in rest else MODULE_FAMILY.get(
        path.rsplit("/", 1)[-1].removesuffix(".py"), "other")
    return f"{m['impl']}/{fam}"


def crash_record(nodeid: str, said: str) -> Optional[dict]:
    """The record of a case whose process died while running it (pytest-xdist reports it
    once, ``when="???"``): outcome ``error``, so the results file and the matrix show it."""
    from suite.conformance.catalog import from_test
    from suite.conformance.judge import Outcome

    test, _, params = nodeid.rpartition("::")[2].partition("[")
    m = _TARGET.match(params.removesuffix("]"))
    if not m:
        return None
    family, name = (m["case"].split("/", 1) if m["case"] else from_test(test, None))
    out = Outcome(m["impl"], m["device"], m["dtype"], family or test, name, 0, "error",
                  test_id=nodeid)
    return out.classify("error", f"{said.splitlines()[0] if said else 'crashed'}: the process "
                                 f"running it died (a crash in the library, such as a "
                                 f"segfault); the run went on without it").record()


class _AfterSelection:
    """The session's step that must see the items every other selection left (-k, -m, the
    sample): a hook of its own, trylast, after the session's grouping markers."""

    def __init__(self, session: ConformanceSession) -> None:
        self.session = session

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: List[pytest.Item]) -> None:
        self.session.after_selection(config, items)


def family(item: pytest.Item) -> Optional[str]:
    """The case family of a conformance test (its case's, else its module's); None for a
    test that runs no implementation."""
    cs = getattr(item, "callspec", None)
    if cs is None or not isinstance(cs.params.get("target"), tuple):
        return None  # (or the empty set a per-target parametrisation makes: nothing declared)
    case = cs.params.get("case")
    return case.family if case is not None else MODULE_FAMILY.get(
        item.module.__name__.rsplit(".", 1)[-1], "other")


def case_name(item: pytest.Item) -> str:
    """The case a conformance test runs: its case's name, else the one its function's name
    says (``suite.conformance.catalog.from_test``)."""
    from suite.conformance.catalog import from_test

    params = item.callspec.params
    case = params.get("case")
    if case is not None:
        return case.name
    return from_test(item.originalname, str(params["name"]) if "name" in params else None)[1]


def is_worker(config: pytest.Config) -> bool:
    """True in a pytest-xdist worker: records travel to the controller in the reports."""
    return hasattr(config, "workerinput")


class ConformanceSession:
    """A conformance run's selection, known failures, records, progress bar and saving."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.selection = Selection.from_config(config)
        extra = config.getoption("--known-failures") or []
        try:
            self.entries: Dict[str, Listed] = read_known_failures([KNOWN_FAILURES_FILE, *extra])
        except KnownFailuresError as exc:
            raise pytest.UsageError(f"--known-failures: {exc}") from None
        self.unknown: List[str] = []  # records of --known-failures naming no implementation
        if extra and not is_worker(config):
            self.unknown = unknown_implementations(
                self.entries.values(), self.selection.registry().entries, extra)
            if self.unknown and config.getoption("--strict-declarations"):
                raise pytest.UsageError(unknown_error(self.unknown))
        self.known: Dict[str, str] = {g: e.reason for g, e in self.entries.items()}
        self.conditions = {g: e.where for g, e in self.entries.items()}
        self.records: List[dict] = []
        self.used: Set[str] = set()
        self.needed: Set[str] = set()
        self.passed: Dict[str, str] = {}  # entry -> a test it lists that passed
        self.bar = None
        self.task = None
        self.failed = 0
        self.period = SavePeriod()  # when the results file is next rewritten
        self.json_path: Optional[str] = config.getoption("--conformance-json")
        self._targets: Optional[list] = None
        self.interrupted: Optional[str] = None
        self.save_error: Optional[str] = None  # the first failed save: the run stops there
        self.session: Optional[pytest.Session] = None
        # --sample: impl -> family -> cases the main job's sample left to a full check
        self.left: Dict[str, Dict[str, int]] = {}
        # intermittent known-failure entries whose cases CI's covering selection all left
        self.left_known: Set[str] = set()
        repeat = config.getoption("--repeat")
        if repeat < 1:
            raise pytest.UsageError(f"--repeat: expected a positive int, got {repeat}")

    @classmethod
    def ensure(cls, config: pytest.Config) -> ConformanceSession:
        """This run's session, created and registered on first use."""
        session = config.stash.get(SESSION, None)
        if session is None:
            session = cls(config)
            session.handle_sigterm()
            config.pluginmanager.register(session, PLUGIN_NAME)
            config.pluginmanager.register(_AfterSelection(session), PLUGIN_NAME + "_after")
            config.stash[SESSION] = session
        return session

    @staticmethod
    def of(config: pytest.Config) -> ConformanceSession:
        return config.stash.get(SESSION, None)

    def targets(self) -> list:
        """(entry, device, dtype) triples, computed once per session."""
        if self._targets is None:
            from suite.plugins.registry import PluginError, UnknownImplementation
            from suite.plugins.selection import targets

            try:
                self._targets = list(targets(self.selection))
            except (UnknownImplementation, PluginError) as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._targets

    def known_failure(self, name: str, device: Optional[str] = None,
                      isa: Optional[str] = None, impl: object = None,
                      ended: Optional[Tuple[str, str]] = None) -> Optional[Tuple[str, str]]:
        """(pattern, reason) of the first known-failure entry matching test ``name`` whose
        condition holds here (on ``device`` at level ``isa``); an entry with a condition
        never matches where the environment is not known (``device`` None). A subclass of
        a built-in (``impl``) inherits the built-in's entries, as it inherits its declared
        deviations: its test id with the built-in's name in place of its own matches too.
        ``ended``: the case's (outcome, reason): the first matching entry that covers it
        (``KnownEntry.absorbs``: a record listing the error it raised), else the first
        matching, so two records of one test for two errors each cover their own."""
        names = [(name, "")] + [
            (name.replace(f"[{own}-", f"[{base}-", 1), f"inherited from {base}: ")
            for own in [getattr(impl, "name", None)] if own and f"[{own}-" in name
            for base in builtin_ancestors(impl)]
        found = []
        for pattern, reason in self.known.items():
            for test, inherited in names:
                if fnmatch.fnmatchcase(test, pattern):
                    where = self.conditions.get(pattern)
                    if where is None or where.everywhere() or (
                            device is not None and where.holds(device, isa)):
                        found.append((pattern, inherited + reason))
                        break
        if ended is not None:
            for pattern, reason in found:
                entry = self.entries.get(pattern)
                if entry is not None and entry.absorbs(*ended):
                    return pattern, reason
        return found[0] if found else None

    # -- hooks ---------------------------------------------------------------------------

    def handle_sigterm(self) -> None:
        """SIGTERM (a CI job cancelled, `kill`) is handled as Ctrl-C: what finished is saved.
        (Installed when the session is made: the conftest that makes it in a serial run is
        loaded during collection, after pytest_sessionstart.)"""
        if is_worker(self.config) or signal.getsignal(signal.SIGTERM) not in (
                signal.SIG_DFL, None):
            return

        def terminate(signum, frame):
            self.interrupted = "SIGTERM"
            raise KeyboardInterrupt("SIGTERM")

        signal.signal(signal.SIGTERM, terminate)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: List[pytest.Item]) -> None:
        """An implementation's cases of one family form one xdist group (``--dist loadgroup``
        keeps a group on one worker, which compiles a graph its cases share once); groups of
        an implementation per family, not one, because a compiled plugin's cases alone
        outlast all the others (torch.flex: 170 s of 280 s, measured) and would leave the
        other cores idle. The property-based cases run first: each runs many examples (on a
        compiled plugin, one compile each: torch.flex's took 137 s of a 240 s run), and
        started last, one of them left a worker running alone at the end (longest first is
        the classic fix). pytest-xdist's worker reads the markers in its own hook, after this
        one, but under pytest 9.2 what it does with them never reaches its controller
        (pytest-dev/pytest-xdist#1386): the scheduler reads the same group from each node id
        (``group_of``, ``suite.pytest_plugin.crash_safe_loadgroup``). The shard and the
        progress bar come after every selection (``_AfterSelection``)."""
        self.session = session  # (the serial run's session is made after sessionstart)
        if config.getoption("--sample") or config.getoption("--cover"):
            self.take_sample(config, items, cover=config.getoption("--cover"))
            contracts.SAMPLED = True  # a compiler's agreement: half its problems
        items.sort(key=lambda it: family(it) != "hypothesis")
        for item in items:
            fam = family(item)
            if fam is not None:
                group = f"{item.callspec.params['target'][0].name}/{fam}"
                item.add_marker(pytest.mark.xdist_group(group))

    def after_selection(self, config: pytest.Config, items: List[pytest.Item]) -> None:
        """The shard (of what -k, -m and the sample left) and, with --progress, a bar with an
        ETA over what will run."""
        if config.getoption("--shard"):
            self.take_shard(config, items)
        if not config.getoption("--progress") or not items or is_worker(config):
            return
        from rich.progress import TextColumn

        from suite.progress import progress_bar

        self.bar = progress_bar("conformance", TextColumn("{task.fields[failed]} failed",
                                                          style="red"))
        self.bar.start()
        self.task = self.bar.add_task("", total=len(items), failed=0)

    def take_shard(self, config: pytest.Config, items: List[pytest.Item]) -> None:
        """Deselect the cases of the other parts of ``--shard i/n`` (suite.sweep.shard): its unit
        is one implementation's cases of one family (or test, outside the families) on one
        device in one dtype. A part with no unit stops the run before any case, in one line."""
        from suite.spec.problem import InputError
        from suite.sweep import shard

        try:
            index, count = shard.parse(config.getoption("--shard"))
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(str(exc)) from None

        def unit(item: pytest.Item) -> Tuple[str, ...]:
            params = getattr(getattr(item, "callspec", None), "params", {})
            target = params.get("target")
            if not isinstance(target, tuple):
                return ("", "", "", item.originalname)
            entry, device, dtype = target
            return (entry.name, device, dtype, family(item) or item.originalname)

        units = [unit(it) for it in items]
        try:
            shard.check_has_work(units, index, count,
                                 "an implementation's family on one device and dtype")
        except InputError as exc:
            raise pytest.UsageError(str(exc)) from None
        chosen = shard.select(units, index, count)
        dropped = [it for it, u in zip(items, units) if u not in chosen]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [it for it, u in zip(items, units) if u in chosen]

    def take_sample(self, config: pytest.Config, items: List[pytest.Item],
                    cover: bool = False) -> None:
        """Deselect the cases outside the main job's sample (suite.conformance.sample) or, with
        ``cover``, outside CI's covering selection (suite.conformance.cover), counting them per
        implementation and family; a pytest-xdist worker sends the counts to the controller
        (``workeroutput``), which saves them beside the records."""
        from suite.conformance import cover as _cover
        from suite.plugins.declarations import MASK_FORMS

        runs = [(i, it) for i, it in enumerate(items) if family(it) is not None]
        chosen = []
        for _, item in runs:
            entry, device, dtype = item.callspec.params["target"]
            chosen.append(_cover.Item(item.name, entry.impl, entry.name, device, dtype,
                                      family(item), case_name(item)))
        if cover:
            flaky = [g for g in self.known if self.intermittent(g)]
            keep = _cover.choose(chosen, [g for g in self.known if g not in flaky], MASK_FORMS)
            self.left_known = set(_cover.left_entries(chosen, keep, flaky))
        else:
            from suite.conformance.sample import sampled

            keep = [sampled(c.impl, c.device, c.family, c.case, MASK_FORMS) for c in chosen]
        self.left = _cover.left_counts(chosen, keep)
        dropped = {i for (i, _), kept in zip(runs, keep) if not kept}
        if dropped:
            config.hook.pytest_deselected(items=[items[i] for i in sorted(dropped)])
            items[:] = [it for i, it in enumerate(items) if i not in dropped]
        if is_worker(config):
            config.workeroutput["mha_suite_left"] = self.left
            config.workeroutput["mha_suite_left_known"] = sorted(self.left_known)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """pytest-xdist: a worker's counts of the cases its sample left (every worker
        collects the same items, so the first worker's counts are the run's)."""
        left = getattr(node, "workeroutput", {}).get("mha_suite_left")
        if left and not self.left:
            self.left = left
        left_known = getattr(node, "workeroutput", {}).get("mha_suite_left_known")
        if left_known and not self.left_known:
            self.left_known = set(left_known)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report, config: pytest.Config):
        """With --progress, pytest's per-test letters are left out (the bar counts instead)."""
        result = yield
        if self.bar is not None and result:
            category, _letter, word = result
            return category, "", word
        return result

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect records from the reports (this process's or, under xdist, the workers'),
        advance the progress bar and save the results JSON now and then."""
        if is_worker(self.config):
            return
        if report.when == "call" and report.failed:
            self.failed += 1
        if report.when == "???" and report.failed:  # pytest-xdist: a worker died in this test
            self.failed += 1
            crashed = crash_record(report.nodeid, str(report.longrepr))
            if crashed is not None:
                self.records.append(crashed)
        if report.when != "teardown":  # the last report of a test carries all its properties
            return
        for key, value in report.user_properties:
            if key == RECORD_KEY:
                self.records.append(value)
            elif key == KNOWN_KEY:
                self.used.add(value)
            elif key == NEEDED_KEY:
                self.needed.add(value)
            elif key == PASSED_KEY:
                self.passed.setdefault(value[0], value[1])
        if self.bar is not None:
            self.bar.update(self.task, advance=1, failed=self.failed)
        if self.period.due():
            self.save()  # a killed run keeps what it measured (Ctrl-C, SIGTERM: all of it)

    def save(self) -> None:
        """Merge the records into --conformance-json. A save that fails (a full disk, a
        file-size limit) stops the run: the file keeps the records saved before."""
        started = time.monotonic()
        if self.json_path and self.records and not self.save_error:
            from suite.conformance.summary import write_json
            from suite.results import records

            try:
                write_json(self.json_path, self.records, self.config, self.left)
            except (OSError, records.ResultsError) as exc:
                self.save_error = (f"--json: cannot save {self.json_path}: "
                                   f"{records.os_reason(exc)}")
                if self.session is not None:
                    self.session.shouldstop = self.save_error
        self.period.saved(started)

    def declaration_errors(self) -> List[str]:
        """With --strict-declarations, what makes the run fail though every case passed: a
        known-failure entry that named a test which passed here (the library may be fixed,
        or the entry names too much), and a known library behaviour whose conditions held in
        some case and that no case needed (both are warnings without the option)."""
        from suite.conformance.summary import stale_known_lines

        if not self.config.getoption("--strict-declarations") or self.interrupted:
            return []
        out = [f"error: known failure {self.entries[pattern].label()} lists {test}, which "
               "passed here (held "
               "nowhere it was needed: narrow or remove the entry)"
               for pattern, test in sorted(self.passed.items()) if pattern not in self.needed
               and not self.intermittent(pattern)]
        if not self.narrowed():  # a narrowed run may leave out the cases that show one
            out += [line.replace("warning: ", "error: ", 1)
                    for line in stale_known_lines(self.records)]
        return out

    def intermittent(self, pattern: str) -> bool:
        """Whether known-failure entry ``pattern`` holds only at times (a run where its
        cases pass cannot show it stale)."""
        return bool(getattr(self.conditions.get(pattern), "intermittent", False))

    def narrowed(self) -> bool:
        """True for a run narrowed by -k, --impl, --device, --dtype or --shard."""
        return bool(self.config.option.keyword or any(
            self.config.getoption(o) for o in ("--impl", "--device", "--dtype", "--shard")))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """--strict-declarations: a stale or wrong declaration fails the run (exit 1)."""
        if is_worker(self.config) or exitstatus not in (0, pytest.ExitCode.OK):
            return
        if self.declaration_errors():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config: pytest.Config
                                ) -> None:
        if is_worker(config):
            return
        if self.bar is not None:
            self.bar.stop()
        for line in self.unknown:
            terminalreporter.write_line(f"warning: {line}")
        if not self.records:
            return
        from suite.conformance.summary import (
            brief_lines,
            matrix_lines,
            stale_known_lines,
            stale_lines,
        )

        unused = set(self.known) - self.used - self.left_known
        filtered = self.narrowed()
        envs = {(r.get("device"), r.get("isa")) for r in self.records}
        for pattern in sorted(unused):
            where = self.conditions.get(pattern)
            if where is not None and not any(where.holds(d, i) for d, i in envs):
                continue  # its condition held nowhere here (another device, level, CPU, version)
            if self.targets() and not filtered and not self.interrupted:
                terminalreporter.write_line(f"warning: known failure "
                                            f"{self.entries[pattern].label()} matched no test")
        for line in stale_lines(self.records, config, self.left):
            terminalreporter.write_line(line)
        errors = self.declaration_errors()
        if errors:
            for line in errors:
                terminalreporter.write_line(line, red=True)
        elif not filtered and not self.interrupted:  # a narrowed run may leave out its cases
            for line in stale_known_lines(self.records):
                terminalreporter.write_line(line)
        brief = config.getoption("--brief-summary")
        for line in (brief_lines if brief else matrix_lines)(self.records, config):
            terminalreporter.write_line(line)
        from suite.conformance.sample import left_line

        left = left_line(self.left, "CI's covering selection (--cover)"
                         if config.getoption("--cover") else "the main job's sample")
        if left:
            terminalreporter.write_line(left)
        if self.json_path:
            self.save()
            if not self.save_error:
                terminalreporter.write_line(
                    f"conformance results: {os.path.abspath(self.json_path)}")

    @pytest.hookimpl(trylast=True)
    def pytest_keyboard_interrupt(self, excinfo) -> None:
        self.interrupted = self.interrupted or "interrupted"
        # One line (pytest_unconfigure's) instead of pytest's KeyboardInterrupt banner.
        # (pytest offers no option for it: its reporter's private method is silenced.)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and hasattr(reporter, "_report_keyboardinterrupt"):
            reporter._report_keyboardinterrupt = lambda: None

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if is_worker(config):
            return
        if self.save_error:
            print(f"mha-suite: error: {self.save_error}; the records saved before are kept",
                  file=sys.stderr)
        elif self.interrupted:
            where = f" in {os.path.abspath(self.json_path)}" if self.json_path else ""
            print(f"mha-suite: {self.interrupted}: the {len(self.records)} cases finished are "
                  f"saved{where}; the cases in progress were not", file=sys.stderr)
