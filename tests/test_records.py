"""suite.records: merging never loses a point; readers refuse what is not mha-suite results."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from suite import records
from suite.point import point_key
from suite.records import ResultsError

FIXTURES = Path(__file__).parent / "fixtures"
RUN = {"machine_info": {"node": "n", "mha_suite": {"cpu_model": "c"}}, "commit_info": {"id": "x"}}


def _point(L: int, median: float = 1.0, impl: str = "numpy") -> dict:
    extra = {"impl": impl, "device": "cpu", "dtype": "float32", "B": 1, "H": 1, "H_kv": 1,
             "Lq": L, "Lk": L, "D": 8, "mask": "none", "grad": False, "status": "ok"}
    return {"name": f"p{L}", "extra_info": extra, "stats": {"median": median}}


def _keys(doc: dict) -> set:
    return {b["extra_info"]["Lq"] for b in doc["benchmarks"]}


def test_merge_keeps_the_files_points_and_replaces_only_its_own(tmp_path):
    path = tmp_path / "s.json"
    records.merge_sweep(path, RUN, [_point(16), _point(32)], [])
    doc = records.merge_sweep(path, RUN, [_point(32, median=2.0), _point(64)], [])
    assert _keys(doc) == {16, 32, 64}
    assert {b["extra_info"]["Lq"]: b["stats"]["median"] for b in doc["benchmarks"]}[32] == 2.0
    assert json.loads(path.read_text()) == doc


def test_a_failed_rerun_never_removes_a_measurement(tmp_path):
    path = tmp_path / "s.json"
    records.merge_sweep(path, RUN, [_point(16)], [])
    failed = {**_point(16)["extra_info"], "status": "error", "reason": "RuntimeError: boom"}
    doc = records.merge_sweep(path, RUN, [], [failed])
    assert _keys(doc) == {16} and doc["mha_suite_not_measured"] == []
    # and a point measured later replaces its earlier failure
    later = {**_point(64)["extra_info"], "status": "timeout", "reason": "slow"}
    records.merge_sweep(path, RUN, [], [later])
    doc = records.merge_sweep(path, RUN, [_point(64)], [])
    assert _keys(doc) == {16, 64} and doc["mha_suite_not_measured"] == []


def _writer(path: str, start: int) -> None:
    mine = []
    for i in range(start, start + 20):  # every save carries all of this writer's points
        mine.append(_point(i))
        records.merge_sweep(path, RUN, mine, [])


def test_concurrent_writers_keep_every_point(tmp_path):
    path = str(tmp_path / "s.json")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, start)) for start in (0, 100, 200)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    doc = json.loads(Path(path).read_text())
    assert _keys(doc) == set(range(20)) | set(range(100, 120)) | set(range(200, 220))
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_conformance_merge_replaces_cases_by_test_id(tmp_path):
    path = tmp_path / "c.json"
    a = {"impl": "numpy", "device": "cpu", "dtype": "float32", "test_id": "t1", "outcome": "fail"}
    b = {**a, "test_id": "t2"}
    records.merge_conformance(path, RUN, [{"name": "numpy"}], [a, b])
    doc = records.merge_conformance(path, RUN, [{"name": "numpy"}], [{**a, "outcome": "pass"}])
    assert sorted((r["test_id"], r["outcome"]) for r in doc["results"]) == [
        ("t1", "pass"), ("t2", "fail")]
    assert doc["kind"] == records.CONFORMANCE_KIND and doc["machine_info"] == RUN["machine_info"]


def test_write_atomic_leaves_an_ordinary_file(tmp_path):
    path = records.write_atomic(tmp_path / "r.html", "x")
    assert path.read_text() == "x" and os.stat(path).st_mode & 0o044  # readable by others
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


@pytest.mark.parametrize("text, needle", [
    ('{"benchmarks": ', "is not valid JSON"),
    ('{"benchmarks": "oops"}', "benchmarks: expected a list of points, got str"),
    ('{"benchmarks": [], "machine_info": {"node": "x"}}', "not written by mha-suite"),
    ('{"benchmarks": [{"stats": {}}], "machine_info": {"mha_suite": {}}}', "benchmarks[0]"),
    ('{"kind": "mha-suite/conformance", "results": "x"}', "results: expected a list"),
    ('[1, 2]', "not an mha-suite results file"),
])
def test_readers_refuse_what_is_not_results(tmp_path, text, needle):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(ResultsError, match=None) as info:
        records.read([path])
    assert needle in str(info.value) and str(path) in str(info.value)
    assert len(str(info.value).splitlines()) == 1
    with pytest.raises(ResultsError):  # inside a directory too
        records.read([tmp_path])


def test_an_empty_directory_is_refused(tmp_path):
    with pytest.raises(ResultsError, match="holds no mha-suite results files"):
        records.read([tmp_path])


def test_the_committed_fixtures_read_and_share_run_fact_names():
    docs = records.read([FIXTURES / "vm", FIXTURES / "real"])
    assert {d.kind for d in docs} == {"sweep", "conformance"}
    for d in docs:
        facts = records.run_facts(d)
        assert facts["node"] != "unknown" and facts["datetime"], d.path


def test_check_writable_refuses_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ResultsError, match="--out: expected a writable directory"):
        records.check_writable(blocker / "sub" / "r.json", "--out")
    with pytest.raises(ResultsError, match="expected a file path, got the directory"):
        records.check_writable(tmp_path, "--json")
    other = tmp_path / "c.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(ResultsError, match="not an mha-suite results file"):
        records.check_writable(other, "--json", kind="conformance")
    assert other.read_text() == '{"hello": 1}'  # not overwritten


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(ResultsError, match="--out: expected a writable directory"):
        records.check_writable(ro / "r.json", "--out")


def test_measured_keys_are_the_files_points():
    path = FIXTURES / "real" / "sweep-a.json"
    doc = json.loads(path.read_text())
    assert records.measured_keys(path) == {point_key(b["extra_info"]) for b in doc["benchmarks"]}
