"""Facts about this machine and the libraries present, without importing frameworks."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Dict, Iterable, Optional

# Recorded in every results file (``machine_info["mha_suite"]["libraries"]``): the frameworks
# and runtimes the built-ins run (an exported graph's record names torch as its framework;
# the runtime that ran it, onnxruntime, OpenVINO or ExecuTorch, is read from here), and
# the tools that shape a run.
LIBRARIES = ("mha-suite", "numpy", "torch", "jax", "jaxlib", "transformers", "keras", "flax",
             "triton", "onnx", "onnxruntime", "onnxscript", "openvino", "executorch",
             "pytest-benchmark", "pandas", "seaborn", "matplotlib", "threadpoolctl")


# A framework name (``Implementation.framework``) -> the distribution that installs it, where
# the two differ; any other name is looked up as a distribution, then as an import name.
DISTRIBUTIONS = {"hf": "transformers", "transformers": "transformers", "timm": "timm",
                 "keras": "keras", "flax": "flax", "torch": "torch", "jax": "jax",
                 "numpy": "numpy", "triton": "triton", "xformers": "xformers",
                 "flash_attn": "flash-attn", "sklearn": "scikit-learn"}


def distribution_of(framework: str) -> Optional[str]:
    """The installed distribution ``framework`` names (``hf`` -> ``transformers``; an import
    name maps through the installed packages' top-level names), None when none is installed."""
    name = DISTRIBUTIONS.get(framework, framework)
    try:
        metadata.version(name)
        return name
    except (metadata.PackageNotFoundError, ValueError):
        pass
    found = metadata.packages_distributions().get(framework.split(".")[0]) or []
    return found[0] if found else None


def framework_version(framework: str) -> Optional[str]:
    """The installed version of the library ``framework`` names (the distribution's
    metadata: nothing is imported), None when it is not installed as a distribution."""
    dist = distribution_of(framework) if framework else None
    return metadata.version(dist) if dist else None


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
