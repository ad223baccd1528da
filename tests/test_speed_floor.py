"""The harness's own per-case cost (docs/measured/profile.md): what the speed work changed
keeps the verdicts' inputs. An implementation's cases of one family form one pytest-xdist
unit of work, read from their node ids; the oracle's passes are shared by content, never
by a stale digest; pytest's log capture is left out of a conformance run."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from suite.conformance.session import group_of
from suite.pytest_plugin import crash_safe_loadgroup
from suite.spec import oracle

ROOT = Path(__file__).resolve().parents[1]

COLLECTOR = '''
import json, os
def pytest_collection_finish(session):
    with open(os.environ["MHA_SUITE_TEST_OUT"], "w") as f:
        json.dump({"logging": session.config.pluginmanager.has_plugin("logging-plugin"),
                   "items": [[it.nodeid, [m.args[0] for m in it.iter_markers("xdist_group")]]
                             for it in session.items]}, f)
'''


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """Every conformance test of two implementations (one with brackets in its name),
    collected as a run collects them: node ids, xdist_group markers, plugins."""
    tmp = tmp_path_factory.mktemp("collect")
    (tmp / "collector_probe.py").write_text(COLLECTOR)
    out = tmp / "items.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "collector_probe", "--pyargs",
         "suite.conformance.tests", "-p", "no:cacheprovider", "--collect-only", "-q",
         "--impl", "numpy", "--impl", "torch.sdpa[flash]", "-W",
         "ignore::pytest.PytestAssertRewriteWarning"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "MHA_SUITE_TEST_OUT": str(out),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp),
                                                         os.environ.get("PYTHONPATH")]))})
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_group_read_from_a_node_id_is_the_sessions_marker(collected):
    items = collected["items"]
    assert len(items) > 100 and any("[torch.sdpa[flash]-" in n for n, _ in items)
    for nodeid, marks in items:
        assert [group_of(nodeid)] == marks, nodeid


def test_an_implementations_family_is_one_unit_of_work(collected):
    scheduler = crash_safe_loadgroup()
    split, sched = scheduler._split_scope, object.__new__(scheduler)
    units: dict = {}
    for nodeid, marks in collected["items"]:
        units.setdefault(split(sched, nodeid), set()).add(marks[0])
    assert all(len(groups) == 1 for groups in units.values())  # one group, one unit
    assert len(units) == len({m[0] for _, m in collected["items"]})
    # a test of another suite keeps pytest-xdist's own scope; a suffixed group is read back
    assert split(sched, "tests/test_x.py::test_y[1]") == "tests/test_x.py::test_y[1]"
    assert split(sched, "t.py::test_case[numpy-cpu-float32-masking/causal]@numpy/masking") \
        == "numpy/masking"


def test_a_conformance_run_leaves_out_pytests_log_capture(collected):
    assert collected["logging"] is False




def test_a_pinned_digest_is_the_content_digest_and_ends_with_its_block():
    from suite.conformance.cases import CASES

    p = CASES[0].problem()
    want = oracle.digest(p)
    with oracle.pinned(p):
        assert oracle.digest(p) == want
        assert oracle.oracle(p)[0] is oracle.oracle(p)[0]  # one pass, shared
    changed = dataclasses.replace(p, query=p.query + 1.0)
    assert oracle.digest(changed) != want
    copy = dataclasses.replace(p, query=p.query.copy())
    assert oracle.digest(copy) == want  # by content
    copy.query[...] += 1.0  # outside a block, a digest is read from the arrays again
    assert oracle.digest(copy) == oracle.digest(changed)


def test_the_pass_cache_is_bounded_by_size(monkeypatch):
    from suite.conformance.cases import CASES

    monkeypatch.setattr(oracle, "_PASSES", type(oracle._PASSES)())
    monkeypatch.setattr(oracle, "_PASSES_SIZE", 0)
    monkeypatch.setattr(oracle, "_PASSES_BYTES", 1)  # room for one pass at a time
    a, b = CASES[0].problem(), CASES[1].problem()
    first = oracle.oracle(a)[0]
    oracle.oracle(b)
    assert len(oracle._PASSES) == 1 and oracle._PASSES_SIZE > 0
    again = oracle.oracle(a)[0]
    assert again is not first and np.array_equal(again, first)  # computed again, the same
    assert not again.flags.writeable
