"""``mha-suite report``: build the HTML report from results files or directories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reports.build import build_report

__all__ = ["add_arguments", "run", "build_report"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="*", default=["mha-results"],
                   help="results files or directories (default mha-results)")
    p.add_argument("--baseline", action="append", default=[], metavar="PATH",
                   help="baseline results to compare with (files or directories; repeatable)")
    p.add_argument("--baseline-impl", default="numpy",
                   help="implementation the ranking's speed-ups are relative to")
    p.add_argument("--out", default=None, help="HTML path (default <first dir>/report.html)")


def run(args: argparse.Namespace) -> int:
    first = Path(args.results[0])
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "report.html"
    try:
        path = build_report(args.results, out, args.baseline or None, args.baseline_impl)
    except (FileNotFoundError, ValueError) as exc:
        print(f"mha-suite: error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path.resolve()}")
    return 0
