"""The report opened in a real headless browser (Debian's chromium); skipped without one."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from reports.build import build_report
from reports.screenshot import chromium, screenshot

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

