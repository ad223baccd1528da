"""mha-suite compare: two conformance results files case by case, as a developer meets it
after `nox -s check_full` (issue #51: verdicts unchanged by the speed work)."""

from __future__ import annotations

import json
import shutil

import pytest

from suite.conformance import compare

MASKING = "suite/conformance/tests/test_agreement.py::test_case[numpy-cpu-float32-masking/{}]"


@pytest.fixture(scope="module")
def before(tmp_path_factory):
    """A results file written by the suite itself: numpy in float32 on a few masking cases."""
    from tests.conftest import run_cli

    path = tmp_path_factory.mktemp("compare") / "before.json"
    proc = run_cli("check", "--impl", "numpy", "--dtype", "float32", "--workers", "0",
                   "--no-progress", "-k", "masking and (none or valid_lens or causal)",
                   "--json", str(path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(path.read_text())["results"]
    tests = {r["test_id"] for r in results}
    assert len(results) >= 4 and MASKING.format("none") in tests, sorted(tests)
    assert MASKING.format("valid_lens") in tests and all(r["outcome"] == "pass" for r in results)
    return path


def _edited(src, dst, edit):
    """A copy of the results file ``src`` at ``dst`` with ``edit(results)`` applied."""
    doc = json.loads(src.read_text())
    edit(doc["results"])
    dst.write_text(json.dumps(doc))
    return dst


def _fail(test_id: str, reason: str):
    def edit(results):
        (r,) = [r for r in results if r["test_id"] == test_id]
        r.update(outcome="fail", reason=reason)
    return edit


def test_a_file_compared_with_its_copy_is_unchanged(cli, before, tmp_path):
    after = shutil.copy(before, tmp_path / "after.json")
    proc = cli("compare", str(before), str(after), "--numbers")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    n = len(json.loads(before.read_text())["results"])
    assert lines[0] == (f"{n} cases in both files: {n} same outcome, 0 changed, 0 "
                        "intermittent; 0 only before, 0 only after"), lines
    assert f"  err: {n} cases passed in both with a value, 0 changed" in lines
    assert lines[-1] == "verdicts unchanged" and len(lines) <= 8, lines


def test_a_changed_outcome_and_a_missing_record_are_named_and_exit_1(cli, before, tmp_path):
    def edit(results):
        _fail(MASKING.format("none"), "err 3.1e-03 > bound 2.4e-06\nrow 0 and more")(results)
        results[:] = [r for r in results if r["test_id"] != MASKING.format("valid_lens")]

    after = _edited(before, tmp_path / "after.json", edit)
    proc = cli("compare", str(before), str(after))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "1 changed, 0 intermittent; 1 only before, 0 only after" in out.splitlines()[0]
    assert ("  test_case[numpy-cpu-float32-masking/none]: pass -> fail (err 3.1e-03 > "
            "bound 2.4e-06)\n") in out  # the reason's first line only
    assert "only before (1):\n  test_case[numpy-cpu-float32-masking/valid_lens]: pass\n" in out
    assert out.splitlines()[-1] == "verdicts changed: 1 outcome changed, 1 record gone"
    # the other way round: the record is new, the outcome changed back
    back = cli("compare", str(after), str(before))
    assert back.returncode == 1 and "only after (1):" in back.stdout
    assert "masking/none]: fail (err 3.1e-03 > bound 2.4e-06) -> pass" in back.stdout


@pytest.mark.parametrize("side", ["gone", "new"])
def test_a_record_in_one_file_only_is_exit_1_though_no_outcome_changed(cli, before, tmp_path,
                                                                      side):
    fewer = _edited(before, tmp_path / "fewer.json",
                    lambda rs: rs.remove(next(r for r in rs
                                              if r["test_id"] == MASKING.format("none"))))
    args = (before, fewer) if side == "gone" else (fewer, before)
    proc = cli("compare", *map(str, args))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert " 0 changed, 0 intermittent; " in proc.stdout.splitlines()[0]
    kind = "only before" if side == "gone" else "only after"
    assert f"{kind} (1):\n  test_case[numpy-cpu-float32-masking/none]: pass\n" in proc.stdout
    assert proc.stdout.splitlines()[-1] == f"verdicts changed: 1 record {side}"


def test_a_change_an_intermittent_entry_lists_is_named_and_not_a_change(cli, before,
                                                                        tmp_path):
    after = _edited(before, tmp_path / "after.json",
                    _fail(MASKING.format("none"), "NaN in some runs"))
    listed = tmp_path / "flaky.txt"
    listed.write_text("test_case[[]numpy-cpu-float32-masking/none[]] {intermittent} # planted\n"
                      "test_case[[]numpy-cpu-float32-masking/valid_lens[]] # not intermittent\n")
    proc = cli("compare", str(before), str(after), "--known-failures", str(listed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 changed, 1 intermittent" in proc.stdout.splitlines()[0]
    assert ("masking/none]: pass -> fail (NaN in some runs); listed by "
            "'test_case[[]numpy-cpu-float32-masking/none[]]'") in proc.stdout
    assert proc.stdout.splitlines()[-1] == "verdicts unchanged (but 1 intermittent)"
    # a case a known failure lists that is not intermittent is a change
    also = _edited(after, tmp_path / "also.json",
                   _fail(MASKING.format("valid_lens"), "wrong"))
    proc = cli("compare", str(before), str(also), "--known-failures", str(listed))
    assert proc.returncode == 1 and "1 changed, 1 intermittent" in proc.stdout
    # without the file the entry is not there: a change
    assert cli("compare", str(before), str(after)).returncode == 1


def test_the_suites_own_intermittent_records_name_their_changes(before):
    """A case the shipped known_failures.toml lists as intermittent, by its record's name."""
    from suite.results.records import read_file

    entries = compare.intermittent_entries()
    flex = [e for e in entries if e.glob.startswith("test_case[[]torch.flex-cpu-")]
    assert flex and all(e.where == "known_failures.toml" for e in flex), entries
    entry = flex[0]
    test = entry.glob.replace("[[]", "[").replace("[]]", "]").replace("*", "float32")
    old, new = read_file(before), read_file(before)
    row = {"impl": "torch.flex", "device": "cpu", "dtype": "float32", "isa": None,
           "test_id": f"suite/conformance/tests/test_agreement.py::{test}"}
    old.doc["results"] = [{**row, "outcome": "known_failure", "reason": "listed"}]
    new.doc["results"] = [{**row, "outcome": "pass", "reason": None}]
    c = compare.compare(old, new, entries)
    assert c.exit_status == 0 and not c.changed and len(c.intermittent) == 1
    assert c.intermittent[0].line().endswith(f"listed by {entry.name} (known_failures.toml)")
    assert c.intermittent[0].intermittent.name == entry.name
    # at a lower CPU level it is the same entry's case (the level is part of the key only)
    for doc in (old, new):
        doc.doc["results"][0]["isa"] = "avx2"
    assert compare.compare(old, new, entries).intermittent[0].line().startswith(
        f"{test} at avx2: known_failure (listed) -> pass")


def test_each_kind_shows_at_most_n_lines_then_a_count(cli, before, tmp_path):
    def edit(results):
        for r in results:
            r.update(outcome="error", reason="boom")

    after = _edited(before, tmp_path / "after.json", edit)
    n = len(json.loads(before.read_text())["results"])
    proc = cli("compare", str(before), str(after), "--show", "2")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    i = lines.index(f"changed outcomes ({n}):")
    assert lines[i + 1].endswith(": pass -> error (boom)")
    assert lines[i + 3] == f"  +{n - 2} more" and len(lines) == i + 5, lines


def test_the_level_is_part_of_the_key(before, tmp_path):
    from suite.results.records import read_file

    old, new = read_file(before), read_file(before)
    new.doc["results"] = [{**r, "isa": "avx2"} for r in new.doc["results"]]
    c = compare.compare(old, new)
    n = len(old.doc["results"])
    assert c.same == 0 and len(c.only_before) == len(c.only_after) == n
    assert compare.case_name(c.only_after[0]).endswith(" at avx2")


def test_numbers_report_the_largest_relative_change(cli, before, tmp_path):
    def edit(results):
        results[0]["err"] *= 1.5
        results[1]["err"] *= 1.01
        results[1]["bound"] *= 2

    after = _edited(before, tmp_path / "after.json", edit)
    rows = json.loads(before.read_text())["results"]
    name = rows[0]["test_id"].split("::")[1]
    proc = cli("compare", str(before), str(after), "--numbers")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # numbers never change the verdict
    n = len(rows)
    assert (f"  err: {n} cases passed in both with a value, 2 changed; largest relative "
            f"change 5.00e-01 in {name} (") in proc.stdout
    assert f"  bound: {n} cases passed in both with a value, 1 changed; largest relative " \
           "change 1.00e+00 in " in proc.stdout
    assert "passed in both" not in cli("compare", str(before), str(after)).stdout  # off by default


@pytest.mark.parametrize("bad", ["missing", "folder", "not_json", "sweep", "other_json"])
def test_a_bad_file_is_one_line_and_exit_2(cli, before, tmp_path, bad):
    path = tmp_path / "bad.json"
    if bad == "folder":
        path = tmp_path
    elif bad == "not_json":
        path.write_text("{ not json")
    elif bad == "sweep":
        path.write_text(json.dumps({"benchmarks": [], "machine_info": {"mha_suite": {}}}))
    elif bad == "other_json":
        path.write_text(json.dumps({"results": []}))
    for args, side in (((str(path), str(before)), "BEFORE"), ((str(before), str(path)), "AFTER")):
        proc = cli("compare", *args)
        assert proc.returncode == 2, (bad, proc.stdout, proc.stderr)
        err = proc.stderr.strip()
        assert proc.stdout == "" and "Traceback" not in proc.stderr, (bad, proc.stderr)
        assert len(err.splitlines()) == 1 and err.startswith(f"mha-suite: error: compare: {side}")
        assert str(path) in err, err
        if bad == "sweep":
            assert "is a sweep results file; expected a conformance results file" in err
