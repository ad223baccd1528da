"""CI's covering selection of the conformance cases (``mha-suite check --cover``).

The whole matrix (``mha-suite check``, ``nox -s check_full``) runs every case of every
implementation in every dtype: over an hour on the slowest 2-core machine CI runs on. A pull
request's CI runs a selection that still covers what a stale or wrong declaration would
break, chosen from the collected cases alone (deterministic: the same cases on every machine
and every run):

1. the main job's sample (``suite.conformance.sample``): every implementation on every case
   family, a few cases of each (the first only for a per-shape compiler or an interpreted
   kernel), each family in one of the implementation's dtypes, the dtypes taken in turn over
   the families (every dtype and every family still meet each implementation; a family's
   bugs seldom show in one dtype alone, and ``mha-suite check`` runs them all); the families
   where a dtype's width or range is the point (lanes, special values, numerics) in every
   dtype, but on a per-shape compiler or an interpreted kernel (cold, a case compiles for
   5-10 s on a CPU: the selection's largest cost);
2. the dropout family's cases (200 training-mode calls each, seconds on a module) in one
   dtype, float32 where the implementation has it (what is drawn does not depend on the
   dtype; ``mha-suite check`` runs the others);
3. every lane length once: each case of the lanes family runs on every implementation, in
   one of its dtypes in turn (case i in dtype i mod n), so every key length around one and
   two SIMD vectors meets each implementation once (a per-shape compiler or an interpreted
   kernel: the sample's three, under one vector, past one and past two AVX2 vectors);
4. siblings that share one compile path (``compile_path``: the same converter, exporter or
   model integration compiling per shape, around different modules) split the families
   among them: a family's kept cases run on one of them, taken in turn over the families,
   among those that declare what its cases need, the contracts family too (an ``agrees``
   contract compiles its four sampled problems on both sides: 20-50 s a sibling with empty
   caches, the same compile path each time); step 5 adds their known failures back; and the
   lanes cases (vector tails are the code generator's) run
   once per compile path, each lane length on one of its names in turn (``jax.jit``,
   ``jax.nn`` and Flax share XLA's CPU code generator). ``mha-suite check`` runs every
   sibling on every family;
5. every known-failure entry (``known_failures.toml`` and ``--known-failures``) at least
   ``PER_ENTRY`` of the cases it names (one already in the sample, else the first by test id),
   so an entry that no longer holds fails the run under ``--strict-declarations``; but not an
   ``{intermittent}`` entry's: a run where its cases pass cannot show it stale, so running
   them adds nothing a sampled case does not (on the compiled names they hold, 10-50 s a
   case with empty caches); ``mha-suite check`` runs them.

Known library behaviours (``suite.plugins.known_behaviours``) follow conditions, not ids: the sample's lanes
and special-value cases reach them, and ``--strict-declarations`` fails a run where one held
and was never needed. Property-based cases run the sample's number of examples, one for a
per-shape compiler or an interpreted kernel, three where a built-in's code generator
compiles each shape (``compile_path``) (derandomised, the smallest shapes first: the
entries on one-element problems still show); one that a known-failure entry lists (not
``{intermittent}``) runs its full count, stopping at its first failure, since the draw that
shows it may not be the first.
"""

from __future__ import annotations

import fnmatch
from typing import Dict, Iterable, List, NamedTuple, Sequence

from suite.conformance.sample import SAMPLE, compiles_per_shape, counted, sampled
from suite.plugins.interface import declared, is_builtin

PER_ENTRY = 1  # cases kept per known-failure entry (the sample's first, else the first by id)
# Families whose cases CI's selection runs in one dtype per implementation (float32 where it
# has one), and those it runs in every dtype (where a dtype's width or range is the point).
ONE_DTYPE_FAMILIES = ("dropout",)
EVERY_DTYPE_FAMILIES = ("lanes", "special_values", "numerics")


class Item(NamedTuple):
    """What the selection reads of a collected conformance test."""

    test: str  # the test's name, e.g. test_case[numpy-cpu-float32-masking/combined]
    impl: object  # the plugin instance
    impl_name: str
    device: str
    dtype: str
    family: str
    case: str


def choose(items: Sequence[Item], known: Iterable[str], form_order: Iterable[str]
           ) -> List[bool]:
    """Which of ``items`` CI's covering selection keeps (one flag each, in order)."""
    form_order = tuple(form_order)
    keep = [sampled(it.impl, it.device, it.family, it.case, form_order) for it in items]
    _one_dtype_per_family(items, keep)
    _one_dtype(items, keep, ONE_DTYPE_FAMILIES)
    _every_lane_once(items, keep)
    _spread_over_siblings(items, keep)
    where: Dict[str, List[int]] = {}
    for i, it in enumerate(items):
        where.setdefault(it.test, []).append(i)
    for pattern in known:  # (fnmatch.filter compiles each pattern once)
        hits = [i for name in fnmatch.filter(where, pattern) for i in where[name]]
        have = [i for i in hits if keep[i]]
        for i in sorted(set(hits) - set(have), key=lambda i: items[i].test):
            if len(have) >= PER_ENTRY:
                break
            keep[i] = True
            have.append(i)
    return keep


def _one_dtype_per_family(items: Sequence[Item], keep: List[bool]) -> None:
    """Each family's kept cases in one dtype per implementation and device: family n (in
    name order) in dtype n mod the dtypes it has, so every dtype and every family still
    meet it. Not for the families a dtype is the point of (``EVERY_DTYPE_FAMILIES``), except
    on a per-shape compiler or an interpreted kernel; not for ``ONE_DTYPE_FAMILIES``."""
    groups: Dict[tuple, List[int]] = {}
    for i, it in enumerate(items):
        if not keep[i] or it.family in ONE_DTYPE_FAMILIES:
            continue
        if it.family in EVERY_DTYPE_FAMILIES and not compiles_per_shape(it.impl, it.device):
            continue
        groups.setdefault((it.impl_name, it.device), []).append(i)
    for indices in groups.values():
        turn = _in_turn(sorted({items[i].family for i in indices}),
                        {items[i].dtype for i in indices})
        for i in indices:
            keep[i] = turn[items[i].family] == items[i].dtype


def _in_turn(keys: Sequence[str], dtypes: Iterable[str]) -> Dict[str, str]:
    """key n (in the order given) -> dtype n mod the dtypes (in name order)."""
    ordered = sorted(dtypes)
    return {key: ordered[n % len(ordered)] for n, key in enumerate(keys)}


def _one_dtype(items: Sequence[Item], keep: List[bool], families: Iterable[str]) -> None:
    """The kept cases of ``families`` in one dtype per implementation and device: float32
    where it has it, else the first in name order."""
    families = set(families)
    dtypes: Dict[tuple, set] = {}
    for i, it in enumerate(items):
        if keep[i] and it.family in families:
            dtypes.setdefault((it.impl_name, it.device), set()).add(it.dtype)
    chosen = {key: "float32" if "float32" in have else min(have)
              for key, have in dtypes.items()}
    for i, it in enumerate(items):
        if keep[i] and it.family in families:
            keep[i] = chosen[(it.impl_name, it.device)] == it.dtype


def _every_lane_once(items: Sequence[Item], keep: List[bool]) -> None:
    """Each lanes case once per implementation and device, its dtype taken in turn; a
    per-shape compiler or an interpreted kernel (seconds a case) takes the sample's lanes
    cases so: under one vector, past one, past two AVX2 vectors."""
    lanes: Dict[tuple, List[int]] = {}
    for i, it in enumerate(items):
        if it.family == "lanes" and (it.case in SAMPLE["lanes"]
                                     or not compiles_per_shape(it.impl, it.device)):
            lanes.setdefault((it.impl_name, it.device), []).append(i)
    for indices in lanes.values():
        turn = _in_turn(sorted({items[i].case for i in indices}, key=_lane_order),
                        {items[i].dtype for i in indices})
        for i in indices:
            if turn[items[i].case] == items[i].dtype:
                keep[i] = True


def _spread_over_siblings(items: Sequence[Item], keep: List[bool]) -> None:
    """Siblings sharing a ``compile_path``: a per-shape compiler's kept families, its
    contracts among them, spread over them (family n, in name order, on the n-th of those
    able to run it, in turn); the lanes cases of any such siblings, each lane once per path."""
    groups: Dict[tuple, Dict[str, Dict[str, List[int]]]] = {}
    for i, it in enumerate(items):
        # the built-ins only: a user's plugin on the same path is checked on every family
        path = declared(it.impl, "compile_path") if is_builtin(type(it.impl)) else None
        if not path or not keep[i]:
            continue
        if it.family != "lanes" and not compiles_per_shape(it.impl, it.device):
            continue
        fams = groups.setdefault((path, it.device), {})
        fams.setdefault(it.family, {}).setdefault(it.impl_name, []).append(i)
    for fams in groups.values():
        for n, fam in enumerate(sorted(fams)):
            members = sorted(fams[fam])
            if fam == "lanes":  # lane case j on member j mod n, by length
                cases = sorted({items[i].case for m in members for i in fams[fam][m]},
                               key=_lane_order)
                owner = {c: members[j % len(members)] for j, c in enumerate(cases)}
                for m in members:
                    for i in fams[fam][m]:
                        keep[i] = owner[items[i].case] == m
                continue
            able = [m for m in members if any(_may_run(items[i]) for i in fams[fam][m])]
            if not able:
                continue
            chosen = able[n % len(able)]
            for m in members:
                if m != chosen:
                    for i in fams[fam][m]:
                        keep[i] = False


def left_entries(items: Sequence[Item], keep: Sequence[bool], patterns: Iterable[str]
                 ) -> List[str]:
    """The ``patterns`` (test-id globs) that name some of ``items`` and none that is kept:
    entries the selection left to a full check."""
    kept = sorted({it.test for it, k in zip(items, keep) if k})
    left = sorted({it.test for it, k in zip(items, keep) if not k})
    return [p for p in patterns if fnmatch.filter(left, p) and not fnmatch.filter(kept, p)]


def _may_run(it: Item) -> bool:
    """False where the case plainly cannot run on the item's plugin: a mask form it does not
    declare, a catalogue case needing features it does not declare (checked without running:
    its problem's features against the plugin's)."""
    from suite.conformance import catalog
    from suite.conformance.judge import missing_features

    if it.family == "mask_forms":
        return it.case in declared(it.impl, "mask_forms")
    try:
        case = catalog.get(it.family, it.case)
    except KeyError:  # property-based and other cases without one problem: assume it runs
        return True
    try:
        return not missing_features(it.impl, case.problem_for(it.impl))
    except Exception:  # a problem it cannot be given at all: the case says so when run
        return False


def _lane_order(case: str) -> tuple:
    """nan_query_S4 -> (4, 'nan_query'): lengths in order, kinds interleaved across dtypes."""
    kind, _, length = case.rpartition("_S")
    return (int(length), kind) if length.isdigit() else (0, case)


def left_counts(items: Sequence[Item], keep: Sequence[bool]) -> Dict[str, Dict[str, int]]:
    """impl -> family -> cases the selection left to a full check (mask forms a plugin does
    not declare are not counted: they are unsupported without running)."""
    left: Dict[str, Dict[str, int]] = {}
    for it, kept in zip(items, keep):
        if not kept and counted(it.impl, it.family, it.case):
            fams = left.setdefault(it.impl_name, {})
            fams[it.family] = fams.get(it.family, 0) + 1
    return left

