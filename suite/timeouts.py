"""Per-test time limits: pytest-timeout's alarm raising ``Timeout`` inside a plugin's call.

Used by the conformance cases and the sweep's points; the hooks that arm and cancel the
alarm live in ``suite.pytest_plugin``, which imports this module (never the reverse).
"""

from __future__ import annotations

import signal
from typing import Optional

import pytest


class Timeout(Exception):
    """A test (conformance case or sweep point) ran past --timeout."""


TIMED_OUT = pytest.StashKey[str]()  # the Timeout's message, once a test's alarm has fired


def timed_out(item: pytest.Item) -> Optional[str]:
    """The timeout message if ``item`` ran past --timeout, else None. The alarm raises once,
    inside whatever the plugin was running; a plugin or a library may catch or wrap it
    (dynamo does), so the item remembers it: the case is a timeout whatever came after."""
    return item.stash.get(TIMED_OUT, None)


def arm(item: pytest.Item, seconds: float) -> None:
    """Raise ``Timeout`` in this process after ``seconds`` (SIGALRM), remembered on ``item``."""

    def alarm(signum, frame):
        item.stash[TIMED_OUT] = f"no result within --timeout {seconds:g} s"
        raise Timeout(item.stash[TIMED_OUT])

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
