"""Facts about this machine and the libraries present, without importing frameworks."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Dict, Iterable, Optional

LIBRARIES = ("mha-suite", "numpy", "torch", "jax", "jaxlib", "pytest-benchmark", "pandas",
             "seaborn", "matplotlib", "threadpoolctl")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def library_versions(names: Iterable[str] = LIBRARIES) -> Dict[str, Optional[str]]:
    """Installed versions (None when absent), read from metadata: nothing is imported."""
    out: Dict[str, Optional[str]] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
