"""The agreement rule: err(impl) <= k * err(naive_t) + atol_t, against the float64 oracle.

err is the max abs error; naive_t is the plain algorithm computed in dtype t
(``suite.oracle.naive``), so the bound is "no worse than k times what the
dtype itself allows", the rule of the FlashAttention tests, generalised.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

# Absolute slack per dtype, in units of the reference's magnitude (max(1, max|ref|)):
# a few ulps at 1.0, so a naive error of exactly 0 (tiny problems) does not demand bit-exactness.
ATOL = {"float64": 1e-12, "float32": 4 * 2.0**-23, "float16": 4 * 2.0**-10,
        "bfloat16": 4 * 2.0**-7}
K_FORWARD = 2.0
K_GRAD = 3.0


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One comparison's figures; ``passed`` applies the rule."""

    what: str  # "output", "weights", "grad w_q", ...
    err: float
    err_naive: float
    k: float
    atol: float

    @property
    def bound(self) -> float:
        return self.k * self.err_naive + self.atol

    @property
    def ratio(self) -> Optional[float]:
        """err / err_naive: how close to the best the dtype allows (1 = as good as naive)."""
        if self.err_naive > 0:
            return self.err / self.err_naive
        return 0.0 if self.err == 0 else math.inf

    @property
    def passed(self) -> bool:
        return bool(self.err <= self.bound)  # NaN err compares False: a failure

    def describe(self) -> str:
        return (f"{self.what}: err {self.err:.3g} vs bound {self.bound:.3g} "
                f"(= {self.k:g} x naive err {self.err_naive:.3g} + atol {self.atol:.3g})")


def max_abs_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Max abs difference; NaN or inf anywhere in ``got`` (where ref is finite) gives NaN."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise AssertionError(f"shape: expected {ref.shape}, got {got.shape}")
    if got.size == 0:
        return 0.0
    if not np.isfinite(got).all():
        return math.nan
    return float(np.abs(got - ref).max())


def compare(what: str, got: np.ndarray, ref: np.ndarray, naive_t: np.ndarray, dtype: str,
            k: float = K_FORWARD) -> Comparison:
    scale = max(1.0, float(np.abs(ref).max()) if ref.size else 1.0)
    return Comparison(what, max_abs_err(got, ref), max_abs_err(naive_t, ref), k,
                      ATOL[dtype] * scale)
