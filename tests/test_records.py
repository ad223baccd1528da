"""suite.results.records: merging never loses a point; readers refuse what is not mha-suite results."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from suite.results import records
from suite.results.records import ResultsError
from suite.sweep.point import point_key

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


def test_a_symlinked_results_file_is_written_through(tmp_path):
    real = tmp_path / "store" / "sweep.json"
    records.merge_sweep(real, RUN, [_point(16)], [])
    link = tmp_path / "sweep.json"
    link.symlink_to(real)
    records.merge_sweep(link, RUN, [_point(32)], [])
    assert link.is_symlink()  # the link stays a link, and its target has both points
    assert _keys(json.loads(real.read_text())) == {16, 32}


def test_two_machines_sweeping_into_one_file_keep_their_own_facts(tmp_path):
    path = tmp_path / "sweep-ci.json"
    other = {"machine_info": {"node": "far", "mha_suite": {"cpu_model": "c2"}},
             "commit_info": {"id": "y"}}
    assert records.save_sweep(path, RUN, [_point(16)], []) == path
    written = records.save_sweep(path, other, [_point(32)], [])
    assert written == tmp_path / "sweep-ci@far.json"
    mine, theirs = json.loads(path.read_text()), json.loads(written.read_text())
    assert mine["machine_info"]["node"] == "n" and _keys(mine) == {16}
    assert theirs["machine_info"]["node"] == "far" and _keys(theirs) == {32}
    docs = records.read([tmp_path])
    assert sorted(records.machine_ids(docs).values()) == ["far", "n"]


@pytest.mark.parametrize("doc, needle", [
    ({"kind": records.CONFORMANCE_KIND, "version": 99, "results": [], "implementations": []},
     "conformance format version 99: expected 1 to 2"),
    ({"benchmarks": [], "machine_info": {"mha_suite": {}}, "mha_suite_format": 7},
     "sweep format version 7: expected 1"),
])
def test_an_unknown_format_version_is_refused(tmp_path, doc, needle):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=needle):
        records.read([path])


FULL_DISK = """
import json, resource, sys
from suite.results import records
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
run = {"machine_info": {"node": "n", "mha_suite": {"cpu_model": "c"}}, "commit_info": {}}
points = [{"name": f"p{i}", "extra_info": {"impl": "numpy", "device": "cpu", "dtype": "float32",
           "B": 1, "H": 1, "K": 1, "L": i, "S": i, "D": 8, "mask": "none", "grad": False,
           "pad": "x" * 1000}, "stats": {"median": 1.0}} for i in range(1, 200)]
try:
    records.merge_sweep(sys.argv[1], run, points, [])
except OSError as exc:
    print(records.os_reason(exc))
"""


def test_a_file_size_limit_during_a_save_keeps_the_earlier_file(tmp_path):
    """A save that cannot be written whole (RLIMIT_FSIZE, as a full disk) raises OSError and
    leaves the earlier file as it was, with no temporary file beside it."""
    import subprocess
    import sys

    path = tmp_path / "sweep.json"
    records.merge_sweep(path, RUN, [_point(16)], [])
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(path), str(len(before) + 4096)],
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout.strip() == "File too large", proc.stdout + proc.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json", "sweep.json.lock"]


def _stopped(proc) -> tuple:
    """Kill ``proc``'s process group (a failed wait must not hang the test run) and return
    what it printed."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.communicate(timeout=60)


def _check_until_it_hangs(tmp_path, *args: str):
    """``mha-suite check`` of a plugin that hangs after a few cases, in its own process
    group, once it hangs: (process, results path)."""
    import signal
    import subprocess
    import sys
    import time

    marker, out = tmp_path / "hanging", tmp_path / "conformance.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "suite.cli", "check", "--plugin",
         str(Path(__file__).parent / "plugins" / "hangs_later.py"), "--dtype", "float32",
         "-k", "masking", "--timeout", "0", "--json", str(out), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[1], start_new_session=True,
        env={**os.environ, "MHA_SUITE_TEST_MARKER": str(marker)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, _stopped(proc)
        time.sleep(0.1)
    return proc, out


def _one_line_and_kept(proc, out, word: str, before: set) -> None:
    import subprocess

    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within 120 s of the signal: {_stopped(proc)}")
    assert proc.returncode == 130, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.startswith("mha-suite:")]
    assert len(lines) == 1 and lines[0].startswith(f"mha-suite: {word}: the "), stderr[-2000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stdout + stderr
    kept = {(r["impl"], r["test_id"], r["outcome"]) for r in json.loads(out.read_text())["results"]}
    assert before <= kept  # nothing recorded before the signal was lost


def _recorded(out: Path) -> set:
    if not out.exists():
        return set()
    return {(r["impl"], r["test_id"], r["outcome"]) for r in json.loads(out.read_text())["results"]}


def test_sigterm_to_check_saves_the_finished_cases_and_says_so(tmp_path):
    import signal

    proc, out = _check_until_it_hangs(tmp_path, "--impl", "later.hangs", "--workers", "0")
    proc.send_signal(signal.SIGTERM)
    _one_line_and_kept(proc, out, "SIGTERM", set())
    hangs = [r for r in json.loads(out.read_text())["results"] if r["impl"] == "later.hangs"]
    assert len(hangs) == 4 and all(r["outcome"] == "pass" for r in hangs)  # each one finished


def test_an_interrupt_inside_a_gc_callback_is_delivered_again_and_not_printed():
    """A Ctrl-C that lands in a callback Python runs for itself (JAX's garbage-collection
    callback: the traceback a worker once printed on Ctrl-C) is raised again in the main
    thread; any other unraisable exception still reaches the hook before."""
    import gc
    import signal
    import sys
    import time

    from suite.pytest_plugin import interrupt_again

    seen = []

    def interrupted(phase, info):
        if phase == "start":
            raise KeyboardInterrupt

    before, sys.unraisablehook = sys.unraisablehook, interrupt_again(seen.append)
    # as in the process a user interrupts (a pytest-xdist worker ignores SIGINT)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    gc.callbacks.append(interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            gc.collect()
            gc.callbacks.remove(interrupted)
            time.sleep(1)  # the interrupt arrives at the main thread's next check
        sys.unraisablehook(type("Args", (), {"exc_value": ValueError("other")}))
    finally:
        if interrupted in gc.callbacks:
            gc.callbacks.remove(interrupted)
        sys.unraisablehook = before
        signal.signal(signal.SIGINT, handler)
    assert [type(a.exc_value) for a in seen] == [ValueError]


def test_ctrl_c_with_workers_keeps_records_and_leaves_no_worker(tmp_path):
    import signal
    import time

    proc, out = _check_until_it_hangs(tmp_path, "--impl", "later.hangs", "--impl", "numpy",
                                      "--workers", "2")
    try:
        deadline = time.monotonic() + 120  # records saved (the first case at once) before it
        while not _recorded(out):
            assert proc.poll() is None and time.monotonic() < deadline, _stopped(proc)
            time.sleep(0.2)
        before = _recorded(out)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
        _one_line_and_kept(proc, out, "interrupted", before)
    finally:
        if proc.poll() is None:
            _stopped(proc)
    deadline = time.monotonic() + 30
    while True:  # every process of the group (the workers) has ended
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a worker outlived the run"
        time.sleep(0.2)


def test_a_failed_conformance_save_stops_in_one_line(tmp_path):
    """check --json under a file-size limit: one line naming --json and why, exit 1, and no
    partial or temporary file left behind."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "conformance.json"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    proc = subprocess.run([sys.executable, "-m", "suite.cli", "check", "--impl", "numpy",
                           "--dtype", "float32", "--workers", "0", "-k", "masking and causal",
                           "--json", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[1], preexec_fn=limit)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mha-suite:")]
    assert lines == [f"mha-suite: error: --json: cannot save {out}: File too large; the records "
                     "saved before are kept"], proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["conformance.json.lock"])


@pytest.mark.parametrize("doc", [
    {"kind": "k", "results": [{"a": 1, "b": [1, {"c": None}], "x": "two\nlines"}, {"n": 2}],
     "machine_info": {"node": "n", "cpu": {"flags": ["a", "b"]}}, "benchmarks": [], "e": {}},
    {"benchmarks": [{"extra_info": {"Lq": 3}}], "mha_suite_not_measured": [{"L": 1}]},
    {}, {"results": []},
])
def test_dumps_is_the_indented_json_value_with_one_entry_a_line(doc):
    text = records.dumps(doc)
    assert json.loads(text) == json.loads(json.dumps(doc, indent=1))
    rows = [k for k in records.ROW_LISTS if doc.get(k)]
    lines = [line.removesuffix(",") for line in text.splitlines()]
    for key in rows:  # each entry on a line of its own, as the C encoder writes it
        for entry in doc[key]:
            assert "  " + json.dumps(entry) in lines


def test_a_conformance_file_is_written_one_record_a_line(tmp_path):
    path = tmp_path / "c.json"
    rs = [{"impl": "numpy", "device": "cpu", "dtype": "float32", "test_id": f"t{i}",
           "outcome": "pass"} for i in range(3)]
    records.merge_conformance(path, RUN, [{"name": "numpy"}], rs)
    text = path.read_text()
    assert sum(line.startswith('  {"impl"') for line in text.splitlines()) == 3
    assert records.read_file(path, "conformance").doc["results"] == rs
