"""The ``contracts`` family: options that must change the answer, checked by running both sides.

An error bound cannot see an option that is accepted and ignored: flax 0.8.3-0.8.4 took
``force_fp32_for_softmax=True`` and did nothing with it, and the outputs with and without it
were bit-identical and both inside the bfloat16 bound. A plugin states what each of its
options must change (``suite.plugin.Contract``); this family runs the plugin and the other
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

Problems: self-attention (query = key = value, so every kind of plugin takes them), B = 2,
L = S = 32, E = 32, H = 4 (D = 8), with projection biases; odd-numbered ones are causal
(top left, no row without a key: the masking family's policies do not enter). Each is built
from a seed of the contract's name and its index, so a failing id replays the same arrays.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import zlib
from typing import Any, List, Optional, Tuple

import numpy as np

from suite import oracle
from suite.cases import Case
from suite.check import FAILED, Outcome, attempt, expressible, implementation_isa, judge
from suite.plugin import Contract, Implementation, declared
from suite.problem import Mask, Problem, make_problem

FAMILY = "contracts"
N_PROBLEMS = 16
ALPHA = 0.01
B, L, E, H = 2, 32, 32, 4


def problems(contract_name: str, n: int = N_PROBLEMS) -> List[Problem]:
    """The contract's problems (see the module docstring)."""
    out = []
    for i in range(n):
        seed = zlib.crc32(f"{FAMILY}/{contract_name}/{i}".encode())
        out.append(make_problem(seed, B, L, L, E, H, self_attention=True,
                                mask=Mask(causal=bool(i % 2))).validate())
    return out


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
    otherwise, or the plugin registered under the name (this process's registry, else a class
    of ``impl``'s module named so)."""
    if not isinstance(contract.against, str):
        cls = type(impl)
        variant = type(f"{cls.__name__}_against", (cls,), {
            **dict(contract.against), "name": f"{cls.name}({contract.against_text()})",
            "contracts": (), "__module__": cls.__module__})
        return variant()
    name = contract.against
    module = sys.modules.get(type(impl).__module__)
    for obj in vars(module).values() if module else ():
        if isinstance(obj, type) and getattr(obj, "name", None) == name and hasattr(obj, "prepare"):
            return obj()
    from suite.registry import shared

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
