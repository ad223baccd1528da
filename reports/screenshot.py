"""A screenshot of a report in headless Chromium (Debian's chromium), for docs and tests."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium() -> Optional[str]:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(html: Path, png: Path, width: int = 1280, height: int = 6000,
               timeout_s: float = 120) -> Path:
    """Render ``html`` (a local file) to ``png``; raises RuntimeError without a browser."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("no Chromium found (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}",
                        f"--window-size={width},{height}", f"--screenshot={Path(png).resolve()}",
                        Path(html).resolve().as_uri()],
                       check=True, capture_output=True, timeout=timeout_s)
    return Path(png)
