"""The report builds from committed fixtures, partial ones included, and is self-contained."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from reports.build import build_report
from reports.frames import load_sweeps
from reports.tables import compare_baseline

FIXTURES = Path(__file__).parent / "fixtures"
CHART_SECTIONS = ["scaling", "heads", "throughput", "memory"]
SECTIONS = ["environment", "conformance", *CHART_SECTIONS, "ranking", "not-measured"]


def _soup(path: Path) -> BeautifulSoup:
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _images(soup: BeautifulSoup, section: str) -> int:
    return len(soup.find(id=section).find_all(["img", "svg"]))


def _assert_self_contained(soup: BeautifulSoup) -> None:
    for tag in soup.find_all(src=True):
        assert tag["src"].startswith("data:image/"), tag["src"][:60]
    for tag in soup.find_all(href=True):
        assert tag["href"].startswith("#"), tag["href"]
    assert not soup.find_all("link") and not soup.find_all("script")
    assert not re.search(r"url\(|@import|https?://", str(soup.find("style")))


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> BeautifulSoup:
    out = tmp_path_factory.mktemp("report") / "report.html"
    build_report([FIXTURES / "vm", FIXTURES / "gpu", FIXTURES / "partial"], out,
                 baseline_paths=[FIXTURES / "baseline"])
    return _soup(out)


def test_every_section_with_its_charts(full):
    for section in SECTIONS + ["baseline"]:
        assert full.find("section", id=section) is not None, section
    assert _images(full, "scaling") == 2  # cpu and cuda
    assert _images(full, "throughput") == 2
    assert _images(full, "memory") == 2
    assert _images(full, "heads") == 1  # only the vm swept head counts
    assert _images(full, "baseline") == 1
    _assert_self_contained(full)


def test_environment_lists_every_machine(full):
    text = full.find(id="environment").get_text(" ")
    for fact in ("vm", "gpu-box", "laptop", "NVIDIA A100-SXM4-40GB", "AMD Ryzen 7 7840U",
                 "torch 2.13.0+cu128", "openblas", "c3c7616a32b2"):
        assert fact in text, fact


def test_conformance_matrix_shows_every_outcome(full):
    sec = full.find(id="conformance")
    matrix = sec.find("table")
    rows = {td.get_text(strip=True): td.parent for td in matrix.find_all("td", class_="impl")}
    assert set(rows) == {"bug.ignores_mask", "jax.nn", "numpy", "torch.nn"}
    assert rows["bug.ignores_mask"].find("td", class_="fail") is not None
    assert rows["torch.nn"].find("td", class_="deviation") is not None
    assert rows["numpy"].find("td", class_="fail") is None
    details = sec.find_all("details")
    assert len(details) == 4  # one expandable case list per implementation
    bug = next(d for d in details if "bug.ignores_mask" in d.summary.get_text())
    assert "×bound" in bug.get_text() and "IndexError" in bug.get_text()
    assert "NaN + -inf is NaN" in sec.get_text()  # torch.nn's declared reason
    assert "needs a CUDA device" in sec.get_text()  # an unavailable implementation


def test_exponents_ranking_and_not_measured(full):
    exps = full.find(id="scaling").find("table").get_text(" ")
    assert re.search(r"\d\.\d\d \[-?\d\.\d\d, \d\.\d\d\]", exps)
    ranking = " ".join(full.find(id="ranking").get_text(" ").split())
    assert "speed-up over numpy" in ranking and "torch.sdpa" in ranking
    nm = full.find(id="not-measured").get_text(" ")
    assert "No measured point at all: torch.flex" in " ".join(nm.split())
    for reason in ("CUDA out of memory", "exceeds the memory budget", "flex_attention"):
        assert reason in nm


def test_baseline_flags_the_planted_changes(full):
    sec = full.find(id="baseline")
    verdicts = {}
    for tr in sec.find_all("tr")[1:]:
        cells = [td.get_text(strip=True) for td in tr.find_all("td")]
        verdicts.setdefault(cells[0], set()).add(cells[-1])
    # the fixtures' baseline had torch.sdpa faster (regression now), jax.jit slower
    assert "regression" in verdicts["torch.sdpa"]
    assert "improvement" in verdicts["jax.jit"]
    assert "improvement" not in verdicts["torch.sdpa"]
    assert "regression" not in verdicts["jax.jit"]


def test_baseline_verdicts_follow_the_spread(tmp_path):
    doc = json.loads((FIXTURES / "real" / "sweep-a.json").read_text())
    slow = json.loads(json.dumps(doc))
    for b in slow["benchmarks"]:
        s = b["stats"]
        if b["extra_info"]["impl"] == "numpy":
            for k in ("min", "max", "mean", "median", "q1", "q3"):
                s[k] *= 50  # beyond any spread, even a real point with q3 = 21 q1
        else:  # a shift smaller than the spread: the interquartile ranges still overlap
            shift = 0.4 * (s["q3"] - s["q1"])
            for k in ("median", "q1", "q3"):
                s[k] += shift
    (tmp_path / "base.json").write_text(json.dumps(doc))
    (tmp_path / "cur.json").write_text(json.dumps(slow))
    cur = load_sweeps([tmp_path / "cur.json"])
    cmp = compare_baseline(cur, load_sweeps([tmp_path / "base.json"]))
    assert len(cmp) == len(doc["benchmarks"])
    assert set(cmp[cmp["impl"] == "numpy"]["verdict"]) == {"regression"}
    assert set(cmp[cmp["impl"] != "numpy"]["verdict"]) == {"within noise"}
    assert (cmp[cmp["impl"] != "numpy"]["ratio"] > 1).all()  # slower, yet not flagged


def test_partial_results_and_an_implementation_that_failed_everywhere(tmp_path):
    out = build_report([FIXTURES / "partial"], tmp_path / "r.html")
    soup = _soup(out)
    for section in SECTIONS:
        assert soup.find("section", id=section) is not None, section
    assert _images(soup, "scaling") == 1 and _images(soup, "heads") == 0
    assert "flex_attention on CPU" in soup.find(id="not-measured").get_text()
    assert "No conformance results" in soup.find(id="conformance").get_text()
    _assert_self_contained(soup)


def test_conformance_only_and_real_runs(tmp_path):
    soup = _soup(build_report([FIXTURES / "vm" / "conformance_vm.json"], tmp_path / "c.html"))
    assert _images(soup, "scaling") == 0 and "No length sweep" in soup.get_text()
    assert soup.find(id="conformance").find("td", class_="fail") is not None
    soup = _soup(build_report([FIXTURES / "real"], tmp_path / "r.html"))
    assert _images(soup, "scaling") == 1 and _images(soup, "heads") == 1
    _assert_self_contained(soup)


def test_several_machines_are_a_dimension(full):
    exps = full.find(id="scaling").find("table")
    machines = {tr.find("td").get_text(strip=True) for tr in exps.find_all("tr")[1:]}
    # laptop's sweep has three lengths: too few for the three-term cost model and an interval
    assert machines == {"vm", "gpu-box"}


def test_cli_writes_the_report_and_reports_errors(cli, tmp_path):
    out = tmp_path / "r.html"
    proc = cli("report", str(FIXTURES / "partial"), "--out", str(out),
               "--baseline-impl", "torch.sdpa")
    assert proc.returncode == 0, proc.stderr
    assert str(out.resolve()) in proc.stdout
    assert "speed-up over torch.sdpa" in " ".join(_soup(out).get_text().split())
    proc = cli("report", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr
