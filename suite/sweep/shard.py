"""``--shard i/n``: a deterministic split of a sweep or a conformance check into n parts,
one per machine or GPU.

A sweep's unit is one implementation on one device (all its points), so every line of a
chart comes from one machine. A check's unit is one implementation's cases of one family on
one device in one dtype: finer, because one implementation's cases can outlast all the
others (a per-shape compiler), and one family's cases stay together as on one xdist worker.
Units are sorted by name and dealt round-robin: shard i of n takes units i-1, i-1+n, ...
Every shard must see the same implementations, devices and cases (the same install and
arguments; one GPU each through CUDA_VISIBLE_DEVICES), or the split differs; the report
reads the parts' results files together.
"""

from __future__ import annotations

import argparse
from typing import Iterable, Set, Tuple

Unit = Tuple[str, str]  # (implementation name, device)


def parse(text: str) -> Tuple[int, int]:
    """'2/4' -> (2, 4); argparse type for --shard."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = 0, 0
    if not sep or not 1 <= i <= n:
        raise argparse.ArgumentTypeError(
            f"--shard: expected i/n with 1 <= i <= n, e.g. 1/4, got {text!r}")
    return i, n


def select(units: Iterable[Tuple[str, ...]], index: int, count: int) -> Set[Tuple[str, ...]]:
    """The units shard ``index`` (1-based) of ``count`` runs."""
    ordered = sorted(set(units))
    return set(ordered[index - 1::count])


def check_has_work(units: Iterable[Tuple[str, ...]], index: int, count: int,
                   unit: str = "implementation x device") -> None:
    """Raise ``InputError`` when shard ``index`` of ``count`` has no unit to run (more parts
    than units): said before anything runs, instead of a run that measures nothing."""
    from suite.spec.problem import InputError

    units = sorted(set(units))
    if not select(units, index, count):
        raise InputError(f"--shard {index}/{count}: expected a part with work, got none: the "
                         f"selection has {len(units)} unit(s) of work ({unit}) for {count} "
                         f"parts; use at most {len(units)} parts")
