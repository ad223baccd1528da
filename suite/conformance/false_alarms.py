"""The agreement rule's false-alarm rate: every agreement case over many seeds on
implementations taken as correct, counting the comparisons the rule fails.

A case's problem comes from its seed (``Case.seed``); here seed ``Case.seed + i`` for
i < ``seeds`` builds the same problem shape with other numbers, so a rule that passes a
correct implementation only for the seed the case's name hashes to shows up as a count.

Each result is judged as ``mha-suite check`` judges it (``suite.conformance.judge.judge``: output and
weights, declared policies), with one shortcut that keeps the count exact: the bound is
k * max(naive errors, first-order bound) + atol and never shrinks with a term, so a
result whose every comparison passes on the first-order bound alone passes the rule; the
naive baselines (the costly part: the sequential order loops in Python) are computed only
where that does not settle it.

    python -m suite.conformance.false_alarms --seeds 200 --impl numpy --impl torch.eager ...
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from suite.conformance.cases import CASES, Case
from suite.conformance.judge import FAILED, Outcome, judge
from suite.plugins.interface import Implementation, Result, call, declared, expressible
from suite.spec import oracle
from suite.spec.agreement import compare

FAMILIES = ("masking", "shapes", "numerics", "variants")  # the agreement cases
REFERENCE = ("numpy", "torch.eager", "torch.sdpa", "jax.jit")  # correct by assumption


@dataclasses.dataclass
class Tally:
    """One implementation on one case over its seeds."""

    impl: str
    family: str
    case: str
    seeds: int = 0
    fails: int = 0
    # max err / bound over the seeds (1 = on the bound); where the naive orders were skipped,
    # against 2 x the first-order bound + atol, an upper bound on the rule's ratio
    worst: float = 0.0
    worst_seed: Optional[int] = None
    failed_seeds: List[int] = dataclasses.field(default_factory=list)


def _fast_pass(impl: Implementation, p, res: Result, ref, model, dtype: str) -> bool:
    """Whether every comparison the judge makes passes on the first-order bound alone (then
    it passes the rule, whose bound is never smaller)."""
    if not np.isfinite(np.asarray(res.output)).all():
        return False  # NaN: the judge decides (a declared policy may allow it)
    ref_out, ref_w = ref
    if not compare("output", res.output, ref_out, [], dtype, model=model[0]).passed:
        return False
    if "weights" in declared(impl, "features"):
        return res.attn_weights is not None and compare(
            "weights", res.attn_weights, ref_w, [], dtype, model=model[1]).passed
    return True


def sweep_case(case: Case, impls: Dict[str, Implementation], seeds: int,
               dtype: str = "float32") -> List[Tally]:
    """Run ``case`` for seeds ``case.seed + i`` (i < seeds) on each implementation (CPU),
    judged as ``mha-suite check`` judges (declared policies included)."""
    tallies = {n: Tally(n, case.family, case.name) for n in impls}
    for i in range(seeds):
        seed = case.seed + i
        base = case.build(seed).validate(case.finite)
        ref, model = oracle.oracle(base), oracle.first_order(base, dtype)
        for n, impl in impls.items():
            p = expressible(impl, base, distinct_kv=case.distinct_kv)
            weights = "weights" in declared(impl, "features")
            res = call(impl, p, "cpu", dtype, need_weights=weights)
            t = tallies[n]
            t.seeds += 1
            if p is base and _fast_pass(impl, p, res, ref, model, dtype):
                c = compare("output", res.output, ref[0], [], dtype, model=model[0])
                used, failed = c.err / c.bound, False
            else:  # the judge: every naive order, the weights, declared policies
                out = judge(impl, Outcome(n, "cpu", dtype, case.family, case.name, seed, "pass"),
                            p, res)
                w = out.worst()
                used = (w.err / w.bound if w and np.isfinite(w.err) else np.inf) \
                    if out.outcome != "deviation" else 0.0
                failed = out.outcome in FAILED
            if used > t.worst:
                t.worst, t.worst_seed = used, seed
            if failed:
                t.fails += 1
                t.failed_seeds.append(seed)
    return list(tallies.values())


def sweep(impls: Dict[str, Implementation], seeds: int, families: Sequence[str] = FAMILIES,
          dtype: str = "float32", match: str = "", log=None) -> List[Tally]:
    """Every case of ``families`` (whose family/name contains ``match``) over ``seeds``, on
    the implementations that declare its features."""
    out: List[Tally] = []
    for case in CASES:
        if case.family not in families or match not in f"{case.family}/{case.name}" \
                or case.judge is not None:  # a case judged otherwise than by the rule
            continue
        feats = case.problem().features()
        runnable = {n: i for n, i in impls.items() if feats <= frozenset(i.features)}
        start = time.perf_counter()
        out += sweep_case(case, runnable, seeds, dtype)
        if log:
            log(f"{case.family}/{case.name}: {len(runnable)} implementations x {seeds} seeds, "
                f"{time.perf_counter() - start:.1f} s")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print each case's fails and worst err/bound; exit 1 when any comparison failed."""
    from suite.plugins.registry import build

    ap = argparse.ArgumentParser(prog="python -m suite.conformance.false_alarms",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--impl", action="append", help=f"default: {', '.join(REFERENCE)}")
    ap.add_argument("--family", action="append", help=f"default: {', '.join(FAMILIES)}")
    ap.add_argument("-k", default="", help="only cases whose family/name contains this")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error(f"--seeds: expected a count >= 1, got {args.seeds}")
    reg = build(entry_points=False)
    impls = {}
    for n in args.impl or REFERENCE:
        entry = reg.entries.get(n)
        if entry is None or entry.impl is None:
            print(f"{n}: unavailable ({entry.error if entry else 'unknown name'})", file=sys.stderr)
            return 2
        impls[n] = entry.impl
    start = time.perf_counter()
    tallies = sweep(impls, args.seeds, args.family or FAMILIES, match=args.k, log=print)
    fails = sum(t.fails for t in tallies)
    for t in sorted(tallies, key=lambda t: -t.worst)[:10]:
        print(f"{t.impl:12s} {t.family}/{t.case}: {t.fails}/{t.seeds} fail, worst err/bound "
              f"{t.worst:.3f} (seed {t.worst_seed})")
    print(f"{fails} fails in {sum(t.seeds for t in tallies)} comparisons "
          f"({len(tallies)} implementation x case pairs, {args.seeds} seeds), "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
