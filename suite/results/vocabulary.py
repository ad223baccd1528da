"""The suite's vocabularies, declared once: conformance outcomes and sweep point statuses.

Both are ``str`` enums, so a member compares equal to its value and is written to JSON as
that value: results files and string comparisons elsewhere are unchanged by using them.
"""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """What a conformance case found for one implementation, device and dtype."""

    PASS = "pass"
    FAIL = "fail"  # the agreement rule or a declared policy was broken
    ERROR = "error"  # the plugin raised (or ran past --timeout)
    UNSUPPORTED = "unsupported"  # a feature the case needs is not declared, or refused
    DEVIATION = "deviation"  # a declared policy, observed and checked
    FLAKY = "flaky"  # repeated runs disagreed
    KNOWN_FAILURE = "known_failure"  # a failure listed in a known-failures file

    def __str__(self) -> str:
        return self.value


FAILED_OUTCOMES = (Outcome.FAIL, Outcome.ERROR, Outcome.FLAKY)
# Worst first: the order the matrix and the report count and rank outcomes in.
OUTCOME_ORDER = (Outcome.FAIL, Outcome.ERROR, Outcome.FLAKY, Outcome.KNOWN_FAILURE,
                 Outcome.DEVIATION, Outcome.UNSUPPORTED, Outcome.PASS)


class Status(str, enum.Enum):
    """What became of one sweep point of one implementation."""

    OK = "ok"  # measured, its output checked
    UNSUPPORTED = "unsupported"  # a feature or dtype the point needs is not declared
    SKIPPED = "skipped"  # predicted to need more memory than the budget
    OOM = "oom"  # ran out of memory
    TIMEOUT = "timeout"  # ran past --timeout
    ERROR = "error"  # the plugin raised
    INVALID_OUTPUT = "invalid-output"  # wrong shape, or not finite

    def __str__(self) -> str:
        return self.value


# Statuses that make a sweep exit 1: something went wrong, rather than "cannot run here".
FAILED_STATUSES = (Status.ERROR, Status.TIMEOUT, Status.INVALID_OUTPUT)


def first_of(names, shown: int, sep: str = ", ") -> str:
    """``names`` joined, the first ``shown`` of them and ``+N more`` for the rest: how the
    terminal's summaries, the sweep's not-measured lines and the report's headline name a
    list too long for its line."""
    names = list(names)
    rest = len(names) - shown
    return sep.join(names[:shown] + ([f"+{rest} more"] if rest > 0 else []))
