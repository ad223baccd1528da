"""pytest plugin (entry point ``pytest11``): the options that choose implementations.

Options flow one way: command line -> session (``selected_entries``) -> fixtures.
Loaded in every pytest session of an environment with mha-suite installed, so it
imports nothing heavy.
"""

from __future__ import annotations

from typing import List

import pytest

from suite import registry as _registry


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mha-suite", "MHA implementations under test")
    group.addoption("--plugin", action="append", default=[], metavar="SPEC",
                    help="register an implementation: module:Class or path/to/file.py[:Class] "
                         f"(repeatable; also ${_registry.PLUGINS_ENV}, comma separated)")
    group.addoption("--impl", action="append", default=[], metavar="GLOB",
                    help="run only implementations matching this name or glob (repeatable)")
    group.addoption("--device", action="append", default=[], metavar="DEVICE",
                    help="run only on these devices, e.g. cpu, cuda (prefix match; repeatable)")
    group.addoption("--dtype", action="append", default=[], metavar="DTYPE",
                    help="run only these dtypes (repeatable)")
    group.addoption("--hypothesis-examples", type=int, default=25, metavar="N",
                    help="examples per implementation for the property-based shapes family "
                         "(default 25, derandomised; raise for longer searches)")
    group.addoption("--known-failures", action="append", default=[], metavar="FILE",
                    help="more known-failure lists (test id glob # reason, one a line)")
    group.addoption("--sweep-spec", default=None, metavar="PATH",
                    help="the sweep grid and output (JSON written by mha-suite sweep)")
    group.addoption("--progress", action="store_true", default=False,
                    help="a progress bar with an ETA instead of pytest's per-test letters")
    group.addoption("--conformance-json", default=None, metavar="PATH",
                    help="write conformance outcomes (err, baseline err, ratio) to PATH")


def session_registry(config: pytest.Config) -> _registry.Registry:
    """The registry for this session: the process's, for --plugin and the environment
    (the CLI that started an in-process session has built it already)."""
    return _registry.shared(config.getoption("--plugin") or [])


def selected_entries(config: pytest.Config, available_only: bool = False
                     ) -> List[_registry.Entry]:
    reg = session_registry(config)
    return reg.select(config.getoption("--impl") or None, available_only=available_only)


def device_selected(config: pytest.Config, device: str) -> bool:
    wanted = config.getoption("--device") or []
    return not wanted or any(device.startswith(w) for w in wanted)


def dtype_selected(config: pytest.Config, dtype: str) -> bool:
    wanted = config.getoption("--dtype") or []
    return not wanted or dtype in wanted


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mha_impl(name): the implementation a test runs")
