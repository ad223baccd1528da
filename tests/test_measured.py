"""The docs' "Measured" page: filed runs of the README's commands and CI's steps."""

import json

import pytest

from docs_tools import measured

MACHINE = {"cpu": "Some CPU", "cores": 2, "flags": ["avx2"]}


def _record(session, steps, passed=True, started="2026-11-27T01:00:00Z"):
    return {"session": session, "commit": "abc1234", "machine": MACHINE, "started": started,
            "steps": [{"step": s, "seconds": t} for s, t in steps],
            "seconds": sum(t for _, t in steps), "passed": passed}


def test_add_files_the_session_records_and_the_page_shows_each_step(tmp_path):
    timings, folder = tmp_path / "timings", tmp_path / "measured"
    timings.mkdir()
    (timings / "tests.json").write_text(json.dumps(_record(
        "tests", [("pytest tests", 421.0), ("check --cover (native level)", 577.4)])))
    (timings / "lint.json").write_text(json.dumps(_record(
        "lint", [("ruff", 1.2)], passed=False, started="2026-11-27T00:59:00Z")))
    path = measured.add(".ci/run", "fresh clone", ".ci/run", timings, folder)
    assert path.name == "2026-11-27-abc1234-ci-run.json"
    text = measured.page(folder)
    assert "## .ci/run: abc1234, 2026-11-27" in text
    assert "| `tests` | pytest tests | 7 min 1 s |" in text
    assert "| `tests` | **total** | **16 min 38 s** |" in text
    assert "| `lint` | **total** (failed) | **1 s** |" in text
    assert "Some CPU, 2 cores (avx2)" in text and "fresh clone" in text


def test_a_filed_run_with_an_unknown_field_is_one_clear_line(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"what": "w", "records": [], "when": 1}))
    with pytest.raises(measured.MeasuredError, match=r"x.json: unknown field\(s\) when"):
        measured.page(tmp_path)


def test_add_without_records_says_what_to_run_first(tmp_path, capsys):
    assert measured.main(["add", "w", "--note", "n", "--timings", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("measured: no session record in")


def test_every_filed_run_reads():
    assert "## " in measured.page()  # the repository's own docs/measured/ folder
