"""The dropout family's spread test calibrated on the NumPy reference: for each statistical
case and each form (cross, and square for a module with one input), ``runs`` repetitions of
the case's 200 training-mode calls; per repetition the median variance ratio and the band
``spread_band`` gives it. Prints the ratio's spread over the runs, the band's half-width and
how many runs fell outside the band (a false alarm of the reference).

    python -m suite.conformance.dropout_spread --runs 60 [-k softcap]

The figures in docs/verdicts/dropout.md come from this command.
"""

from __future__ import annotations

import argparse
import sys
from typing import Iterator, List, Optional, Sequence

import numpy as np


def rows(runs: int, select: str = "") -> Iterator[str]:
    """One line per case and form."""
    from suite.conformance import catalog
    from suite.conformance.families import dropout
    from suite.conformance.judge import Outcome
    from suite.plugins import registry

    NumpyMHA = type(registry.build(builtins=True, entry_points=False, env={})
                    .entries["numpy"].impl)  # the reference, through the registry
    Square = type("Square", (NumpyMHA,), {"name": "numpy[square]", "kv_source": "self"})

    for case in catalog.of_family("dropout"):
        if case.judge is None or select not in case.name:
            continue
        for form, impl in (("cross", NumpyMHA()), ("square", Square())):
            p = case.problem_for(impl)
            var = dropout.dropout_variance(p)
            live = dropout.live_elements(var)
            ratios: List[float] = []
            halves: List[float] = []
            outside = 0
            for _ in range(runs):
                out = Outcome(impl.name, "cpu", "float32", "dropout", case.name, case.seed,
                              "pass")
                _, x = dropout._draws(impl, out, p)
                ratio = dropout.spread_ratio(x, var, live)
                low, high = dropout.spread_band(x, var, live)
                ratios.append(ratio)
                halves.append(high - 1.0)
                outside += not low <= ratio <= high
            r = np.array(ratios)
            yield (f"{case.name:20s} {form:6s} ratio {r.min():.3f}-{r.max():.3f} "
                   f"(spread {100 * r.std(ddof=1 if runs > 1 else 0):.1f} %), half-width "
                   f"{min(halves):.3f}-{max(halves):.3f}, outside {outside} of {runs}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m suite.conformance.dropout_spread",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60, help="repetitions of each case and form")
    ap.add_argument("-k", default="", metavar="TEXT", help="only the cases whose name has TEXT")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs: expected a positive count, got {args.runs}")
    bad = 0
    for line in rows(args.runs, args.k):
        print(line, flush=True)
        bad += not line.endswith(f"outside 0 of {args.runs}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
