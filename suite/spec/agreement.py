"""The agreement rule: err(impl) <= k * max(err(naive_t), model_t) + atol_t, against the
float64 oracle.

err is the max abs error; naive_t is the plain algorithm computed in dtype t
(``suite.spec.oracle.baselines``), in more than one reduction order, and err(naive_t) is the
largest of their errors: "no worse than k times what the dtype itself allows, whatever
order the sums run in", the rule of the FlashAttention tests, generalised. model_t is the
case's first-order rounding bound (``suite.spec.oracle.first_order``): one rounding of every
stored intermediate, propagated with worst signs. The naive errors alone are one draw of a
lottery where a row holds two nearly tied logits (numerics/large_logits: logits ~3900, the
naive orders sometimes round luckily); model_t is the size of that draw's range, so a
correct implementation does not fail for the seed a case's name hashes to.

A reference may hold NaN where a declared policy says the output is NaN (say, a fully
masked row under the ``nan`` policy): there the implementation must give NaN too.
``may_be_nan`` marks entries where NaN is allowed instead of a value (NaN confined to the
rows that read a NaN key or value); everywhere else NaN or inf is an error.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence, Union

import numpy as np

# Absolute slack per dtype, in units of the reference's magnitude (max(1, max|ref|)):
# a few ulps at 1.0, so a naive error of exactly 0 (tiny problems) does not demand bit-exactness.
ATOL = {"float64": 1e-12, "float32": 4 * 2.0**-23, "float16": 4 * 2.0**-10,
        "bfloat16": 4 * 2.0**-7}
K_FORWARD = 2.0
K_GRAD = 3.0
# The rule as ``Comparison.bound`` applies it, in words the report and the manual show: one
# source, so a change of the rule changes what they say.
RULE_TEXT = "err <= k * max(err(naive_t), model_t) + atol_t"
RULE_K_TEXT = f"k = {K_FORWARD:g}, {K_GRAD:g} for gradients"
RULE_TERMS = ("err is the max abs error against the float64 oracle; naive_t is the plain "
              "algorithm computed in the same dtype t, in several reduction orders (the "
              "largest error counts); model_t is the case's first-order rounding bound in "
              "dtype t (one rounding of every stored intermediate, propagated with worst "
              "signs); atol_t is a few ulps of dtype t at the reference's magnitude")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One comparison's figures; ``passed`` applies the rule."""

    what: str  # "output", "weights", "grad w_q", ...
    err: float
    err_naive: float
    k: float
    atol: float
    nan_error: Optional[str] = None  # NaN where none may be, or a value where NaN is due
    # The first-order rounding bound of the case (suite.spec.oracle.first_order), max over entries.
    err_model: float = 0.0

    @property
    def baseline(self) -> float:
        """What the dtype allows: the larger of the naive errors and the first-order bound."""
        return max(self.err_naive, self.err_model)

    @property
    def bound(self) -> float:
        return self.k * self.baseline + self.atol

    @property
    def ratio(self) -> Optional[float]:
        """err / baseline: how close to the best the dtype allows (1 = as good as naive)."""
        if self.baseline > 0:
            return self.err / self.baseline
        return 0.0 if self.err == 0 else math.inf

    @property
    def passed(self) -> bool:
        return self.nan_error is None and bool(self.err <= self.bound)  # NaN err: a failure

    def describe(self) -> str:
        which = (f"naive err {self.err_naive:.3g}" if self.err_naive >= self.err_model else
                 f"first-order bound {self.err_model:.3g}, naive err {self.err_naive:.3g}")
        figures = (f"{self.what}: err {self.err:.3g} vs bound {self.bound:.3g} "
                   f"(= {self.k:g} x {which} + atol {self.atol:.3g})")
        return f"{self.what}: {self.nan_error}; {figures}" if self.nan_error else figures


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


def _err(got: np.ndarray, ref: np.ndarray, excused: np.ndarray) -> float:
    """Max abs error over the entries not excused (where ref must be NaN or may be)."""
    keep = ~excused
    if not keep.any():
        return 0.0
    return max_abs_err(got[keep], ref[keep])


def compare(what: str, got: np.ndarray, ref: np.ndarray,
            naive_t: Union[np.ndarray, Sequence[np.ndarray]], dtype: str,
            k: float = K_FORWARD, may_be_nan: Optional[np.ndarray] = None,
            model: Optional[np.ndarray] = None) -> Comparison:
    """Compare ``got`` with the oracle's ``ref`` under the rule; ``naive_t`` is one baseline
    or several (reduction orders), the largest error counting; ``model`` is the case's
    first-order rounding bound per entry (``suite.spec.oracle.first_order``), when given."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise AssertionError(f"shape: expected {ref.shape}, got {got.shape}")
    naives = [naive_t] if isinstance(naive_t, np.ndarray) else list(naive_t)
    must_nan = np.isnan(ref)
    may = np.zeros(ref.shape, bool) if may_be_nan is None else np.broadcast_to(may_be_nan, ref.shape)
    excused = must_nan | (may & np.isnan(got))
    nan_error = None
    if (must_nan & ~np.isnan(got)).any():
        n = int((must_nan & ~np.isnan(got)).sum())
        nan_error = f"{n} of {int(must_nan.sum())} entries the declared policy makes NaN are not NaN"
    finite_ref = ref[np.isfinite(ref)]
    scale = max(1.0, float(np.abs(finite_ref).max()) if finite_ref.size else 1.0)
    err_naive = max((_err(np.asarray(n, np.float64), ref, must_nan) for n in naives), default=0.0)
    err_model = 0.0
    if model is not None:
        kept = np.broadcast_to(np.asarray(model, np.float64), ref.shape)[~must_nan]
        err_model = float(np.nan_to_num(kept).max()) if kept.size else 0.0
    return Comparison(what, _err(got, ref, excused), err_naive, k, ATOL[dtype] * scale, nan_error,
                      err_model)
