"""Sweep points: the grid x registry parametrisation, delegated to the sweep session.

``mha-suite sweep`` registers a ``suite.sweep.session.SweepSession`` with its spec; a
plain ``pytest --pyargs suite.sweep.benchmarks`` gets one for the ci preset, saved into
``.benchmarks/sweep-ci.json``.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from suite.sweep import shard
from suite.sweep.point import Point
from suite.sweep.session import PLUGIN_NAME, SweepSession


def _default_spec(config: pytest.Config) -> dict:
    """A --sweep-spec file's spec, else the ci preset into .benchmarks/."""
    path = config.getoption("--sweep-spec")
    if path:
        with open(path) as f:
            return json.load(f)
    import argparse

    from suite.sweep import presets

    parser = argparse.ArgumentParser()
    presets.add_arguments(parser)
    spec = presets.grid(parser.parse_args(["--preset", "ci"]))
    spec.update(out=".benchmarks/sweep-ci.json", resume=False, threads=None,
                memory_budget_gb=None, stop_after=None)
    return spec


def pytest_configure(config: pytest.Config) -> None:
    if SweepSession.of(config) is None:  # pytest run directly, not by `mha-suite sweep`
        session = SweepSession(_default_spec(config))
        config.pluginmanager.register(session, PLUGIN_NAME)
        session.pytest_configure(config)  # registered mid-configure: not called


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sweep_point" not in metafunc.fixturenames:
        return
    session = SweepSession.of(metafunc.config)
    spec, selection = session.spec, session.selection
    entries = selection.entries(available_only=True)
    units = [(e.name, d) for e in entries for d in e.impl.devices() if selection.device(d)
             and any(d.startswith(p["device"]) for p in spec["points"])]
    mine = shard.select(units, *spec["shard"]) if spec.get("shard") else set(units)
    params, ids = [], []
    for entry in entries:
        for device in entry.impl.devices():
            if (entry.name, device) not in mine or not selection.device(device):
                continue
            for fields in spec["points"]:
                if not device.startswith(fields["device"]):
                    continue
                point = dataclasses.replace(Point(**fields), device=device)
                params.append((entry, device, point))
                ids.append(f"{entry.name}-{device}-{point.id()}")
    metafunc.parametrize("sweep_point", params, ids=ids)


@pytest.fixture
def sweep_session(request: pytest.FixtureRequest) -> SweepSession:
    return SweepSession.of(request.config)
