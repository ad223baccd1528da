"""Sweep session: the grid x registry parametrisation, machine facts, progress, and saving.

Results are pytest-benchmark JSON, merged into the results file (``suite.records``)
after every finished point, with the points that could not be measured in
``mha_suite_not_measured``; a point is saved only once it finished, so an interrupted
point is never recorded. ``--resume`` runs only the points not measured in the file.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List

import pytest

from suite import plugin, pytest_plugin, records, shard, timing
from suite.pytest_plugin import Timeout

SPEC = pytest.StashKey[dict]()
STATE = pytest.StashKey[dict]()
POINT = pytest.StashKey[dict]()  # the point's extra_info, set by test_point


def _spec(config: pytest.Config) -> dict:
    if SPEC not in config.stash:
        path = config.getoption("--sweep-spec")
        if path:
            with open(path) as f:
                config.stash[SPEC] = json.load(f)
        else:  # plain `pytest --pyargs suite.benchmarks`: the ci preset into .benchmarks/
            import argparse

            from suite import sweep

            parser = argparse.ArgumentParser()
            sweep.add_arguments(parser)
            spec = sweep.grid(parser.parse_args(["--preset", "ci"]))
            spec.update(out=".benchmarks/sweep-ci.json", resume=False, threads=None,
                        memory_budget_gb=None, stop_after=None)
            config.stash[SPEC] = spec
    return config.stash[SPEC]


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--sweep-spec") is None and not _is_sweep_run(config):
        return
    spec = _spec(config)
    timing.fix_malloc_thresholds()  # before the points allocate: comparable CPU memory
    done = records.measured_keys(spec["out"]) if spec.get("resume") else set()
    config.stash[STATE] = {"done": done, "points": [], "not_measured": [], "run_info": None,
                           "count": 0, "saved": 0, "interrupted": False,
                           "threads": timing.pin_threads(spec.get("threads")), "progress": None}


def _is_sweep_run(config: pytest.Config) -> bool:
    return any("benchmarks" in str(a) for a in config.args)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sweep_point" not in metafunc.fixturenames:
        return
    config = metafunc.config
    spec = _spec(config)
    params, ids = [], []
    units = [(e.name, d) for e in pytest_plugin.selected_entries(config, available_only=True)
             for d in e.impl.devices() if pytest_plugin.device_selected(config, d)
             and any(d.startswith(p["device"]) for p in spec["points"])]
    mine = shard.select(units, *spec["shard"]) if spec.get("shard") else set(units)
    for entry in pytest_plugin.selected_entries(config, available_only=True):
        for device in entry.impl.devices():
            if (entry.name, device) not in mine:
                continue
            for point in spec["points"]:
                if not device.startswith(point["device"]):
                    continue
                if not pytest_plugin.device_selected(config, device):
                    continue
                params.append((entry, device, point))
                ids.append(f"{entry.name}-{device}-{point['dtype']}-L{point['length']}"
                           f"-H{point['H']}-B{point['batch']}-D{point['head_dim']}-{point['mask']}"
                           + ("-grad" if point["grad"] else ""))
    metafunc.parametrize("sweep_point", params, ids=ids)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    # Measure the machine before any point (a matmul right before a timed point slows it).
    combos = set()
    for item in items:
        cs = getattr(item, "callspec", None)
        param = cs.params.get("sweep_point") if cs else None
        if isinstance(param, tuple):  # not pytest's placeholder of an empty grid
            entry, device, point = param
            combos.add((plugin.array_library(entry.impl), device, point["dtype"]))
    state["combos"] = combos
    state["run_info"] = records.run_info(config)
    from suite.progress import progress_bar

    progress = progress_bar("sweep")
    progress.start()
    state["progress"] = progress
    state["task"] = progress.add_task("sweep", total=len(items))


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """The sweep's own facts: pinned threads, preset, shard, and the matmul peak of every
    framework:device:dtype it times (measured before the points, and again after them in
    pytest_sessionfinish; the share of peak uses the higher)."""
    state = config.stash.get(STATE, None)
    if state is None:
        return
    combos = sorted(state.get("combos", ()))
    peaks = timing.matmul_peaks(combos)
    state["peak_combos"] = combos
    machine_info.setdefault("mha_suite", {}).update(
        threads=state["threads"], matmul_peak_flops=peaks,
        matmul_peak_runs=timing.combine_peaks(peaks, {})[1],
        preset=_spec(config).get("preset"), shard=_spec(config).get("shard"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A point that failed past test_point's own handling (pytest-timeout's --timeout, a
    harness error) is recorded as not measured, with the reason, and the sweep goes on."""
    report = yield
    state = item.config.stash.get(STATE, None)
    if state is not None and report.when == "call" and report.failed and POINT in item.stash:
        text = call.excinfo.exconly() if call.excinfo else str(report.longrepr)
        status = "timeout" if call.excinfo and call.excinfo.errisinstance(Timeout) else "error"
        record_not_measured(item.config, item.stash[POINT], status, text.strip()[:500])
        note(item.config, f"{status}: {item.nodeid.rsplit('[', 1)[-1].rstrip(']')}: "
                          f"{text.strip().splitlines()[0][:200]}")
    return report


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    state = item.config.stash.get(STATE, None)
    if state is None:
        return
    save(item.config)
    if state["progress"] is not None:
        state["progress"].advance(state["task"])
    stop = _spec(item.config).get("stop_after")
    if stop is not None and state["count"] >= stop:
        raise KeyboardInterrupt(f"--stop-after {stop}")  # the tests' stand-in for Ctrl-C


def pytest_keyboard_interrupt(excinfo) -> None:
    _INTERRUPTED.append(True)


_INTERRUPTED: List[bool] = []  # pytest's interrupt hook gets no config; one session a process


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    facts = ((state["run_info"] or {}).get("machine_info") or {}).get("mha_suite")
    if facts and state["count"]:  # the peak again, after the points: both are kept
        before = {k: v["before"] for k, v in facts["matmul_peak_runs"].items()
                  if v["before"] is not None}
        after = timing.matmul_peaks(state.get("peak_combos", ()))
        facts["matmul_peak_flops"], facts["matmul_peak_runs"] = timing.combine_peaks(before, after)
    save(session.config)
    if state["progress"] is not None:
        state["progress"].stop()
    if _INTERRUPTED:
        _INTERRUPTED.clear()
        n = len(state["points"]) + len(state["not_measured"])
        print(f"mha-suite: interrupted: the {n} points finished in this run are saved in "
              f"{_spec(session.config)['out']}; the point in progress was not "
              "(run again with --resume to finish)", file=sys.stderr)


def note(config: pytest.Config, line: str) -> None:
    """A line above the progress bar."""
    state = config.stash[STATE]
    if state["progress"] is not None:
        state["progress"].console.print(line, highlight=False)
    else:
        print(line)


def record_point(config: pytest.Config, benchmark_dict: Dict[str, Any]) -> None:
    """A finished, checked point (pytest-benchmark's dict of it), saved at its teardown."""
    config.stash[STATE]["points"].append(benchmark_dict)
    config.stash[STATE]["count"] += 1


def record_not_measured(config: pytest.Config, extra: Dict[str, Any], status: str,
                        reason: str) -> None:
    config.stash[STATE]["not_measured"].append({**extra, "status": status, "reason": reason})
    config.stash[STATE]["count"] += 1


def save(config: pytest.Config) -> None:
    """Merge this run's finished points into the results file (when there are new ones)."""
    state, spec = config.stash[STATE], _spec(config)
    if state["count"] == state["saved"] or state["run_info"] is None:
        return
    records.merge_sweep(spec["out"], state["run_info"], state["points"], state["not_measured"],
                        spec.get("preset"))
    state["saved"] = state["count"]
