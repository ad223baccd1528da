"""What the inference runtimes do beside computing, kept out of the suite's processes."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def no_usage_events() -> Iterator[None]:
    """``import openvino`` and ``ov.convert_model`` send a usage event unless the user opted
    out, from a process they fork; in the suite's process, where JAX's threads run, JAX warns
    that the fork may deadlock (and a one-line CLI error gained that warning's two lines:
    openvino 2026.4.1). The converter skips its events in CI (``disable_in_ci``, read from
    ``CI``), the kind of run the suite's are; what it imports and converts is unchanged."""
    if os.environ.get("CI", "").lower() == "true":
        yield
        return
    old = os.environ.get("CI")
    os.environ["CI"] = "true"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CI", None)
        else:
            os.environ["CI"] = old
