"""A conformance case (``Case``), the registry of the agreement cases (``CASES``, ``case``), and how a
family module declares its cases: ``BUILDERS, case = family(FAMILY)``.

Each ``@case(name, **keywords)`` appends (name, seed -> problem, keywords) to the family's
``BUILDERS``; ``suite.conformance.cases`` registers every family's builders, in its order,
as ``Case`` objects (the keywords are ``suite.conformance.cases.case``'s). A family module
imports no case machinery, so the registry can import every family without a cycle.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from suite.conformance.judge import Outcome, run_problem
from suite.plugins.interface import Implementation, declared
from suite.spec.problem import Mask, Problem

Builder = Tuple[str, Callable[[int], Problem], Dict[str, Any]]


def family(name: str) -> Tuple[List[Builder], Callable[..., Callable]]:
    """The family's list of builders, and the decorator that declares one case in it."""
    builders: List[Builder] = []

    def case(case_name: str, **kw: Any) -> Callable:
        def deco(fn: Callable[[int], Problem]) -> Callable[[int], Problem]:
            builders.append((case_name, fn, kw))
            return fn
        return deco
    return builders, case


def one_input(p: Problem) -> Problem:
    """Square problem ``p`` as self-attention: key = value = query, the one input holding
    every NaN or inf that ``p`` put in its key or value (so a special value a plugin with one
    input is given is where ``p`` put it, not dropped with the key)."""
    x = p.query.copy()
    for a in (p.key, p.value):
        bad = ~np.isfinite(a)
        x[bad] = a[bad]
    return dataclasses.replace(p, query=x, key=x, value=x)


def rng(seed: int) -> np.random.Generator:
    """A case's random generator from its seed."""
    return np.random.default_rng(seed + 1)


# A property judge: runs problem ``p`` on ``impl`` and classifies ``out`` (its seed is the
# case's); the agreement judge is ``suite.conformance.judge.run_problem``.
Judge = Callable[[Implementation, Outcome, Problem], Outcome]


@dataclasses.dataclass(frozen=True)
class Case:
    family: str  # masking, shapes, numerics, tiles, special_values, mask_forms, properties, ...
    name: str
    build: Callable[[int], Problem]  # seed -> problem
    doc: str = ""
    # The case is about key != value: unsupported for a plugin with one key/value source.
    distinct_kv: bool = False
    # False: the problem puts NaN or inf in query, key or value on purpose (special values).
    finite: bool = True
    # None: the agreement rule against the float64 oracle; else a property judge.
    judge: Optional[Judge] = None
    # seed -> the square problem (Lq == Lk) for a plugin with one input for query, key and
    # value (``kv_source="self"``); None: ``build``'s problem (``expressible`` adapts it).
    build_self: Optional[Callable[[int], Problem]] = None
    # The case's point does not rest on its mask (a property, say): a ``kv_source="self"``
    # plugin that lacks a feature its mask needs gets the problem unmasked, so a mask-free
    # self-attention module still runs it.
    mask_optional: bool = False

    @property
    def seed(self) -> int:
        return zlib.crc32(f"{self.family}/{self.name}".encode())

    def problem(self) -> Problem:
        return self.build(self.seed).validate(self.finite)

    def problem_for(self, impl: Any) -> Problem:
        """The problem ``impl`` is given (the square one for ``kv_source="self"``)."""
        if declared(impl, "kv_source") != "self":
            return self.problem()
        p = self.problem() if self.build_self is None else \
            self.build_self(self.seed).validate(self.finite)
        if self.mask_optional and frozenset(p.mask.kinds) - frozenset(declared(impl, "features")):
            p = dataclasses.replace(p, mask=Mask())
        return p

    def judge_problem(self, impl: Implementation, out: Outcome, p: Problem) -> Outcome:
        """Run problem ``p`` (this case's, or the same arrays loaded by a reproducer) on
        ``impl`` and classify ``out``."""
        if self.judge is None:
            return run_problem(impl, out, p, distinct_kv=self.distinct_kv)
        return self.judge(impl, out, p)

    def run(self, impl: Implementation, out: Outcome) -> Outcome:
        """Run the case on ``impl`` and classify ``out`` (the conformance tests' judge)."""
        return self.judge_problem(impl, out, self.problem_for(impl))


CASES: List[Case] = []


def case(family: str, name: str, *, distinct_kv: bool = False, finite: bool = True,
         judge: Optional[Judge] = None, into: Optional[List[Case]] = None,
         self_form: Optional[Callable[[int], Problem]] = None, square: Optional[int] = None,
         mask_optional: bool = False):
    """Register a case in ``into`` (default ``CASES``, the agreement cases); which
    declarable behaviours its problem exhibits is read from the problem itself
    (``suite.conformance.judge.behaviours``), never from a tag. ``self_form``: the seed's square
    self-attention problem (``Case.build_self``) where the case's own is not square or puts
    a special value in key or value; ``square=n``: that problem is ``fn(seed, square=n)``
    (the builder's problem with Lq = Lk = n and one input for query, key and value)."""
    def deco(fn: Callable[[int], Problem]) -> Callable[[int], Problem]:
        nonlocal self_form
        if square is not None:
            self_form = functools.partial(fn, square=square)
        (CASES if into is None else into).append(
            Case(family, name, fn, (fn.__doc__ or "").strip(), distinct_kv, finite, judge,
                 self_form, mask_optional))
        return fn
    return deco
