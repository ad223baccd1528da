"""Shared helpers for the harness tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The harness tests run `mha-suite check` at this CPU's native level only: each lower
# instruction-set level is a process of its own per run, tested once in tests/test_isa.py
# (which passes --isa), not repeated by every test that runs a check.
os.environ.setdefault("MHA_SUITE_ISA", "native")
# Without a GPU, Triton kernels run under its interpreter only when TRITON_INTERPRET=1 is set
# before triton is first imported (docs/own-module/gpu-kernel.md says so to users); a worker
# that imported it first through torch.compile's has_triton made the manual's Triton block
# unavailable, depending on which tests that worker ran before it.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Every sweep the tests start measures the matmul peak before and after its points: with the
# default 2048^3 product for at least 1 s each, 3 s of a 4 s test sweep. The tests check that
# a peak is recorded and used, not its accuracy (tests/test_timing.py measures matmul_peak).
os.environ.setdefault("MHA_SUITE_PEAK_PRODUCT", "512,0.05")


def _share_compile_caches() -> None:
    """One inductor and one JAX compile cache for every test and every process it starts,
    whatever cache directory a test gives the suite (the environment, read by the processes
    it starts, is set here once): a test that starts the suite on an empty cache (to see what
    a fresh machine describes) otherwise compiled torch.compile's and FlexAttention's probes
    anew, about 20 s a test."""
    from suite.plugins import cache

    cache.enable_compile_caches()


_share_compile_caches()
PLUGINS = ROOT / "tests" / "plugins"


def conformance_plugins() -> list:
    """pytest's plugin arguments for a conformance run a test starts with ``python -m pytest``:
    those ``mha-suite check`` loads (``suite.cli.RUN_PLUGINS``) and no other, as its runs do:
    every plugin an installed package registers (executorch's hydra-core and kgb, anyio)
    costs each such process about 3 s of imports."""
    from suite.cli import RUN_PLUGINS
    from suite.plugins.selection import only_plugins

    return only_plugins(*RUN_PLUGINS)


def run_cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``mha-suite`` in a subprocess, as a user would."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MHA_SUITE_PLUGINS", None) if env is None else None
    return subprocess.run([sys.executable, "-m", "suite.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=full_env)


def planted(module: str):
    """A plugin module of tests/plugins (planted bugs and declarations), imported by name."""
    import importlib

    sys.path.insert(0, str(PLUGINS))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(PLUGINS))


def run_catalog_case(impl, family: str, name: str, dtype: str = "float64"):
    """Case ``family/name`` of the catalogue run on ``impl`` on the CPU: its Outcome."""
    from suite.conformance import catalog
    from suite.conformance.judge import Outcome

    (case,) = [c for c in catalog.of_family(family) if c.name == name]
    return case.run(impl, Outcome(impl.name, "cpu", dtype, case.family, case.name, case.seed,
                                  "pass"))


@pytest.fixture
def cli():
    return run_cli
