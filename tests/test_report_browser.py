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



# Appended to a copy of the page (the report itself has no script): the widths as laid out.
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


def _layout(html: Path, width: int) -> dict:
    """The page's and the tables' widths in headless Chromium at a ``width``-px window."""
    page = html.with_name("measure.html")
    page.write_text(html.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"),
                    encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}",
                               f"--window-size={width},2000", "--dump-dom", page.as_uri()],
                              capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', proc.stdout)
    assert found, f"chromium printed no measurement ({proc.returncode}): {proc.stderr[-300:]}"
    return json.loads(found.group(1).replace("&quot;", '"'))


def test_twenty_implementations_fit_a_1280px_window(tmp_path):
    html = build_report([synthetic_results(tmp_path / "results")], tmp_path / "r.html")
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
