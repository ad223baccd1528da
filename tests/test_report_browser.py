"""The report opened in a real headless browser (Debian's chromium); skipped without one."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from reports.build import build_report
from reports.screenshot import FLAGS, chromium, screenshot
from tests.test_report import TWENTY, full_report, synthetic_results, twenty_report_path

FIXTURES = Path(__file__).parent / "fixtures"

pytestmark = pytest.mark.skipif(chromium() is None,
                                reason="no Chromium (Debian: apt-get install chromium)")


def test_report_renders_in_headless_chromium(tmp_path_factory, tmp_path):
    # the report of test_report.py's ``full`` (the vm, gpu-box and laptop fixtures against
    # the baseline), built once for both modules
    html = full_report(tmp_path_factory)
    png = screenshot(html, tmp_path / "r.png", width=1280, height=3000)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (1280, 3000)
    assert len(data) > 100_000  # charts and tables, not a blank page


# Measurements: each the body of a script appended to a copy of the page, after the report's
# own script, that sets ``out`` (see _dump). The widths as laid out:
MEASURE = """
const out = {page: document.documentElement.scrollWidth, window: window.innerWidth, tables: []};
for (const t of document.querySelectorAll("#conformance table.matrix, #ranking table")) {
  out.tables.push({cls: t.className, width: t.getBoundingClientRect().width,
                   room: t.parentElement.clientWidth, rows: t.rows.length});
}"""
# The charts as laid out: each image's drawn and natural width, and the names it declares.
CHARTS = """
const out = {charts: []};
for (const img of document.querySelectorAll("img.chart")) {
  const sec = img.closest("section");
  out.charts.push({section: sec ? sec.id : null, alt: img.alt,
                   labels: JSON.parse(img.dataset.labels || "[]"),
                   shown: img.getBoundingClientRect().width, natural: img.naturalWidth});
}"""


def _dump(html: Path, scripts: dict, width: int, height: int = 2000, fragment: str = "") -> dict:
    """{name: what its script (``scripts``: {name: script}) measured} in one headless
    Chromium at a ``width`` x ``height`` window, the page opened at ``fragment``
    (``#anchor``) where one is given: several measurements of one page share a browser."""
    tail = "".join(f"""<script>{{{script}
const pre = document.createElement("pre");
pre.id = "measured-{name}";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
}}</script>""" for name, script in scripts.items())
    page = html.with_name("measure.html")
    page.write_text(html.read_text(encoding="utf-8").replace("</body>", tail + "</body>"),
                    encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}",
                               f"--window-size={width},{height}", "--dump-dom",
                               page.as_uri() + fragment],
                              capture_output=True, text=True, timeout=120)
    out = {}
    for name in scripts:
        found = re.search(rf'<pre id="measured-{re.escape(name)}">(.*?)</pre>', proc.stdout)
        assert found, (f"chromium printed no {name} measurement ({proc.returncode}): "
                       f"{proc.stderr[-300:]}")
        out[name] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return out


@pytest.fixture(scope="module")
def twenty_report(tmp_path_factory) -> Path:
    """The report of ``synthetic_results`` (twenty implementations), built once for the
    tests of both modules that only read it (10-20 s a build); each test reads its own
    copy."""
    return twenty_report_path(tmp_path_factory)


@pytest.fixture
def twenty_html(twenty_report, tmp_path) -> Path:
    """A copy of the twenty implementations' report in this test's folder (the report is
    one self-contained file)."""
    import shutil

    return Path(shutil.copy(twenty_report, tmp_path / "r.html"))


def _layout(html: Path, width: int) -> dict:
    """The page's and the tables' widths in headless Chromium at a ``width``-px window."""
    return _dump(html, {"layout": MEASURE}, width)["layout"]


@pytest.fixture(scope="module")
def twenty_at_1280(twenty_report, tmp_path_factory) -> dict:
    """The twenty implementations' report measured at a 1280-px window, its layout
    (``MEASURE``) and its charts (``CHARTS``) in one Chromium, read by the tests below."""
    import shutil

    html = Path(shutil.copy(twenty_report, tmp_path_factory.mktemp("measured") / "r.html"))
    return _dump(html, {"layout": MEASURE, "charts": CHARTS}, 1280)


def test_twenty_implementations_fit_a_1280px_window(twenty_at_1280, twenty_html, tmp_path):
    html = twenty_html
    layout = twenty_at_1280["layout"]
    assert layout["window"] == 1280
    assert layout["page"] <= 1280, "the page scrolls sideways"
    by_class = {t["cls"].split()[-1]: t for t in layout["tables"]}
    assert set(by_class) >= {"matrix", "wrap", "rank"}
    assert by_class["matrix"]["rows"] >= len(TWENTY) + 1
    for t in layout["tables"]:
        assert t["width"] <= t["room"] + 0.5, t  # no table wider than its column
    png = screenshot(html, tmp_path / "r.png", width=1280, height=3000)
    assert struct.unpack(">II", png.read_bytes()[16:24]) == (1280, 3000)


def test_every_chart_names_every_implementation_at_1280px(twenty_at_1280):
    charts = twenty_at_1280["charts"]["charts"]
    by_section = {}
    for c in charts:
        by_section.setdefault(c["section"], []).append(c)
    assert {s: len(v) for s, v in by_section.items()} == {
        "scaling": 1, "heads": 1, "throughput": 1, "memory": 1}
    names = sorted(n for n, _ in TWENTY)  # every implementation has points in every chart
    for c in charts:
        assert sorted(c["labels"]) == names, (c["section"], set(names) - set(c["labels"]))
        assert all(n in c["alt"] for n in names)  # and says so to a screen reader
        # drawn at (nearly) its own size: a 7.5 pt label stays 10 px tall, not shrunk
        assert c["natural"] > 0 and c["shown"] >= 0.95 * c["natural"], c


# The main job's sixteen case families, as the conformance matrix's columns.
MAIN_JOB_FAMILIES = ["contracts", "decode", "generation", "gradients", "hypothesis", "lanes",
                     "layouts", "mask_forms", "masking", "numerics", "properties", "shapes",
                     "special_values", "tiles", "variants", "wrapper"]


def test_a_matrix_of_the_main_jobs_sixteen_families_fits_a_1280px_window(tmp_path):
    # #42 item 10: special_values, tiles and wrapper were cut off past the page's edge
    results = synthetic_results(tmp_path / "results")
    conf = json.loads((results / "conformance-20.json").read_text())
    for i, r in enumerate(conf["results"]):  # every family with several outcomes in a cell
        r["family"] = MAIN_JOB_FAMILIES[i % len(MAIN_JOB_FAMILIES)]
        if r["outcome"] == "pass" and i % 5 == 1:
            r.update(outcome="known_failure", reason="planted: a known failure")
        elif r["outcome"] == "pass" and i % 5 == 2:
            r.update(outcome="unsupported", reason="planted: needs a feature")
    (results / "conformance-20.json").write_text(json.dumps(conf))
    html = build_report([results], tmp_path / "r.html")
    layout = _layout(html, 1280)
    assert layout["page"] <= 1280, "the page scrolls sideways"
    matrix = next(t for t in layout["tables"] if "matrix" in t["cls"])
    assert matrix["width"] <= matrix["room"] + 0.5, matrix  # every column on the page


# Where a link into the conformance details lands: the implementation's case list opened,
# and the list around it, nothing else; the matrix inside one window's height.
OPENED = """
const el = document.getElementById(decodeURIComponent(location.hash.slice(1)));
const wrap = document.querySelector("#conformance .matrix-wrap");
const out = {opened: !!(el && el.open), outer: !!(el && el.closest("details.per-impl").open),
             others: document.querySelectorAll("details.per-impl details[open]").length,
             matrix: wrap.getBoundingClientRect().height, window: window.innerHeight};"""


def test_a_link_from_the_matrix_opens_that_implementations_cases(twenty_html):
    from bs4 import BeautifulSoup

    html = twenty_html
    soup = BeautifulSoup(html.read_text(encoding="utf-8"), "html.parser")
    link = soup.find("table", class_="matrix").find("a")["href"]
    out = _dump(html, {"opened": OPENED}, 1280, height=900, fragment=link)["opened"]
    assert out["opened"] and out["outer"] and out["others"] == 1, out
    assert out["matrix"] <= 0.85 * out["window"] + 1, out
