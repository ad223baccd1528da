"""Checks of a command's inputs before anything is measured.

Each check raises ``suite.spec.problem.InputError`` (``suite.results.records.ResultsError`` for output
paths) whose one line names the argument, what was expected and what arrived; the CLI
prints it as ``mha-suite: error: ...`` and exits 2.
"""

from __future__ import annotations

import math
from typing import Iterable, List, Optional, Sequence

from suite.plugins.registry import Entry, Registry
from suite.spec.problem import DTYPES, InputError


def usable_entries(reg: Registry, patterns: Sequence[str]) -> List[Entry]:
    """The selected implementations that can run here.

    A plugin named by --plugin that is selected but cannot run (its constructor raised,
    it lacks the interface) is an error, and so is a selection of which none can run.
    """
    selected = reg.select(list(patterns) or None, available_only=False)
    for e in selected:
        if not e.available and e.source.startswith("plugin "):
            raise InputError(f"--plugin {e.source.removeprefix('plugin ')}: expected an "
                             f"implementation that can run here, got {e.name}: {e.error}")
    usable = [e for e in selected if e.available]
    if not usable:
        why = "; ".join(f"{e.name}: {e.error}" for e in selected)
        raise InputError(f"--impl: expected an implementation that can run here, got only "
                         f"unavailable ones ({why})")
    return usable


def dtypes(values: Iterable[str], argument: str = "--dtype") -> None:
    bad = [v for v in values if v not in DTYPES]
    if bad:
        raise InputError(f"{argument}: expected some of {', '.join(DTYPES)}, got {', '.join(bad)}")


def devices(entries: Sequence[Entry], prefixes: Iterable[str], argument: str = "--device"
            ) -> None:
    """Every device prefix is offered here by at least one of ``entries``."""
    offered = sorted({d for e in entries for d in e.impl.devices()})
    for prefix in prefixes:
        if not any(d.startswith(prefix) for d in offered):
            raise InputError(f"{argument}: expected a device the selected implementations "
                             f"offer here ({', '.join(offered) or 'none'}), got {prefix}")


def targets(entries: Sequence[Entry], device_prefixes: Sequence[str],
            wanted_dtypes: Sequence[str]) -> None:
    """Some selected implementation runs some selected dtype on some selected device."""
    found = {dt for e in entries for d in e.impl.devices()
             if not device_prefixes or any(d.startswith(p) for p in device_prefixes)
             for dt in e.impl.dtypes(d)}
    if wanted_dtypes and not found & set(wanted_dtypes):
        raise InputError(f"--dtype: expected a dtype the selected implementations support on "
                         f"the selected devices ({', '.join(sorted(found)) or 'none'}), got "
                         f"{', '.join(wanted_dtypes)}")


def positive(value: Optional[float], argument: str, integer: bool = True,
             zero_ok: bool = False) -> None:
    """``value`` (None: not given) is a positive int (or a finite positive number)."""
    if value is None:
        return
    kind = "int" if integer else "number"
    ok = (isinstance(value, int) and not isinstance(value, bool)) if integer else \
        isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        expected = f"a {'non-negative' if zero_ok else 'positive'} {kind}"
        raise InputError(f"{argument}: expected {expected}, got {value!r}")
