"""Checking what a plugin's ``fetch`` returned, before it is compared or timed."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

# What a sweep point's "verified" field says was checked.
VERIFIED = "warm-up output: Result.output a float ndarray of shape (B, L, E), all finite"


def check_output(result: Any, shape: Tuple[int, ...], finite: bool = True) -> Optional[str]:
    """None when ``result.output`` is a float NumPy array of ``shape`` (and all finite when
    ``finite``: where the oracle's output is finite); else one line saying what is wrong."""
    output = getattr(result, "output", None)
    if output is None:
        return (f"fetch: expected a suite.plugins.interface.Result with an output array, got "
                f"{type(result).__name__}")
    if not isinstance(output, np.ndarray):
        return f"fetch: expected Result.output a NumPy array, got {type(output).__name__}"
    if output.shape != tuple(shape):
        return f"fetch: expected Result.output of shape {tuple(shape)} (B, L, E), got {output.shape}"
    if not np.issubdtype(output.dtype, np.floating):
        return f"fetch: expected Result.output a float array, got dtype {output.dtype}"
    if finite:
        bad = int(np.size(output) - np.count_nonzero(np.isfinite(output)))
        if bad:
            return f"fetch: expected finite outputs (the oracle's are), got {bad} NaN or inf"
    return None
