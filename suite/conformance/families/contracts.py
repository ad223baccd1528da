"""The ``contracts`` family: options that must change the answer, checked by running both sides.

An error bound cannot see an option that is accepted and ignored: flax 0.8.3-0.8.4 took
``force_fp32_for_softmax=True`` and did nothing with it, and the outputs with and without it
were bit-identical and both inside the bfloat16 bound. A plugin states what each of its
options must change (``suite.plugins.declarations.Contract``); this family runs the plugin and the other
side (another of its names, or itself with the option set otherwise) on the same
``N_PROBLEMS`` seeded problems and judges the relation:

- ``differs``: the outputs differ on every problem and each side passes the agreement rule on
  its own problem (a scaling option: the scaled side matches the oracle at the problem's
  scale, the other at the scale the option gives). A bit-identical problem fails.
- ``closer_to_oracle``: this side's error against the float64 oracle (root mean square over
  the output's entries: an upcast moves every entry a little, where the max is set by the
  output's own rounding) is smaller than the other side's. Per problem the sign of the
  difference is counted (bit-identical errors are ties, left out); a one-sided sign test
  passes at p <= ``ALPHA``, fails at p <= ``ALPHA`` the other way, and otherwise says it
  cannot tell (outcome ``unsupported``, never a pass). Bit-identical outputs on every
  problem fail: the option did nothing.

- ``agrees``: two paths of one module (eager vs sdpa vs flex; fused vs unfused; compiled vs
  eager; with and without weights) give the same answer: on every problem
  max |a - b| <= bound_a + bound_b, each side's bound of the agreement rule on that problem
  (two answers each within the rule of one function can differ by no more). Whether either
  matches the oracle is the other families' verdict: a module that computes something the
  problem cannot express (a soft-cap always on) fails them on both paths, and here only
  where one path drops it.

Problems: self-attention (query = key = value, so every kind of plugin takes them), B = 2,
L = S = 32, E = 32, H = 4 (D = 8), with projection biases; odd-numbered ones are causal
(top left, no row without a key: the masking family's policies do not enter). Each is built
from a seed of the contract's name and its index, so a failing id replays the same arrays.
For ``agrees`` (``agreement_problems``: ``N_AGREES`` of them) the first four are plain; the
next four carry every score variant both sides declare (``AGREEMENT_VARIANTS``); where both
declare ``gqa`` the third and fourth of each four have K = 2 key/value heads.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import zlib
from typing import Any, List, Optional, Tuple

import numpy as np

from suite.conformance.families.declare import Case
from suite.conformance.judge import (
    FAILED,
    Outcome,
    attempt,
    expressible,
    implementation_isa,
    judge,
)
from suite.conformance.sample import compiles_per_shape
from suite.plugins.declarations import Contract
from suite.plugins.interface import Implementation, Unsupported, declared
from suite.spec import oracle
from suite.spec.agreement import Comparison
from suite.spec.problem import Mask, Problem, make_problem

FAMILY = "contracts"
N_PROBLEMS = 16
# ``agrees`` needs no statistics (each problem is judged alone): half as many problems.
N_AGREES = 8
ALPHA = 0.01
# A sampled run (the main job's --sample, CI's --cover) gives an ``agrees`` contract with a
# per-shape compiler on either side (a compile a problem and side: 10-25 s each with an empty
# inductor cache; these contracts were 29 % of CI's covering check, docs/measured/profile.md)
# two of its problems: the fold-over pair of causal x gqa x variants, everything off (0) and
# everything on (7), so each factor runs at both of its levels and all three meet; pairs of
# factors at mixed levels (causal without the variants, say) are the whole matrix's, which
# runs all eight.
SAMPLED_PROBLEMS = (0, 7)
SAMPLED = False  # set by the conformance session under --sample or --cover
B, L, E, H = 2, 32, 32, 4


def problems(contract_name: str, n: int = N_PROBLEMS) -> List[Problem]:
    """The contract's problems (see the module docstring)."""
    out = []
    for i in range(n):
        seed = zlib.crc32(f"{FAMILY}/{contract_name}/{i}".encode())
        out.append(make_problem(seed, B, L, L, E, H, self_attention=True,
                                mask=Mask(causal=bool(i % 2))).validate())
    return out


# The variants an ``agrees`` problem carries when both sides declare them: a cap that bends
# (cap 4 on logits up to ~10: inputs x3), ALiBi by distance, a T5 table (16 buckets, max
# distance 10, bidirectional), sinks ~ N(0, 2^2), value heads twice as wide.
AGREEMENT_VARIANTS = ("softcap", "alibi", "rel_bias", "sinks", "value_width")


def agreement_problems(contract_name: str, shared: frozenset, n: int = N_AGREES
                       ) -> List[Problem]:
    """The ``agrees`` relation's problems for two sides declaring ``shared`` features (see
    the module docstring)."""
    from suite.spec.variants import Alibi, RelBias, alibi_slopes

    variants = [v for v in AGREEMENT_VARIANTS if v in shared]
    out = []
    for i in range(n):
        seed = zlib.crc32(f"{FAMILY}/{contract_name}/{i}".encode())
        rich = i >= 4 and bool(variants)
        K = H // 2 if "gqa" in shared and i % 4 >= 2 else None
        p = make_problem(seed, B, L, L, E, H, K, self_attention=True,
                         mask=Mask(causal=bool(i % 2)), input_scale=3.0 if rich else 1.0,
                         value_head_dim=2 * (E // H) if rich and "value_width" in variants
                         else None)
        if rich:
            rng = np.random.default_rng(seed + 1)
            p = dataclasses.replace(
                p, softcap=4.0 if "softcap" in variants else None,
                alibi=Alibi(alibi_slopes(H), "distance") if "alibi" in variants else None,
                rel_bias=(RelBias(1.5 * rng.standard_normal((H, 16)), "t5", True, 10)
                          if "rel_bias" in variants else None),
                sinks=2.0 * rng.standard_normal(H) if "sinks" in variants else None)
        out.append(p.validate())
    return out


def _described(p: Problem, i: int) -> str:
    parts = ["causal" if p.mask.causal else "no mask"] + ([f"K = {p.K}"] if p.K != p.H else [])
    return f"problem {i} ({', '.join(parts + sorted(p.features() & set(AGREEMENT_VARIANTS)))})"


def sign_test(wins: int, losses: int) -> Tuple[float, float]:
    """One-sided sign-test p-values (ties left out): P(X >= wins) and P(X >= losses) for
    X ~ Binomial(wins + losses, 1/2)."""
    n = wins + losses

    def tail(k: int) -> float:
        return sum(math.comb(n, j) for j in range(k, n + 1)) / 2.0 ** n if n else 1.0

    return tail(wins), tail(losses)


def rms_error(got: np.ndarray, ref: np.ndarray) -> float:
    """Root mean square of got - ref (inf where got is not finite)."""
    got = np.asarray(got, np.float64)
    if not np.isfinite(got).all():
        return math.inf
    return float(np.sqrt(np.mean((got - np.asarray(ref, np.float64)) ** 2)))


def other_side(impl: Implementation, contract: Contract) -> Implementation:
    """The other side of ``contract``: ``impl``'s class with the option's attributes set
    otherwise, or the plugin named so: a class of the module of ``impl``'s class or of one
    of its bases, else this process's registry."""
    if not isinstance(contract.against, str):
        cls = type(impl)
        variant = type(f"{cls.__name__}_against", (cls,), {
            **dict(contract.against), "name": f"{cls.name}({contract.against_text()})",
            "contracts": (), "__module__": cls.__module__})
        return variant()
    name = contract.against
    # the module of the plugin's class, then those of its bases (a subclass elsewhere)
    for module in dict.fromkeys(sys.modules.get(c.__module__) for c in type(impl).__mro__):
        for obj in vars(module).values() if module else ():
            if isinstance(obj, type) and getattr(obj, "name", None) == name \
                    and hasattr(obj, "prepare"):
                return obj()
    from suite.plugins.registry import shared

    entry = shared().entries.get(name)
    if entry is None or not entry.available:
        raise LookupError(f"contract {contract.name!r}: no available implementation named "
                          f"{name!r}" + (f" ({entry.error})" if entry is not None else ""))
    return entry.impl


def _run(impl: Implementation, out: Outcome, p: Problem
         ) -> Tuple[Optional[np.ndarray], Outcome]:
    """``impl`` on ``p``: its output and its verdict under the agreement rule (and its
    declared policies); no output when it could not be judged."""
    with_weights = "weights" in declared(impl, "features")
    results, refused = attempt(impl, [p], out.device, out.dtype, need_weights=with_weights)
    if refused:
        return None, out.classify(*refused)
    return np.asarray(results[0].output, np.float64), judge(impl, out, p, results[0])


def _outcome_like(out: Outcome, name: str) -> Outcome:
    return Outcome(name, out.device, out.dtype, out.family, out.case, out.seed, "pass")


def judge_contract(contract: Contract, impl: Implementation, out: Outcome,
                   problem: Optional[Problem] = None) -> Outcome:
    """Run both sides of ``contract`` on its problems and classify ``out``."""
    if contract.dtypes is not None and out.dtype not in contract.dtypes:
        return out.classify("unsupported", f"contract {contract.name} holds in "
                                           f"{', '.join(sorted(contract.dtypes))}")
    out.isa = isa = implementation_isa(impl, out.device)
    if not contract.where.holds(out.device, isa):
        return out.classify("unsupported", f"contract {contract.name} holds where "
                                           f"{contract.where.text()}")
    try:
        other = other_side(impl, contract)
    except Exception as exc:  # an option the library refuses, or no such name
        return out.classify("error", f"the other side ({contract.against_text()}): "
                                     f"{type(exc).__name__}: {exc}")
    if out.dtype not in other.dtypes(out.device):
        return out.classify("unsupported", f"the other side ({contract.against_text()}) "
                                           f"does not run {out.dtype} on {out.device}")
    this_name = declared(impl, "name") or type(impl).__name__
    if contract.relation == "agrees":
        return _judge_agrees(contract, impl, other, out, this_name)
    identical, wins, losses, errs, broken = 0, 0, 0, [], None
    for i, base in enumerate(problems(contract.name)):
        base = expressible(other, expressible(impl, base))
        mine = base if contract.scale is None else dataclasses.replace(
            base, scale=float(contract.scale(base)))
        sides = []
        for side, p, name in ((impl, mine, this_name), (other, base, contract.against_text())):
            got, verdict = _run(side, _outcome_like(out, name), p)
            said = (f"{name} on problem {i} ({'causal' if i % 2 else 'no mask'}): "
                    f"{verdict.outcome}: {verdict.reason}")
            if got is None:  # unsupported, an error, or a result of the wrong kind
                return out.classify(verdict.outcome, said)
            if verdict.outcome in FAILED and broken is None:  # the first side off the rule
                broken = (verdict.outcome, said)
            if side is impl:
                out.comparisons = max(out.comparisons, verdict.comparisons,
                                      key=lambda cs: max((c.ratio or 0 for c in cs), default=0))
            sides.append((got, oracle.oracle(p)[0]))
        (a, ref_a), (b, ref_b) = sides
        if np.array_equal(a, b, equal_nan=True):
            identical += 1
            continue
        ea, eb = rms_error(a, ref_a), rms_error(b, ref_b)
        errs.append((ea, eb))
        wins += ea < eb
        losses += ea > eb
    n = N_PROBLEMS
    said = f"{this_name} vs {contract.against_text()} ({contract.reason})"
    if identical == n:
        return out.classify("fail", f"{contract.relation}: bit-identical outputs on all {n} "
                                    f"problems: the option changes nothing; {said}"
                            + (f"; {broken[1]}" if broken else ""))
    if broken:
        return out.classify(broken[0], f"{broken[1]}; {said}")
    if contract.relation == "differs":
        if identical:
            return out.classify("fail", f"differs: bit-identical outputs on {identical} of {n} "
                                        f"problems; {said}")
        return out.classify("pass", f"differs: the outputs differ on all {n} problems and "
                                    f"each side passes the agreement rule; {said}")
    p_win, p_loss = sign_test(wins, losses)
    ties = n - wins - losses
    med = np.median(np.array(errs), axis=0) if errs else (math.nan, math.nan)
    counts = (f"smaller rms error on {wins} of {n} problems, larger on {losses}, {ties} tied "
              f"({identical} bit-identical); median rms error {med[0]:.3g} vs {med[1]:.3g}")
    if p_win <= ALPHA:
        return out.classify("pass", f"closer_to_oracle: {counts}; one-sided sign test "
                                    f"p = {p_win:.2g} <= {ALPHA}; {said}")
    if p_loss <= ALPHA:
        return out.classify("fail", f"closer_to_oracle: the wrong sign: {counts}; sign test "
                                    f"p = {p_loss:.2g} <= {ALPHA} for farther; {said}")
    return out.classify("unsupported", f"cannot tell: {counts}; sign test p = {p_win:.2g} > "
                                       f"{ALPHA}; {said}")


def _output(verdict: Outcome) -> Optional[Comparison]:
    return next((c for c in verdict.comparisons if c.what == "output"), None)


def _judge_agrees(contract: Contract, impl: Implementation, other: Implementation,
                  out: Outcome, this_name: str) -> Outcome:
    """The ``agrees`` relation: every problem's two outputs within bound_a + bound_b."""
    shared = frozenset(declared(impl, "features") or ()) & frozenset(
        declared(other, "features") or ())
    other_name = declared(other, "name") or contract.against_text()
    said = f"{this_name} vs {other_name} ({contract.reason})"
    worst: Optional[Tuple[float, Comparison, str]] = None
    carried, skipped = set(), []
    everything = agreement_problems(contract.name, shared)
    half = SAMPLED and any(compiles_per_shape(s, out.device) for s in (impl, other))
    chosen = SAMPLED_PROBLEMS if half else range(len(everything))
    for i in chosen:
        base = everything[i]
        try:
            p = expressible(other, expressible(impl, base))
        except Unsupported as exc:
            skipped.append(f"{_described(base, i)}: {exc}")
            continue
        sides = []
        for side, name in ((impl, this_name), (other, other_name)):
            got, verdict = _run(side, _outcome_like(out, name), p)
            if got is None and verdict.outcome == "unsupported":  # a problem it cannot take
                skipped.append(f"{name} on {_described(p, i)}: {verdict.reason}")
                break
            if got is None:  # an error, or a result of the wrong kind
                return out.classify(verdict.outcome, f"{name} on {_described(p, i)}: "
                                                     f"{verdict.outcome}: {verdict.reason}")
            mine = _output(verdict)
            if mine is None:
                return out.classify("error", f"{name} on {_described(p, i)}: no output "
                                             f"comparison ({verdict.reason})")
            sides.append((got, mine))
        if len(sides) < 2:
            continue
        carried |= p.features() & set(AGREEMENT_VARIANTS)
        (a, ca), (b, cb) = sides
        same_nan = np.isnan(a) == np.isnan(b)
        gap = (math.nan if not same_nan.all() else
               float(np.nan_to_num(np.abs(a - b), nan=0.0).max(initial=0.0)))
        # bound_a + bound_b as one comparison (both sides' k is the forward rule's)
        pair = Comparison(f"output vs {other_name}", gap,
                          ca.baseline + cb.baseline, ca.k, ca.atol + cb.atol)
        where = (f"{_described(p, i)}: max |a - b| {gap:.3g} vs bound {pair.bound:.3g} "
                 f"(= {this_name}'s {ca.bound:.3g} + the other's {cb.bound:.3g}); "
                 f"against the oracle: {this_name} err {ca.err:.3g}, "
                 f"{other_name} err {cb.err:.3g}")
        if not pair.passed:
            out.comparisons = [pair]
            what = ("NaN in different entries" if math.isnan(gap) else "the paths disagree")
            return out.classify("fail", f"agrees: {what} on {where}; {said}")
        ratio = gap / pair.bound if pair.bound > 0 else 0.0
        if worst is None or ratio > worst[0]:
            worst = (ratio, pair, where)
    if worst is None:
        return out.classify("unsupported", f"agrees: no problem both sides run ("
                                           f"{'; '.join(skipped[:3])}); {said}")
    out.comparisons = [worst[1]]
    ran = len(chosen) - len(skipped)
    left = (f"; {len(skipped)} left out as one side cannot take them (first: {skipped[0]})"
            if skipped else "")
    left += (f"; a sampled run with a per-shape compiler: problems "
             f"{', '.join(map(str, SAMPLED_PROBLEMS))} of {len(everything)}" if half else "")
    return out.classify("pass", f"agrees: within the bound on all {ran} problems both run "
                                f"(variants carried: {', '.join(sorted(carried)) or 'none'}); "
                                f"nearest its bound on {worst[2]}{left}; {said}")


class ContractCase(Case):
    """One contract of one plugin as a case of the ``contracts`` family (its first problem
    stands for its inputs; the judge builds them all)."""


def case(contract: Contract) -> ContractCase:
    def build(seed: int, name: str = contract.name) -> Problem:
        return problems(name, 1)[0]

    def run(impl: Implementation, out: Outcome, p: Problem) -> Outcome:
        return judge_contract(contract, impl, out, p)

    return ContractCase(FAMILY, contract.name, build, contract.reason, judge=run)


def cases_of(impl: Any) -> Tuple[ContractCase, ...]:
    """The ``contracts`` family's cases of ``impl``: one per declared contract."""
    return tuple(case(c) for c in declared(impl, "contracts"))
