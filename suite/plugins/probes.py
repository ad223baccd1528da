"""Probes that decide what a plugin offers here (a dtype, a device, a feature, a variant):
a probe that fails keeps the exception it caught, so an implementation listed unavailable
says why ("dtypes('cpu') got [] (keras.device('cpu') raised RuntimeError: ...)"), never only
that a list came back empty.

``usable(key, what, probe)`` runs ``probe`` once per process and per library versions on
disk (``suite.plugins.cache.memo``) and keeps its failure as text: the exception's type and message,
or the reason ``probe`` returned. Every failure seen inside ``capture()`` is collected there:
the registry captures around constructing and describing an implementation and shows what
it collected when the implementation cannot run. Nothing here imports a framework.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator, List, Optional

from suite.plugins import cache

_COLLECTORS: List[List[str]] = []


def describe(exc: BaseException) -> str:
    """``Type: the message's first line`` (at most 300 characters)."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    return f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__


def note(reason: str) -> None:
    """Record why a probe failed, for every ``capture()`` open now."""
    for found in _COLLECTORS:
        if reason not in found:
            found.append(reason)


def failed(what: str, exc: BaseException) -> str:
    """A probe of ``what`` raised ``exc``: noted, and returned as text."""
    reason = f"{what} raised {describe(exc)}"
    note(reason)
    return reason


@contextlib.contextmanager
def capture() -> Iterator[List[str]]:
    """Collect the failures of the probes run (or read from the cache) inside."""
    found: List[str] = []
    _COLLECTORS.append(found)
    try:
        yield found
    finally:
        _COLLECTORS.remove(found)


def why_not(what: str, probe: Callable[[], Any]) -> Optional[str]:
    """None when ``probe()`` runs and returns anything but False or a string; else why not:
    the exception it raised (``what raised Type: message``), or the string it returned."""
    try:
        with warnings.catch_warnings():  # a probe's warnings are not the user's to read
            warnings.simplefilter("ignore")
            result = probe()
    except Exception as exc:  # any failure means: not usable; kept as the reason
        return f"{what} raised {describe(exc)}"
    if isinstance(result, str):
        return f"{what}: {result}"
    return f"{what} gave an unusable result" if result is False else None


def usable(key: str, what: str, probe: Callable[[], Any]) -> bool:
    """Whether ``probe`` runs (``why_not``), once per process and on disk under ``key``;
    a failure, fresh or cached, is noted with its reason."""
    reason = cache.memo(f"{key}:why", lambda: why_not(what, probe))
    if reason:
        note(reason)
        return False
    return True
