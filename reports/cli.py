"""``mha-suite report``: build the HTML report from results files or directories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "run", "build_report"]


def build_report(*args: Any, **kwargs: Any) -> Path:
    """``reports.build.build_report``, imported on use: pandas and seaborn take seconds,
    and every ``mha-suite`` command builds this parser."""
    from reports.build import build_report as build

    return build(*args, **kwargs)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="*", default=["mha-results"], metavar="RESULTS",
                   help="results files or directories, sweeps and conformance "
                        "(default: mha-results)")
    p.add_argument("--baseline", action="append", default=[], metavar="PATH",
                   help="baseline results to compare with (file or directory; repeatable)")
    p.add_argument("--baseline-impl", default=None, metavar="NAME",
                   help="implementation the ranking's speed-ups are relative to "
                        "(default: numpy, else the first present)")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="HTML file to write (default: report.html next to the first RESULTS)")


def default_out(first: str) -> Path:
    path = Path(first)
    return (path if path.is_dir() else path.parent) / "report.html"


REPORT_MARK = "<title>mha-suite report</title>"  # in the head of every report written


def check_report_target(out: Path) -> None:
    """Refuse an --out that exists and is not an mha-suite report (a results file, say):
    a report replaces only an earlier report."""
    from suite.results.records import ResultsError

    if not out.is_file():
        return
    try:
        with open(out, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return  # check_writable says why it cannot be written
    if REPORT_MARK not in head:
        what = "a results file" if out.suffix == ".json" else "a file that is not an mha-suite report"
        raise ResultsError(f"--out: expected an HTML report path, got {out}, {what}; "
                           "not overwriting it")


def run(args: argparse.Namespace) -> int:
    from suite.results.records import check_writable

    out = Path(args.out) if args.out else default_out(args.results[0])
    try:
        check_writable(out, "--out")  # before reading and drawing, not after
        check_report_target(out)
        path = build_report(args.results, out, args.baseline or None, args.baseline_impl)
    except (FileNotFoundError, ValueError) as exc:
        print(f"mha-suite: error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path.resolve()}")
    return 0
