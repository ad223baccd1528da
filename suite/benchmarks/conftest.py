"""Sweep session: the grid x registry parametrisation, machine facts, progress, and saving.

Results are pytest-benchmark JSON, rewritten (atomically) after every point, with
the points that could not be measured in ``mha_suite_not_measured``; ``--resume``
keeps the points already in the file and runs only the missing ones.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
from typing import Any, Dict, List, Optional

import pytest

from suite import pytest_plugin, shard, timing

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


def _prior(spec: dict) -> dict:
    """The results file's content when resuming (else an empty skeleton)."""
    if spec.get("resume") and os.path.exists(spec["out"]):
        with open(spec["out"]) as f:
            prior = json.load(f)
        prior["mha_suite_not_measured"] = []  # points not measured before are tried again
        return prior
    return {"benchmarks": [], "mha_suite_not_measured": []}


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--sweep-spec") is None and not _is_sweep_run(config):
        return
    spec = _spec(config)
    prior = _prior(spec)
    done = {timing.point_key(b.get("extra_info", {})) for b in prior["benchmarks"]}
    timing.fix_malloc_thresholds()  # before the points allocate: comparable CPU memory
    config.stash[STATE] = {"prior": prior, "done": done, "not_measured": [],
                           "machine_info": None, "commit_info": None, "count": 0,
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
        if cs and "sweep_point" in cs.params:
            entry, device, point = cs.params["sweep_point"]
            combos.add((entry.impl.framework, device, point["dtype"]))
    state["machine_info"] = _machine_info(config, combos)
    from suite.progress import progress_bar

    progress = progress_bar("sweep")
    progress.start()
    state["progress"] = progress
    state["task"] = progress.add_task("sweep", total=len(items))


def _machine_info(config: pytest.Config, combos) -> Dict[str, Any]:
    import pytest_benchmark.plugin as pbp

    info = pbp.pytest_benchmark_generate_machine_info()
    facts = timing.machine_facts()
    peaks = timing.matmul_peaks(combos)  # measured again after the points (sessionfinish)
    config.stash[STATE]["peak_combos"] = combos
    facts.update(threads=config.stash[STATE]["threads"], matmul_peak_flops=peaks,
                 matmul_peak_runs=timing.combine_peaks(peaks, {})[1],
                 preset=_spec(config).get("preset"), shard=_spec(config).get("shard"))
    info["mha_suite"] = facts
    return info


class PointTimeout(Exception):
    """A point ran past --timeout (raised inside the plugin by the alarm)."""


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> Optional[bool]:
    """pytest-timeout's alarm, raising PointTimeout so test_point records the point as a
    timeout and the sweep goes on (its own alarm needs pytest's terminal, off in sweeps).
    A plugin stuck in native code never sees the alarm: kill the sweep and --resume it."""
    if STATE not in item.config.stash or not settings.timeout or settings.method != "signal":
        return None

    def alarm(signum, frame):
        raise PointTimeout(f"no result within --timeout {settings.timeout:g} s")

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> Optional[bool]:
    if STATE not in item.config.stash:
        return None
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A point that failed past test_point's own handling (pytest-timeout's --timeout, a
    harness error) is recorded as not measured, with the reason, and the sweep goes on."""
    report = yield
    state = item.config.stash.get(STATE, None)
    if state is not None and report.when == "call" and report.failed and POINT in item.stash:
        text = call.excinfo.exconly() if call.excinfo else str(report.longrepr)
        status = "timeout" if "PointTimeout" in text else "error"
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
        save(item.config)
        pytest.exit(f"stopped after {stop} points (--stop-after)", returncode=2)


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    facts = (state["machine_info"] or {}).get("mha_suite")
    if facts and state["count"]:  # the peak again, after the points: both are kept
        before = {k: v["before"] for k, v in facts["matmul_peak_runs"].items()
                  if v["before"] is not None}
        after = timing.matmul_peaks(state.get("peak_combos", ()))
        facts["matmul_peak_flops"], facts["matmul_peak_runs"] = timing.combine_peaks(before, after)
    save(session.config)
    if state["progress"] is not None:
        state["progress"].stop()


def note(config: pytest.Config, line: str) -> None:
    """A line above the progress bar."""
    state = config.stash[STATE]
    if state["progress"] is not None:
        state["progress"].console.print(line, highlight=False)
    else:
        print(line)


def record_not_measured(config: pytest.Config, extra: Dict[str, Any], status: str,
                        reason: str) -> None:
    config.stash[STATE]["not_measured"].append({**extra, "status": status, "reason": reason})
    config.stash[STATE]["count"] += 1


def save(config: pytest.Config) -> Optional[str]:
    """Write prior + this run's points as pytest-benchmark JSON (atomic rename)."""
    state, spec = config.stash[STATE], _spec(config)
    bs = config._benchmarksession
    if state["commit_info"] is None:
        state["commit_info"] = config.hook.pytest_benchmark_generate_commit_info(config=config)
    doc = config.hook.pytest_benchmark_generate_json(
        config=config, benchmarks=bs.benchmarks, include_data=False,
        machine_info=state["machine_info"] or {}, commit_info=state["commit_info"])
    doc["benchmarks"] = state["prior"]["benchmarks"] + doc["benchmarks"]
    doc["mha_suite_not_measured"] = [
        *state["prior"].get("mha_suite_not_measured", []), *state["not_measured"]]
    doc["mha_suite_preset"] = spec.get("preset")
    doc["datetime"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    out = spec["out"]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, out)  # a killed sweep leaves the previous complete file, never half of one
    return out
