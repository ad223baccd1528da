"""Conformance cases: parametrise over (implementation, device, dtype), record outcomes.

Options (``--impl``, ``--plugin``, ``--device``, ``--dtype``, ``--conformance-json``)
come from ``suite.pytest_plugin``; the run's records, known failures, progress and saving
belong to ``suite.conformance.session.ConformanceSession``, which prints the
implementation x family matrix at the end and, if asked, writes the JSON the report reads.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import pytest

from suite.conformance import catalog
from suite.conformance.cases import Case
from suite.conformance.judge import FAILED, Outcome, error_text, implementation_isa, merge_repeats
from suite.conformance.session import (
    KNOWN_KEY,
    NEEDED_KEY,
    PASSED_KEY,
    RECORD_KEY,
    ConformanceSession,
    family,
)
from suite.plugins.interface import Implementation, declared
from suite.timeouts import timed_out

RECORDED = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    ConformanceSession.ensure(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test that failed without recording an outcome (a plugin that hung past --timeout,
    or a harness error) is still recorded, as an error with the reason."""
    report = yield
    if report.when == "call" and report.failed:
        cs = getattr(item, "callspec", None)
        if not item.stash.get(RECORDED, False) and cs is not None and "target" in cs.params:
            entry, device, dtype = cs.params["target"]
            case = cs.params.get("case") or _catalog_case(item)
            fam = family(item)
            name = case.name if case is not None else item.originalname.removeprefix("test_")
            reason = (call.excinfo.exconly() if call.excinfo else str(report.longrepr))
            out = Outcome(entry.name, device, dtype, fam, name,
                          getattr(case, "seed", 0), "error", reason=reason.strip()[:2000],
                          test_id=record_id(item))
            item.user_properties.append((RECORD_KEY, out.record()))  # the teardown report
            item.stash[RECORDED] = True  # carries it (the last report of a test)
    return report


def _catalog_case(item: pytest.Item) -> Optional[Case]:
    """The case a test without a ``case`` parameter runs (``test_repeatable`` runs
    properties/repeatable), or None (the Hypothesis family draws its problems)."""
    try:
        return catalog.get(*catalog.from_test(item.originalname, None))
    except KeyError:
        return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        targets = ConformanceSession.of(metafunc.config).targets()
        per_target = getattr(metafunc.module, "cases_of", None)
        if per_target is not None and "case" in metafunc.fixturenames:
            # Cases each implementation declares (its contracts): (target, case) pairs.
            pairs = [(t, c) for t in targets for c in per_target(t[0].impl)]
            metafunc.parametrize(("target", "case"), pairs, ids=[
                f"{e.name}-{d}-{t}-{c.family}/{c.name}" for (e, d, t), c in pairs])
            return
        metafunc.parametrize("target", targets,
                             ids=[f"{e.name}-{d}-{t}" for e, d, t in targets])


@pytest.fixture
def listed_known_failure(request: pytest.FixtureRequest):
    """The known-failure reason listed for this test, or None."""
    known = ConformanceSession.of(request.config).known_failure(
        request.node.name, impl=_impl_of(request))
    return known[1] if known else None


def _impl_of(request: pytest.FixtureRequest) -> object:
    """The plugin instance of a conformance test (None for a test without one)."""
    target = getattr(request.node, "callspec", None) and \
        request.node.callspec.params.get("target")
    return target[0].impl if target else None


@pytest.fixture
def listed_to_show(request: pytest.FixtureRequest) -> bool:
    """True when a known-failure entry that is not {intermittent} lists this test: a run
    must show it (an intermittent entry is not called stale where it holds nowhere)."""
    session = ConformanceSession.of(request.config)
    known = session.known_failure(request.node.name, impl=_impl_of(request))
    return known is not None and not getattr(session.conditions.get(known[0]),
                                             "intermittent", False)


@pytest.fixture
def conform(request: pytest.FixtureRequest, target):
    """Call ``conform.case(case)`` with a ``suite.conformance.cases.Case``, or ``conform(family, name,
    seed, judge)``: ``judge(impl, outcome)`` runs the case on an implementation and
    classifies ``outcome``. With ``--repeat N`` the case runs N times,
    each on a fresh instance (recompiling where the plugin compiles), and an outcome that
    changes is reported as flaky, with each run's outcome."""
    entry, device, dtype = target

    def _conform(family: str, name: str, seed: int,
                 judge: Callable[[Implementation, Outcome], Outcome]) -> None:
        __tracebackhide__ = True
        runs, impl = [], entry.impl
        families = declared(impl, "families")
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

    _conform.case = lambda case: _conform(case.family, case.name, case.seed, case.run)
    return _conform


def replay_command(config: pytest.Config, impl: str, test_id: str) -> str:
    """The command that runs one test again, with every --plugin this run used."""
    plugins = "".join(f" --plugin '{p}'" for p in config.getoption("--plugin") or [])
    repeat = config.getoption("--repeat")
    return (f"pytest --pyargs suite.conformance.tests -p no:cacheprovider{plugins} "
            f"--impl '{impl}' -k '{test_id}'" + (f" --repeat {repeat}" if repeat > 1 else ""))


def record_id(item: pytest.Item) -> str:
    """The test's id as a serial run names it: pytest-xdist's loadgroup appends
    ``@<group>`` to the node id of a grouped test, which would make one case two records."""
    group = item.get_closest_marker("xdist_group")
    name = group and (group.kwargs.get("name") or (group.args[0] if group.args else None))
    return item.nodeid.removesuffix(f"@{name}") if name else item.nodeid


def _record(request: pytest.FixtureRequest, outcome: Outcome) -> None:
    """Store an outcome for the JSON/matrix and turn it into pass/fail/skip/xfail."""
    __tracebackhide__ = True
    outcome.test_id = record_id(request.node)
    request.node.stash[RECORDED] = True
    if outcome.isa is None:  # a case that ended before the judge read the level
        outcome.isa = implementation_isa(request.node.callspec.params["target"][0].impl,
                                         outcome.device)
    session = ConformanceSession.of(request.config)
    known = session.known_failure(request.node.name, outcome.device, outcome.isa,
                                  impl=_impl_of(request),
                                  ended=(outcome.outcome, outcome.reason or ""))
    pattern = None
    if known:
        pattern, known = known
        request.node.user_properties.append((KNOWN_KEY, pattern))
        entry = session.entries.get(pattern)
        if outcome.outcome in FAILED and entry is not None \
                and not entry.absorbs(outcome.outcome, outcome.reason):
            # an error is not the wrong answer the entry describes: it stays an error
            outcome.reason += (f" (known failure {entry.label()} does not cover it: it lists "
                               "a wrong answer" + (f", an error matching {entry.record.raises!r}"
                                                   if entry.record and entry.record.raises
                                                   else "") + ", and the case raised)")
            known = None
    late = timed_out(request.node)
    if late:  # whatever the plugin made of the alarm, the case ran out of time: an error,
        # which no known-failure entry absorbs (an entry lists a wrong answer, not a hang)
        outcome.outcome, outcome.reason, known = "error", f"Timeout: {late}", None
    if known and outcome.outcome in FAILED:
        outcome.outcome, outcome.reason = "known_failure", f"{known}; {outcome.reason}"
        request.node.user_properties.append((NEEDED_KEY, pattern))
    elif known and outcome.outcome != "unsupported":  # a glob may cover a case not run
        request.node.user_properties.append((PASSED_KEY, (pattern, request.node.name)))
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
