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
from tests.test_report import TWENTY, synthetic_results

FIXTURES = Path(__file__).parent / "fixtures"

pytestmark = pytest.mark.skipif(chromium() is None,
                                reason="no Chromium (Debian: apt-get install chromium)")


def test_report_renders_in_headless_chromium(tmp_path):
    html = build_report([FIXTURES / "vm", FIXTURES / "gpu"], tmp_path / "r.html",
                        baseline_paths=[FIXTURES / "baseline"])
    png = screenshot(html, tmp_path / "r.png", width=1280, height=3000)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (1280, 3000)
    assert len(data) > 100_000  # charts and tables, not a blank page



# Appended to a copy of the page, after the report's own script: the widths as laid out.
MEASURE = """<script>
const out = {page: document.documentElement.scrollWidth, window: window.innerWidth, tables: []};
for (const t of document.querySelectorAll("#conformance table.matrix, #ranking table")) {
  out.tables.push({cls: t.className, width: t.getBoundingClientRect().width,
                   room: t.parentElement.clientWidth, rows: t.rows.length});
}
const pre = document.createElement("pre");
pre.id = "measured";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _dump(html: Path, script: str, width: int, height: int = 2000, fragment: str = "") -> dict:
    """What ``script`` measured in headless Chromium at a ``width`` x ``height`` window, the
    page opened at ``fragment`` (``#anchor``) where one is given."""
    page = html.with_name("measure.html")
    page.write_text(html.read_text(encoding="utf-8").replace("</body>", script + "</body>"),
                    encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}",
                               f"--window-size={width},{height}", "--dump-dom",
                               page.as_uri() + fragment],
                              capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', proc.stdout)
    assert found, f"chromium printed no measurement ({proc.returncode}): {proc.stderr[-300:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.fixture(scope="module")
def twenty_report(tmp_path_factory) -> Path:
    """The report of ``synthetic_results`` (twenty implementations), built once for the
    tests that only read it (about 5 s a build); each test reads its own copy."""
    folder = tmp_path_factory.mktemp("twenty")
    return build_report([synthetic_results(folder / "results")], folder / "r.html")


@pytest.fixture
def twenty_html(twenty_report, tmp_path) -> Path:
    """A copy of the twenty implementations' report in this test's folder (the report is
    one self-contained file)."""
    import shutil

    return Path(shutil.copy(twenty_report, tmp_path / "r.html"))


def _layout(html: Path, width: int) -> dict:
    """The page's and the tables' widths in headless Chromium at a ``width``-px window."""
    return _dump(html, MEASURE, width)


def test_twenty_implementations_fit_a_1280px_window(twenty_html, tmp_path):
    html = twenty_html
    layout = _layout(html, 1280)
    assert layout["window"] == 1280
    assert layout["page"] <= 1280, "the page scrolls sideways"
    by_class = {t["cls"].split()[-1]: t for t in layout["tables"]}
    assert set(by_class) >= {"matrix", "wrap", "rank"}
    assert by_class["matrix"]["rows"] >= len(TWENTY) + 1
    for t in layout["tables"]:
        assert t["width"] <= t["room"] + 0.5, t  # no table wider than its column
    png = screenshot(html, tmp_path / "r.png", width=1280, height=3000)
    assert struct.unpack(">II", png.read_bytes()[16:24]) == (1280, 3000)


# The charts as laid out: each image's drawn and natural width, and the names it declares.
CHARTS = """<script>
const out = {charts: []};
for (const img of document.querySelectorAll("img.chart")) {
  const sec = img.closest("section");
  out.charts.push({section: sec ? sec.id : null, alt: img.alt,
                   labels: JSON.parse(img.dataset.labels || "[]"),
                   shown: img.getBoundingClientRect().width, natural: img.naturalWidth});
}
const pre = document.createElement("pre");
pre.id = "measured";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def test_every_chart_names_every_implementation_at_1280px(twenty_html):
    html = twenty_html
    charts = _dump(html, CHARTS, 1280)["charts"]
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
OPENED = """<script>
const el = document.getElementById(decodeURIComponent(location.hash.slice(1)));
const wrap = document.querySelector("#conformance .matrix-wrap");
const out = {opened: !!(el && el.open), outer: !!(el && el.closest("details.per-impl").open),
             others: document.querySelectorAll("details.per-impl details[open]").length,
             matrix: wrap.getBoundingClientRect().height, window: window.innerHeight};
const pre = document.createElement("pre");
pre.id = "measured";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def test_a_link_from_the_matrix_opens_that_implementations_cases(twenty_html):
    from bs4 import BeautifulSoup

    html = twenty_html
    soup = BeautifulSoup(html.read_text(encoding="utf-8"), "html.parser")
    link = soup.find("table", class_="matrix").find("a")["href"]
    out = _dump(html, OPENED, 1280, height=900, fragment=link)
    assert out["opened"] and out["outer"] and out["others"] == 1, out
    assert out["matrix"] <= 0.85 * out["window"] + 1, out
