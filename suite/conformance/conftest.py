"""Conformance session: parametrise over (implementation, device, dtype), record outcomes.

Options (``--impl``, ``--plugin``, ``--device``, ``--dtype``, ``--conformance-json``)
come from ``suite.pytest_plugin``. At the end the session prints the
implementation x family matrix and, if asked, writes the JSON the report reads.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from typing import List

import pytest

from suite import pytest_plugin
from suite.check import Outcome
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


def pytest_configure(config: pytest.Config) -> None:
    config.stash[RECORDS] = []
    extra = config.getoption("--known-failures") or []
    config.stash[KNOWN] = read_known_failures([KNOWN_FILE, *extra])
    config.stash[USED] = set()


def known_failure(config: pytest.Config, name: str):
    for pattern, reason in config.stash[KNOWN].items():
        if fnmatch.fnmatchcase(name, pattern):
            config.stash[USED].add(pattern)
            return reason
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        targets = _targets(metafunc.config)
        metafunc.parametrize("target", targets,
                             ids=[f"{e.name}-{d}-{t}" for e, d, t in targets])


@pytest.fixture
def record(request: pytest.FixtureRequest):
    """Call with an Outcome: stores it for the JSON/matrix and turns it into pass/fail/skip."""
    def _record(outcome: Outcome) -> None:
        __tracebackhide__ = True
        outcome.test_id = request.node.nodeid
        known = known_failure(request.config, request.node.name)
        if known and outcome.outcome in ("fail", "error"):
            outcome.outcome, outcome.reason = "deviation", f"known failure: {known}; {outcome.reason}"
        elif known:
            warnings.warn(f"{request.node.name} is listed as a known failure but passed",
                          stacklevel=2)
        request.config.stash[RECORDS].append(outcome.record())
        replay = (f"\n  replay: pytest --pyargs suite.conformance -p no:cacheprovider "
                  f"--impl '{outcome.impl}' -k '{request.node.callspec.id}'")
        if outcome.outcome == "unsupported":
            pytest.skip(f"unsupported: {outcome.reason}")
        if outcome.outcome == "deviation":
            pytest.xfail(f"known deviation: {outcome.reason}")
        if outcome.outcome in ("fail", "error"):
            pytest.fail(f"{outcome.impl} on {outcome.device}/{outcome.dtype}, case "
                        f"{outcome.family}/{outcome.case} (seed {outcome.seed}): "
                        f"{outcome.outcome}: {outcome.reason}{replay}", pytrace=False)
    return _record


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    records = config.stash.get(RECORDS, [])
    if not records:
        return
    from suite.conformance.summary import matrix_lines, write_json

    unused = set(config.stash[KNOWN]) - config.stash[USED]
    for pattern in sorted(unused):
        if config.stash[TARGETS] and not config.option.keyword:
            terminalreporter.write_line(f"warning: known failure {pattern!r} matched no test")
    for line in matrix_lines(records, config):
        terminalreporter.write_line(line)
    path = config.getoption("--conformance-json")
    if path:
        write_json(path, records, config)
        terminalreporter.write_line(f"conformance results: {os.path.abspath(path)}")

