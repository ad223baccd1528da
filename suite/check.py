"""Running one conformance case on one implementation, device and dtype, and classifying it.

Outcomes: pass, fail (the rule was broken), error (the plugin raised),
unsupported (a feature the case needs is not declared), deviation (a declared,
known difference from the spec, observed).
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import List, Optional

import numpy as np

from suite import oracle
from suite.agreement import Comparison, compare
from suite.cases import Case
from suite.outputs import check_output
from suite.plugin import Implementation, Result
from suite.problem import Problem


@dataclasses.dataclass
class Outcome:
    impl: str
    device: str
    dtype: str
    family: str
    case: str
    seed: int
    outcome: str
    comparisons: List[Comparison] = dataclasses.field(default_factory=list)
    reason: Optional[str] = None
    test_id: Optional[str] = None

    def worst(self) -> Optional[Comparison]:
        """The comparison closest to (or furthest past) its bound."""
        def used(c: Comparison) -> float:
            return np.inf if not np.isfinite(c.err) else c.err / c.bound
        return max(self.comparisons, key=used, default=None)

    def record(self) -> dict:
        w = self.worst()
        return {
            "impl": self.impl, "device": self.device, "dtype": self.dtype,
            "family": self.family, "case": self.case, "test_id": self.test_id, "seed": self.seed,
            "outcome": self.outcome,
            "err": _num(w.err) if w else None, "err_naive": _num(w.err_naive) if w else None,
            "bound": _num(w.bound) if w else None, "ratio": _num(w.ratio) if w else None,
            "k": w.k if w else None, "atol": w.atol if w else None, "reason": self.reason,
        }


def _num(x: Optional[float]) -> Optional[float]:
    """JSON has no NaN/inf: write them as strings the report reads back."""
    if x is None:
        return None
    return float(x) if np.isfinite(x) else str(x)


def missing_features(impl: Implementation, p: Problem, extra: frozenset = frozenset()) -> list:
    return sorted((p.features() | extra) - frozenset(getattr(impl, "features", ())))


def call(impl: Implementation, p: Problem, device: str, dtype: str,
         need_weights: bool = False) -> Result:
    state = impl.prepare(p, device, dtype, need_weights=need_weights)
    handle = impl.run(state)
    impl.synchronize(state)
    return impl.fetch(state, handle)


def error_text(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}" \
           f"{where}"


def run_case(impl: Implementation, name: str, device: str, dtype: str, case: Case) -> Outcome:
    """Run ``case`` on ``impl`` and classify the result."""
    out = Outcome(name, device, dtype, case.family, case.name, case.seed, "pass")
    return run_problem(impl, out, case.problem(), case.behaviour)


def run_problem(impl: Implementation, out: Outcome, p: Problem,
                behaviour: Optional[str] = None) -> Outcome:
    """Run problem ``p`` on ``impl``, compare with the oracle and fill in ``out``."""
    device, dtype = out.device, out.dtype
    missing = missing_features(impl, p)
    if missing:
        out.outcome, out.reason = "unsupported", f"needs {', '.join(missing)}"
        return out
    with_weights = "weights" in getattr(impl, "features", ())
    try:
        res = call(impl, p, device, dtype, need_weights=with_weights)
    except Exception as exc:  # a plugin that raises is reported, the run goes on
        out.outcome, out.reason = "error", error_text(exc)
        return out
    invalid = check_output(res, (p.B, p.L, p.E), finite=False)  # the oracle judges values
    if invalid:
        out.outcome, out.reason = "fail", invalid
        return out
    ref_out, ref_w = oracle.oracle(p)
    naive_out, naive_w = oracle.naive(p, dtype)
    try:
        out.comparisons.append(compare("output", res.output, ref_out, naive_out, dtype))
        if with_weights and res.attn_weights is not None:
            out.comparisons.append(compare("weights", res.attn_weights, ref_w, naive_w, dtype))
        elif with_weights:
            raise AssertionError("declares 'weights' but returned none")
    except AssertionError as exc:  # wrong shapes
        out.outcome, out.reason = "fail", str(exc)
        return out
    failed = [c for c in out.comparisons if not c.passed]
    deviation = getattr(impl, "deviations", {}).get(behaviour) if behaviour else None
    if failed and deviation:
        out.outcome = "deviation"
        out.reason = f"declared {behaviour}: {deviation}; {failed[0].describe()}"
    elif failed:
        out.outcome = "fail"
        out.reason = "; ".join(c.describe() for c in failed) + _where(failed[0], res, ref_out)
    elif deviation:
        out.reason = f"declared {behaviour} deviation not observed in this case"
    return out


def _where(c: Comparison, res: Result, ref: np.ndarray) -> str:
    if c.what != "output":
        return ""
    got = np.asarray(res.output, dtype=np.float64)
    if got.shape != ref.shape:
        return ""
    diff = np.where(np.isfinite(got), np.abs(got - ref), np.inf)
    b, l, e = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return f"; worst at (b={b}, l={l}, e={e}): got {got[b, l, e]:.6g}, expected {ref[b, l, e]:.6g}"
