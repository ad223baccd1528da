"""Conformance session: parametrise over (implementation, device, dtype), record outcomes.

Options (``--impl``, ``--plugin``, ``--device``, ``--dtype``, ``--conformance-json``)
come from ``suite.pytest_plugin``. At the end the session prints the
implementation x family matrix and, if asked, writes the JSON the report reads.
"""

from __future__ import annotations

import fnmatch
import os
import time
import warnings
from typing import Callable, List, Optional

import pytest

from suite import pytest_plugin
from suite.check import FAILED, Outcome, error_text, merge_repeats
from suite.plugin import Implementation
from suite.registry import PluginError, UnknownImplementation

RECORDS = pytest.StashKey[List[dict]]()
USED = pytest.StashKey[set]()
TARGETS = pytest.StashKey[list]()


def _targets(config: pytest.Config) -> list:
    """(entry, device, dtype) triples, computed once per session."""
    if TARGETS not in config.stash:
        try:
            entries = pytest_plugin.selected_entries(config, available_only=True)
        except (UnknownImplementation, PluginError) as exc:
            raise pytest.UsageError(str(exc)) from None
        out = []
        for e in entries:
            for device in e.impl.devices():
                if not pytest_plugin.device_selected(config, device):
                    continue
                for dtype in e.impl.dtypes(device):
                    if pytest_plugin.dtype_selected(config, dtype):
                        out.append((e, device, dtype))
        config.stash[TARGETS] = out
    return config.stash[TARGETS]


KNOWN = pytest.StashKey[dict]()
KNOWN_FILE = os.path.join(os.path.dirname(__file__), "known_failures.txt")


def read_known_failures(paths) -> dict:
    """{test id glob: reason} from plain text files: one id a line, '#' then the reason."""
    out = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                pattern, _, reason = line.partition("#")
                if pattern.strip():
                    out[pattern.strip()] = reason.strip() or "listed in " + path
    return out


RECORDED = pytest.StashKey[bool]()
PROGRESS = pytest.StashKey[dict]()
# Family of the tests whose outcome names no family through a ``case`` parameter.
MODULE_FAMILY = {"test_gradients": "gradients", "test_properties": "properties",
                 "test_hypothesis": "hypothesis"}
SAVE_EVERY_S = 5.0  # the results JSON is rewritten at most this often during a run


# Records and matched known-failure patterns travel in each test report's user_properties,
# so the controller of a pytest-xdist run sees every worker's outcomes.
RECORD_KEY = "mha_suite_record"
KNOWN_KEY = "mha_suite_known_failure"
_CONFIG: dict = {}


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG["config"] = config
    config.stash[RECORDS] = []
    extra = config.getoption("--known-failures") or []
    config.stash[KNOWN] = read_known_failures([KNOWN_FILE, *extra])
    config.stash[USED] = set()
    config.stash[PROGRESS] = {"bar": None, "saved": time.monotonic(), "failed": 0}


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    """An implementation's cases of one family form one xdist group (``--dist loadgroup``
    keeps a group on one worker, which compiles a graph its cases share once); groups of an
    implementation per family, not one, because a compiled plugin's cases alone outlast all
    the others (torch.flex: 170 s of 280 s, measured) and would leave the other cores idle.
    The property-based cases run first: each runs many examples (on a compiled plugin, one
    compile each: torch.flex's took 137 s of a 240 s run), and started last, one of them
    left a worker running alone at the end (longest first is the classic fix).
    With --progress, a bar with an ETA."""
    items.sort(key=lambda it: _family(it) != "hypothesis")
    for item in items:
        family = _family(item)
        if family is not None:
            group = f"{item.callspec.params['target'][0].name}/{family}"
            item.add_marker(pytest.mark.xdist_group(group))
    if not config.getoption("--progress") or not items or _is_worker(config):
        return
    from rich.progress import TextColumn

    from suite.progress import progress_bar

    bar = progress_bar("conformance", TextColumn("{task.fields[failed]} failed", style="red"))
    bar.start()
    config.stash[PROGRESS].update(bar=bar, task=bar.add_task("", total=len(items), failed=0))


@pytest.hookimpl(wrapper=True)
def pytest_report_teststatus(report, config: pytest.Config):
    """With --progress, pytest's per-test letters are left out (the bar counts instead)."""
    result = yield
    if config.stash[PROGRESS]["bar"] is not None and result:
        category, _letter, word = result
        return category, "", word
    return result


def _is_worker(config: pytest.Config) -> bool:
    """True in a pytest-xdist worker: records travel to the controller in the reports."""
    return hasattr(config, "workerinput")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect records from the reports (this process's or, under xdist, the workers'),
    advance the progress bar and save the results JSON now and then."""
    config = _CONFIG.get("config")
    if config is None or _is_worker(config):
        return
    if report.when == "call" and report.failed:
        config.stash[PROGRESS]["failed"] += 1
    if report.when != "teardown":  # the last report of a test carries all its properties
        return
    for key, value in report.user_properties:
        if key == RECORD_KEY:
            config.stash[RECORDS].append(value)
        elif key == KNOWN_KEY:
            config.stash[USED].add(value)
    state = config.stash[PROGRESS]
    if state["bar"] is not None:
        state["bar"].update(state["task"], advance=1, failed=state["failed"])
    if time.monotonic() - state["saved"] > SAVE_EVERY_S:
        _save(config)  # a killed run keeps what it measured


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test that failed without recording an outcome (a plugin that hung past --timeout,
    or a harness error) is still recorded, as an error with the reason."""
    report = yield
    if report.when == "call" and report.failed:
        cs = getattr(item, "callspec", None)
        if not item.stash.get(RECORDED, False) and cs is not None and "target" in cs.params:
            entry, device, dtype = cs.params["target"]
            case = cs.params.get("case")
            family = _family(item)
            name = case.name if case is not None else item.originalname.removeprefix("test_")
            reason = (call.excinfo.exconly() if call.excinfo else str(report.longrepr))
            out = Outcome(entry.name, device, dtype, family, name,
                          getattr(case, "seed", 0), "error", reason=reason.strip()[:2000],
                          test_id=item.nodeid)
            item.user_properties.append((RECORD_KEY, out.record()))  # the teardown report
            item.stash[RECORDED] = True  # carries it (the last report of a test)
    return report


def _family(item: pytest.Item) -> Optional[str]:
    """The case family of a conformance test (its case's, else its module's); None for a
    test that runs no implementation."""
    cs = getattr(item, "callspec", None)
    if cs is None or "target" not in cs.params:
        return None
    case = cs.params.get("case")
    return case.family if case is not None else MODULE_FAMILY.get(
        item.module.__name__.rsplit(".", 1)[-1], "other")


def known_failure(config: pytest.Config, name: str):
    """(pattern, reason) of the first known-failure entry matching test ``name``, or None."""
    for pattern, reason in config.stash[KNOWN].items():
        if fnmatch.fnmatchcase(name, pattern):
            return pattern, reason
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        targets = _targets(metafunc.config)
        metafunc.parametrize("target", targets,
                             ids=[f"{e.name}-{d}-{t}" for e, d, t in targets])


@pytest.fixture
def listed_known_failure(request: pytest.FixtureRequest):
    """The known-failure reason listed for this test, or None."""
    known = known_failure(request.config, request.node.name)
    return known[1] if known else None


@pytest.fixture
def conform(request: pytest.FixtureRequest, target):
    """Call with (family, name, seed, judge): ``judge(impl, outcome)`` runs the case on an
    implementation and classifies ``outcome``. With ``--repeat N`` the case runs N times,
    each on a fresh instance (recompiling where the plugin compiles), and an outcome that
    changes is reported as flaky, with each run's outcome."""
    entry, device, dtype = target

    def _conform(family: str, name: str, seed: int,
                 judge: Callable[[Implementation, Outcome], Outcome]) -> None:
        __tracebackhide__ = True
        runs, impl = [], entry.impl
        families = getattr(impl, "families", None)
        if families is not None and family not in families:  # a variant's declared subset
            out = Outcome(entry.name, device, dtype, family, name, seed, "pass")
            _record(request, out.classify("unsupported", f"{entry.name} runs the families "
                                                         f"{', '.join(sorted(families))}"))
            return
        for i in range(max(1, request.config.getoption("--repeat"))):
            out = Outcome(entry.name, device, dtype, family, name, seed, "pass")
            try:
                impl = impl.fresh() if i else impl
            except Exception as exc:  # a plugin that cannot be rebuilt is reported
                runs.append(out.classify("error", f"fresh instance: {error_text(exc)}"))
                continue
            runs.append(judge(impl, out))
        _record(request, merge_repeats(runs))
    return _conform


def replay_command(config: pytest.Config, impl: str, test_id: str) -> str:
    """The command that runs one test again, with every --plugin this run used."""
    plugins = "".join(f" --plugin '{p}'" for p in config.getoption("--plugin") or [])
    repeat = config.getoption("--repeat")
    return (f"pytest --pyargs suite.conformance -p no:cacheprovider{plugins} "
            f"--impl '{impl}' -k '{test_id}'" + (f" --repeat {repeat}" if repeat > 1 else ""))


def _record(request: pytest.FixtureRequest, outcome: Outcome) -> None:
    """Store an outcome for the JSON/matrix and turn it into pass/fail/skip/xfail."""
    __tracebackhide__ = True
    outcome.test_id = request.node.nodeid
    request.node.stash[RECORDED] = True
    known = known_failure(request.config, request.node.name)
    if known:
        request.node.user_properties.append((KNOWN_KEY, known[0]))
        known = known[1]
    late = pytest_plugin.timed_out(request.node)
    if late:  # whatever the plugin made of the alarm, the case ran out of time: an error,
        # which no known-failure entry absorbs (an entry lists a wrong answer, not a hang)
        outcome.outcome, outcome.reason, known = "error", f"Timeout: {late}", None
    if known and outcome.outcome in FAILED:
        outcome.outcome, outcome.reason = "known_failure", f"{known}; {outcome.reason}"
    elif known and outcome.outcome != "unsupported":  # a glob may cover a case not run
        warnings.warn(f"{request.node.name} is listed as a known failure but passed",
                      stacklevel=2)
    request.node.user_properties.append((RECORD_KEY, outcome.record()))
    replay = "\n  replay: " + replay_command(request.config, outcome.impl,
                                              request.node.callspec.id)
    if outcome.outcome == "unsupported":
        pytest.skip(f"unsupported: {outcome.reason}")
    if outcome.outcome == "deviation":
        pytest.xfail(f"known deviation: {outcome.reason}")
    if outcome.outcome == "known_failure":
        pytest.xfail(f"known failure: {outcome.reason}")
    if outcome.outcome in FAILED:
        pytest.fail(f"{outcome.impl} on {outcome.device}/{outcome.dtype}, case "
                    f"{outcome.family}/{outcome.case} (seed {outcome.seed}): "
                    f"{outcome.outcome}: {outcome.reason}{replay}", pytrace=False)


def _save(config: pytest.Config) -> None:
    path = config.getoption("--conformance-json")
    if path and config.stash.get(RECORDS, []):
        from suite.conformance.summary import write_json

        write_json(path, config.stash[RECORDS], config)
    config.stash[PROGRESS]["saved"] = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if _is_worker(config):
        return
    bar = config.stash[PROGRESS]["bar"]
    if bar is not None:
        bar.stop()
    records = config.stash.get(RECORDS, [])
    if not records:
        return
    from suite.conformance.summary import matrix_lines, stale_lines, write_json

    unused = set(config.stash[KNOWN]) - config.stash[USED]
    for pattern in sorted(unused):
        filtered = config.option.keyword or any(
            config.getoption(o) for o in ("--impl", "--device", "--dtype"))
        if _targets(config) and not filtered:
            terminalreporter.write_line(f"warning: known failure {pattern!r} matched no test")
    for line in stale_lines(records, config):
        terminalreporter.write_line(line)
    for line in matrix_lines(records, config):
        terminalreporter.write_line(line)
    path = config.getoption("--conformance-json")
    if path:
        write_json(path, records, config)
        terminalreporter.write_line(f"conformance results: {os.path.abspath(path)}")

