"""The report builds from committed fixtures, partial ones included, and is self-contained."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from reports.build import build_report
from suite.results import fit_exponent, load

FIXTURES = Path(__file__).parent / "fixtures"
SWEEP_A = next(FIXTURES.rglob("sweep-a.json"))  # a real ci-preset sweep from this project
SECTIONS = ["environment", "conformance", "scaling", "heads", "throughput", "memory", "ranking",
            "not-measured"]


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.imgs, self.links, self.section = set(), {}, [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("id")
            self.ids.add(self.section)
        if tag == "img":
            self.imgs[self.section] = self.imgs.get(self.section, 0) + 1
            self.links.append(a.get("src", ""))
        for key in ("href", "src"):
            if tag in ("link", "script", "a", "iframe") and key in a:
                self.links.append(a[key])


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    return page


def test_full_report_has_every_section_and_chart(tmp_path):
    out = build_report([str(FIXTURES)], tmp_path / "r.html")
    page = _parse(out)
    assert set(SECTIONS) <= page.ids
    for section in ("scaling", "heads", "throughput", "memory"):
        assert page.imgs.get(section, 0) >= 1, section
    assert all(link.startswith(("data:", "#")) for link in page.links), page.links
    text = out.read_text()
    assert "bug.ignores_mask" in text and "fail" in text  # the conformance failures
    assert "deviation" in text and "NaN" in text  # torch.nn's declared deviation


def test_partial_results_and_an_implementation_that_failed_everywhere(tmp_path):
    doc = json.loads((SWEEP_A).read_text())
    doc["benchmarks"] = doc["benchmarks"][::3]  # missing points
    x = dict(doc["benchmarks"][0]["extra_info"], impl="broken.run", status="error",
             reason="RuntimeError: kernel launch failed")
    doc["mha_suite_not_measured"] = [dict(x, Lq=L, Lk=L) for L in (32, 64, 128)]
    (tmp_path / "partial.json").write_text(json.dumps(doc))
    out = build_report([str(tmp_path / "partial.json")], tmp_path / "r.html")
    text = out.read_text()
    assert "kernel launch failed" in text
    assert set(SECTIONS) <= _parse(out).ids


def test_baseline_flags_only_beyond_the_spread(tmp_path):
    doc = json.loads((SWEEP_A).read_text())
    slow = json.loads(json.dumps(doc))
    for b in slow["benchmarks"]:
        if b["extra_info"]["impl"] == "numpy":
            for k in ("min", "max", "mean", "median", "q1", "q3"):
                b["stats"][k] *= 3  # far beyond any spread
    (tmp_path / "base.json").write_text(json.dumps(doc))
    (tmp_path / "cur.json").write_text(json.dumps(slow))
    out = build_report([str(tmp_path / "cur.json")], tmp_path / "r.html",
                       baseline=[str(tmp_path / "base.json")])
    from reports.tables import compare_baseline

    cur, _ = load([tmp_path / "cur.json"])
    base, _ = load([tmp_path / "base.json"])
    cmp = compare_baseline(cur[cur["status"] == "ok"], base)
    assert set(cmp[cmp["impl"] == "numpy"]["verdict"]) == {"regression"}
    assert set(cmp[cmp["impl"] != "numpy"]["verdict"]) == {"within noise"}
    assert "regression" in out.read_text()


def test_two_machines_merge(tmp_path):
    doc = json.loads((SWEEP_A).read_text())
    doc["machine_info"]["node"] = "other-box"
    (tmp_path / "b.json").write_text(json.dumps(doc))
    sweeps, _ = load([SWEEP_A, tmp_path / "b.json"])
    assert sweeps["machine"].nunique() == 2
    out = build_report([str(SWEEP_A), str(tmp_path / "b.json")],
                       tmp_path / "r.html")
    assert "other-box" in out.read_text()


def test_loaders_columns_and_nonfinite_errors():
    sweeps, conf = load([FIXTURES])
    assert {"median_s", "flops_per_s", "peak_share", "machine", "status"} <= set(sweeps)
    assert (sweeps[sweeps["status"] == "ok"]["median_s"] > 0).all()
    assert {"outcome", "err", "err_naive", "ratio"} <= set(conf)
    assert conf["err"].map(lambda v: isinstance(v, float)).all()


def test_fit_exponent_recovers_a_known_slope():
    rng = np.random.default_rng(0)
    lengths = [128, 256, 512, 1024, 2048, 4096]
    df = pd.DataFrame([{"machine": "m", "impl": "x", "device": "cpu", "dtype": "float32",
                        "mask": "none", "H": 8, "B": 1, "D": 64, "status": "ok", "Lq": L,
                        "median_s": 1e-9 * L**2 * np.exp(rng.normal(0, 0.03))}
                       for L in lengths])
    fit = fit_exponent(df).iloc[0]
    assert fit["ci_low"] <= 2.0 <= fit["ci_high"]
    assert abs(fit["exponent"] - 2.0) < 0.1
    assert fit_exponent(df[df["Lq"] <= 256]).empty  # two lengths: no fit


def test_missing_results_path_is_an_error(cli, tmp_path):
    proc = cli("report", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(__import__("reports.screenshot", fromlist=["chromium"]).chromium() is None,
                    reason="no Chromium on this machine")
def test_report_renders_in_headless_chromium(tmp_path):
    from reports.screenshot import screenshot

    html = build_report([str(FIXTURES)], tmp_path / "r.html")
    png = screenshot(html, tmp_path / "r.png", height=3000)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
