"""A screenshot of a report in headless Chromium (Debian's chromium), for docs and tests.

``python -m reports.screenshot report.html docs/report.png`` does the same from a shell.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Union

# No network, no first-run UI, no profile shared with a desktop session.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> Optional[str]:
    """The path of a Chromium-family browser, or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(html: Union[str, Path], png: Union[str, Path], width: int = 1280,
               height: int = 4000, timeout_s: float = 120) -> Path:
    """Render the local file ``html`` to ``png`` (width x height CSS pixels); return ``png``.

    Raises RuntimeError when no browser is installed or the browser fails.
    """
    browser = chromium()
    if browser is None:
        raise RuntimeError("no Chromium found (Debian: apt-get install chromium)")
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
             f"--screenshot={png}", Path(html).resolve().as_uri()],
            capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-500:]}")
    return png


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m reports.screenshot REPORT.html OUT.png")
    print(screenshot(sys.argv[1], sys.argv[2]))
