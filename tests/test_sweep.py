"""Sweeps: the barrier is inside the timed region, results survive interruption, resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from suite.sweep import presets, timing
from suite.sweep.point import Point, point_key
from suite.sweep.timing import flops
from tests.conftest import PLUGINS, ROOT

TINY = ["--preset", "ci", "--lengths", "16,32,64", "--heads", "1", "--mask", "none",
        "--head-dim", "8", "--max-time", "0.01", "--min-rounds", "2"]


def _sweep(tmp_path, *args: str, env=None) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "sweep", "--out", str(tmp_path),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=env)
    path = tmp_path / "sweep-ci.json"
    return proc, (json.loads(path.read_text()) if path.exists() else {})


@pytest.fixture(scope="module")
def numpy_sweep(tmp_path_factory):
    """``sweep TINY --impl numpy``, run once for the tests that read its file (each test that
    writes into the folder copies the file first). Launched as from a pytest-xdist worker, as
    every sweep of ``pytest -n`` is: those variables must not switch pytest-benchmark off."""
    import os

    out = tmp_path_factory.mktemp("numpy_sweep")
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}
    proc, doc = _sweep(out, *TINY, "--impl", "numpy", env=env)
    return out, proc, doc


def _medians(doc: dict) -> dict:
    return {b["extra_info"]["impl"]: b["stats"]["median"] for b in doc["benchmarks"]}


def test_barrier_is_inside_the_timed_region(tmp_path):
    proc, doc = _sweep(tmp_path, *TINY[:2], "--lengths", "16", "--heads", "1", "--mask", "none",
                       "--plugin", str(PLUGINS / "async_work.py"), "--impl", "async.*",
                       "--max-time", "0.2", "--min-rounds", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    medians = _medians(doc)
    assert medians["async.honest"] >= 0.05  # the work finishes inside synchronize
    assert medians["async.no_barrier"] < 0.01  # the control: without it, only the launch


def test_a_sweep_launched_from_an_xdist_worker_is_timed(numpy_sweep):
    """pytest-xdist's variables, inherited from the pytest run that launched the sweep, must
    not switch pytest-benchmark off (every point would have no timing)."""
    out, proc, _ = numpy_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "sweep-ci.json").read_text())
    assert len(doc["benchmarks"]) == 3
    assert all(b["stats"]["median"] > 0 for b in doc["benchmarks"])


def test_points_record_flops_and_memory(numpy_sweep):
    _, proc, doc = numpy_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(doc["benchmarks"]) == 3
    for b in doc["benchmarks"]:
        x = b["extra_info"]
        assert (x["L"], x["S"], x["K"], x["E"]) == (x["L"], x["L"], 1, 8)
        assert x["flops"] == flops(Point(B=1, L=x["L"], H=1, D=8))["flops"]
        assert x["flops_per_s"] == pytest.approx(x["flops"] / b["stats"]["median"])
        assert x["peak_method"] == "rss_hwm_delta" and x["peak_bytes"] >= 0
    facts = doc["machine_info"]["mha_suite"]
    assert facts["matmul_peak_flops"]["numpy:cpu:float32"] > 0
    run = facts["matmul_peak_runs"]["numpy:cpu:float32"]  # measured before and after the points
    assert run["before"] > 0 and run["after"] > 0 and run["spread"] is not None
    assert facts["matmul_peak_flops"]["numpy:cpu:float32"] == max(run["before"], run["after"])
    assert facts["threads"]["requested"] >= 1
    # the runtimes an exported graph's record does not name (its framework is torch)
    from importlib import metadata

    for dist in ("transformers", "onnxruntime", "openvino", "executorch"):
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            installed = None
        assert facts["libraries"][dist] == installed, dist


def test_interrupted_sweep_keeps_points_and_resumes(tmp_path):
    proc, first = _sweep(tmp_path, *TINY, "--impl", "numpy", "--stop-after", "2")
    assert proc.returncode != 0
    assert len(first["benchmarks"]) == 2
    proc, second = _sweep(tmp_path, *TINY, "--impl", "numpy", "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    keys = [point_key(b["extra_info"]) for b in second["benchmarks"]]
    assert len(keys) == len(set(keys)) == 3  # complete, nothing measured twice
    before = {point_key(b["extra_info"]): b["stats"] for b in first["benchmarks"]}
    for b in second["benchmarks"]:
        key = point_key(b["extra_info"])
        if key in before:
            assert b["stats"] == before[key]  # finished points were not re-measured


@pytest.fixture(scope="module")
def budget_sweep(tmp_path_factory):
    """A sweep whose only points are unsupported (torch.nn: no GQA) or over the memory budget
    (numpy): for the record and for the console."""
    return _sweep(tmp_path_factory.mktemp("budget"), *TINY[:2], "--lengths", "64", "--heads",
                  "2", "--kv-heads", "1", "--mask", "none", "--impl", "torch.nn", "--impl",
                  "numpy", "--memory-budget", "0.000001", "--max-time", "0.01")


def test_unsupported_and_budget_points_are_recorded(budget_sweep):
    proc, doc = budget_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = {(x["impl"], x["status"]) for x in doc["mha_suite_not_measured"]}
    assert ("torch.nn", "unsupported") in status  # no GQA
    assert ("numpy", "skipped") in status  # over the memory budget
    assert not doc["benchmarks"]


def test_results_are_readable_by_pytest_benchmark_compare(numpy_sweep):
    out, proc, doc = numpy_sweep
    assert proc.returncode == 0
    tool = Path(sys.executable).parent / "pytest-benchmark"  # the console script
    cmp = subprocess.run([str(tool), "compare", str(out / "sweep-ci.json")],
                         capture_output=True, text=True)
    assert cmp.returncode == 0, cmp.stderr
    assert "test_point[numpy-cpu-float32-L64" in cmp.stdout


def test_grid_overrides_and_bad_values():
    parser = __import__("argparse").ArgumentParser()
    presets.add_arguments(parser)
    spec = presets.grid(parser.parse_args(["--preset", "default", "--lengths", "128,256",
                                         "--heads", "2", "--mask", "causal"]))
    assert {(p["L"], p["H"], p["mask"]) for p in spec["points"]} == {
        (128, 2, "causal"), (256, 2, "causal")}
    with pytest.raises(SystemExit):
        parser.parse_args(["--lengths", "12x"])


def test_bad_sweep_arguments_are_one_line(cli):
    proc = cli("sweep", "--heads", "4", "--kv-heads", "3", "--out", "/tmp/never")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "mha-suite: error: --kv-heads 3 does not divide heads 4"


def test_a_hanging_point_times_out_and_the_sweep_goes_on(tmp_path):
    proc, doc = _sweep(tmp_path, *TINY[:2], "--lengths", "16", "--heads", "1", "--mask", "none",
                       "--plugin", str(PLUGINS / "hangs.py"), "--impl", "hang.*",
                       "--timeout", "3", "--max-time", "0.01")
    not_measured = {x["impl"]: x for x in doc["mha_suite_not_measured"]}
    assert not_measured["hang.forever"]["status"] == "timeout"
    assert "Timeout" in not_measured["hang.forever"]["reason"]
    assert _medians(doc).keys() == {"hang.neighbour_works"}  # measured, and kept
    assert proc.returncode == 1  # the run says something failed


def test_bad_mask_name_is_one_line(cli):
    proc = cli("sweep", "--mask", "diagonal", "--out", "/tmp/never")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("mha-suite: error: --mask: expected some of none, causal, "
                                   "valid_lens, got diagonal")


# --- no finished point is lost; no unfinished one is saved -----------------------------------
SLOW = ["--preset", "ci", "--lengths", "16,24,32,40,48,56,64,72", "--heads", "1", "--mask",
        "none", "--head-dim", "8", "--max-time", "0.3", "--min-rounds", "3",
        "--plugin", str(PLUGINS / "slow.py"), "--impl", "slow.numpy"]


def _ctrl_c_reaches_it() -> None:
    """In the child: SIGINT back to its default. A shell starts background jobs with SIGINT
    ignored and children inherit that (Python then never raises KeyboardInterrupt), so the
    tests run the sweep as a terminal's foreground job would, however they were started."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "suite.cli", "sweep", "--out", str(out),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, preexec_fn=_ctrl_c_reaches_it)


def _points_when(path: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> dict:
    """The results file once it holds at least ``n`` points (polled)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            doc = json.loads(path.read_text())  # always complete: written by rename
            if len(doc["benchmarks"]) >= n:
                return doc
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{path} never held {n} points")


def _complete(doc: dict) -> None:
    for b in doc["benchmarks"]:
        assert b["extra_info"]["status"] == "ok" and b["extra_info"]["flops_per_s"] > 0
        assert b["stats"]["rounds"] >= 3 and b["stats"]["median"] > 0


def test_sigint_keeps_finished_points_and_says_so(tmp_path):
    import signal

    proc = _start(tmp_path, *SLOW)
    _points_when(tmp_path / "sweep-ci.json", 1, proc)  # the first point is saved at once
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "mha-suite: interrupted" in err and "Traceback" not in err
    doc = json.loads((tmp_path / "sweep-ci.json").read_text())
    _complete(doc)  # the point in progress was not saved as ok
    finished = (out + err).count(" median ")
    assert len(doc["benchmarks"]) == finished >= 1  # and every finished one was
    assert len(doc["benchmarks"]) < 8


def test_kill_9_keeps_finished_points_and_resume_finishes(tmp_path):
    import signal

    proc = _start(tmp_path, *SLOW)
    seen = _points_when(tmp_path / "sweep-ci.json", 1, proc)  # the first point is saved at once
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    doc = json.loads((tmp_path / "sweep-ci.json").read_text())
    _complete(doc)
    kept = {point_key(b["extra_info"]): b["stats"] for b in doc["benchmarks"]}
    assert {point_key(b["extra_info"]) for b in seen["benchmarks"]} <= set(kept)
    proc, final = _sweep(tmp_path, *SLOW, "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    _complete(final)
    assert len(final["benchmarks"]) == 8
    for b in final["benchmarks"]:  # finished points were not measured again
        assert kept.get(point_key(b["extra_info"]), b["stats"]) == b["stats"]


def test_two_sweeps_into_one_out_keep_every_point(tmp_path):
    common = ["--preset", "ci", "--heads", "1", "--mask", "none", "--head-dim", "8",
              "--max-time", "0.01", "--min-rounds", "2", "--impl", "numpy"]
    procs = [_start(tmp_path, *common, "--lengths", lengths)
             for lengths in ("16,32,48", "24,40,56")]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    doc = json.loads((tmp_path / "sweep-ci.json").read_text())
    assert sorted(b["extra_info"]["L"] for b in doc["benchmarks"]) == [16, 24, 32, 40, 48, 56]


def test_a_rerun_without_resume_keeps_points_it_does_not_measure(numpy_sweep, tmp_path):
    import shutil

    out, proc, first = numpy_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    shutil.copy(out / "sweep-ci.json", tmp_path / "sweep-ci.json")  # the first run's file
    proc, second = _sweep(tmp_path, *TINY[:2], "--lengths", "16", "--heads", "1", "--mask",
                          "none", "--head-dim", "8", "--max-time", "0.01", "--impl", "numpy")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {point_key(b["extra_info"]) for b in second["benchmarks"]} == {
        point_key(b["extra_info"]) for b in first["benchmarks"]}


# --- outputs are checked before a point is timed ---------------------------------------------
def test_invalid_outputs_are_recorded_not_timed(tmp_path):
    proc, doc = _sweep(tmp_path, *TINY[:2], "--lengths", "16", "--heads", "2", "--mask", "none",
                       "--head-dim", "8", "--max-time", "0.01",
                       "--plugin", str(PLUGINS / "bad_output.py"), "--impl", "badout.*",
                       "--impl", "numpy")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert _medians(doc).keys() == {"numpy"}
    assert doc["benchmarks"][0]["extra_info"]["verified"].startswith("warm-up output")
    reasons = {x["impl"]: (x["status"], x["reason"]) for x in doc["mha_suite_not_measured"]}
    assert reasons == {
        "badout.list": ("invalid-output", "fetch: expected Result.output a NumPy array, got list"),
        "badout.shape": ("invalid-output",
                         "fetch: expected Result.output of shape (1, 16, 16) (B, L, E), got "
                         "(1, 1, 16)"),
        "badout.nan": ("invalid-output",
                       "fetch: expected finite outputs (the oracle's are), got 256 NaN or inf"),
        "badout.bare": ("invalid-output", "fetch: expected a suite.plugins.interface.Result with an output "
                                          "array, got ndarray")}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """One ``mha-suite check`` of three plugins, each on the cases its own ``-k`` selects
    (qualified by its name), under ``--timeout 2``: badout.list's non-array output,
    hang.forever's hang, and hang.wraps_the_alarm's hang, listed as a known failure. Every
    check lists every built-in (seconds of imports): one process instead of three."""
    from tests.conftest import run_cli

    tmp = tmp_path_factory.mktemp("check")
    known = tmp / "known.txt"
    known.write_text("*hang.wraps_the_alarm*  # listed: gives wrong answers\n")
    out = tmp / "c.json"
    own = {"badout.list": "test_case and causal_top_left_short_query",
           "hang.forever": "test_case and causal_top_left_short_query",
           "hang.wraps_the_alarm": "random_shapes or causal_top_left_short_query"}
    proc = run_cli("check", "--plugin", str(PLUGINS / "bad_output.py"), "--plugin",
                   str(PLUGINS / "hangs.py"), *[a for i in own for a in ("--impl", i)],
                   "--dtype", "float32", "--known-failures", str(known), "--timeout", "2",
                   "-k", " or ".join(f"({i} and ({k}))" for i, k in own.items()),
                   "--json", str(out))
    records = json.loads(out.read_text())["results"] if out.exists() else []
    return proc, records


def test_check_fails_a_non_array_output_in_one_line(checked):
    proc, records = checked
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout and "AttributeError" not in proc.stdout
    outcomes = {(r["outcome"], r["reason"]) for r in records if r["impl"] == "badout.list"}
    assert outcomes == {("fail", "fetch: expected Result.output a NumPy array, got list")}


def test_a_hanging_case_under_check_timeout_is_one_line(checked):
    proc, records = checked
    assert proc.returncode == 1
    lines = [x for x in proc.stdout.splitlines() if "no result within --timeout 2 s" in x
             and "hang.forever" in x]
    assert lines and "Traceback" not in proc.stdout and "time.sleep" not in proc.stdout
    assert [r["outcome"] for r in records if r["impl"] == "hang.forever"] == ["error"]


def test_a_timeout_is_an_error_even_when_listed_as_a_known_failure(checked):
    """A known-failure entry lists a wrong answer; a case that ran out of time is an error,
    whatever the plugin made of the alarm, and Hypothesis runs no further example."""
    proc, records = checked
    assert proc.returncode == 1, proc.stdout[-3000:]
    records = [r for r in records if r["impl"] == "hang.wraps_the_alarm"]
    assert sorted(r["case"] for r in records) == ["causal_top_left_short_query", "random_shapes"]
    for r in records:
        assert r["outcome"] == "error", r
        assert "no result within --timeout 2 s" in r["reason"], r


# --- where a sweep's time goes ---------------------------------------------------------------
def test_a_long_call_is_timed_with_one_untimed_call_and_the_time_is_accounted(tmp_path,
                                                                               monkeypatch):
    """A call of 20 ms: the checked warm-up is its only untimed call (pedantic mode, no
    calibration, no extra warm-up, no return-value call), and the file says where the
    sweep's wall time went."""
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("MHA_TEST_CALLS", str(calls))
    proc, doc = _sweep(tmp_path, *TINY[:2], "--lengths", "16", "--heads", "1", "--mask", "none",
                       "--head-dim", "8", "--max-time", "0.1", "--min-rounds", "3",
                       "--plugin", str(PLUGINS / "counted.py"), "--impl", "counted.numpy")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (point,) = doc["benchmarks"]
    assert point["extra_info"]["benchmark_mode"] == "pedantic"
    assert 3 <= point["stats"]["rounds"] <= 5  # max(min_rounds, ceil(0.1 s / warm-up call))
    assert len(calls.read_text().splitlines()) == point["stats"]["rounds"] + 1
    summary = doc["machine_info"]["mha_suite"]["sweep_time"]
    assert summary["points"] == 1 and summary["timed_s"] == pytest.approx(
        point["stats"]["total"])
    assert summary["ratio"] == pytest.approx(
        summary["wall_s"] / (summary["timed_s"] + summary["compile_s"]))
    assert "sweep time: " in proc.stdout + proc.stderr


def test_a_short_call_keeps_pytest_benchmarks_calibration(numpy_sweep):
    _, proc, doc = numpy_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    for b in doc["benchmarks"]:  # the rule, point by point; sub-millisecond calls calibrate
        x = b["extra_info"]
        long_call = x["warm_s"] >= timing.PEDANTIC_MIN_S
        assert x["benchmark_mode"] == ("pedantic" if long_call else "calibrated")
    assert "calibrated" in {b["extra_info"]["benchmark_mode"] for b in doc["benchmarks"]}


def _file_size_limit(limit: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_failed_save_stops_the_sweep_in_one_line_and_keeps_the_saved_points(tmp_path):
    """A full disk or a file-size limit: the sweep stops at the first save that fails, says
    where and why in one line, and the file keeps every point saved before (here: the first
    point, saved at once, fits under the limit; the save of the rest, at the end of this
    seconds-long sweep, does not)."""
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "sweep", "--out", str(tmp_path),
                           *TINY, "--impl", "numpy"], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, preexec_fn=_file_size_limit(9000))
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mha-suite:")]
    assert lines == [f"mha-suite: error: --out: cannot save {tmp_path / 'sweep-ci.json'}: File "
                     f"too large; the 1 point saved before are kept in "
                     f"{tmp_path / 'sweep-ci.json'}"], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    doc = json.loads((tmp_path / "sweep-ci.json").read_text())
    assert len(doc["benchmarks"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep-ci.json", "sweep-ci.json.lock"]


def test_a_point_skipped_for_its_memory_estimate_is_said_on_the_console(budget_sweep):
    proc, doc = budget_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = proc.stdout + proc.stderr  # (a line above the progress bar: on its console)
    assert "skipped: numpy-cpu-" in said and "GiB > budget" in said, said
    numpy = [x for x in doc["mha_suite_not_measured"] if x["impl"] == "numpy"]
    assert numpy and all(x["status"] == "skipped" for x in numpy)


BRACKETED = '''
from implementations.numpy.mha import NumpyMHA


class Bracketed(NumpyMHA):
    name = "numpy.mine[flash]"
'''


@pytest.mark.parametrize("progress", ["--progress", "--no-progress"])
def test_bracketed_names_print_whole_with_and_without_the_progress_bar(tmp_path, progress):
    """rich reads ``[flash]`` as markup and drops it: the console lines escape names, and
    ``--progress/--no-progress`` choose the bar as they do for check and run."""
    plugin_file = tmp_path / "bracketed.py"
    plugin_file.write_text(BRACKETED)
    proc, doc = _sweep(tmp_path, *TINY[:2], "--lengths", "16", "--heads", "1", "--mask", "none",
                       "--head-dim", "8", "--max-time", "0.01", "--min-rounds", "2",
                       "--plugin", str(plugin_file), "--impl", "numpy.mine*", progress)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = proc.stdout + proc.stderr
    assert "numpy.mine[flash]" in said, said
    # the bar draws its label on stderr only when it is on
    assert ("sweep" in proc.stderr.replace("sweep time", "")) == (progress == "--progress")
    assert [b["extra_info"]["impl"] for b in doc["benchmarks"]] == ["numpy.mine[flash]"]


def test_spread_flags_a_point_too_noisy_for_its_comparisons():
    assert timing.spread(1.0, 0.05, 0, 50)["noisy"] is None  # quiet: IQR 5%, no outliers
    assert "IQR 30% of the median" in timing.spread(1.0, 0.3, 0, 50)["noisy"]
    assert "8 of 40 rounds outliers" in timing.spread(1.0, 0.05, 8, 40)["noisy"]
    assert timing.spread(1.0, 0.05, 2, 5)["noisy"] is None  # too few rounds to judge outliers
    assert timing.spread(1.0, 0.05, 3, 40)["noisy"] is None  # 7.5% outliers: within bounds


def test_a_noisy_point_is_flagged_on_the_console_in_its_record_and_report(tmp_path):
    # (a steady control is left to the unit test above: on a loaded machine even a plain
    # sleep's rounds spread past the threshold, which is what the flag is for)
    proc, doc = _sweep(tmp_path, *TINY[:2], "--lengths", "16", "--heads", "1", "--mask", "none",
                       "--head-dim", "8", "--max-time", "0.2", "--min-rounds", "6",
                       "--plugin", str(PLUGINS / "noisy.py"), "--impl", "noisy.numpy",
                       "--no-progress")
    assert proc.returncode == 0, proc.stderr[-2000:]
    flagged = [line for line in proc.stdout.splitlines() if line.startswith("noisy:")]
    assert len(flagged) == 1 and flagged[0].startswith("noisy: noisy.numpy cpu"), proc.stdout
    assert "of the median" in flagged[0] and "--threads 1" in flagged[0]
    assert "IQR" in doc["benchmarks"][0]["extra_info"]["noisy"]
    from reports.frames import load_sweeps
    from reports.tables import ranking

    ok = load_sweeps([tmp_path]).query("status == 'ok'")
    quiet = ok.assign(impl="quiet", noisy=None, median_s=ok["median_s"] / 2)
    text = ranking(pd.concat([ok, quiet]), "quiet").to_string()
    assert "quiet\u00a01.00×\u00a0·" in text  # unmarked
    assert text.rstrip().endswith("noisy.numpy\u00a00.50×\u00a0(noisy)"), text


def test_a_brief_sweep_says_each_reason_not_measured_once_naming_its_implementations(capsys):
    """The main job's sweep (brief): six interpreted kernels skipped for one reason are one
    line at the end, not six; a full sweep says each implementation's first point at once."""
    from suite.sweep.session import SweepSession

    brief = SweepSession({"brief": True})
    names = [f"pallas.k{i}" for i in range(6)]
    for name in names:
        for L in (128, 256):
            brief.not_measured_note(name, f"{name}-cpu-interpret-L{L}", "skipped",
                                    "cpu-interpret: interpreted, never timed")
    brief.not_measured_note("torch.nn[fast]", "torch.nn[fast]-L1024-H1", "unsupported",
                            "the fast path needs an even head count")
    assert capsys.readouterr().out == ""
    assert brief.not_measured_lines() == [
        "skipped: pallas.k0, pallas.k1, pallas.k2, +3 more: cpu-interpret: interpreted, "
        "never timed", "unsupported: torch.nn[fast]: the fast path needs an even head count"]
    full = SweepSession({})
    full.not_measured_note("pallas.k0", "pallas.k0-cpu-interpret-L128", "skipped", "why")
    assert "skipped: pallas.k0-cpu-interpret-L128: why" in capsys.readouterr().out
    assert full.not_measured_lines() == []
