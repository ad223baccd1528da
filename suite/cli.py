"""The ``mha-suite`` command: list, check, sweep, report, run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from suite import registry
from suite.problem import InputError

CASE_TIMEOUT_S = 300.0  # one conformance case: small problems, but torch.compile compiles


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", action="append", default=[], metavar="GLOB",
                   help="implementation name or glob, e.g. 'torch.*' (repeatable; default all)")
    p.add_argument("--plugin", action="append", default=[], metavar="SPEC",
                   help="register module:Class or path/to/file.py[:Class] (repeatable; "
                        f"also ${registry.PLUGINS_ENV})")


def _registry(args: argparse.Namespace, patterns_required: bool = True) -> registry.Registry:
    try:
        reg = registry.shared(args.plugin)
        if patterns_required:
            reg.select(args.impl or None, available_only=False)  # unknown names fail here
        return reg
    except (registry.PluginError, registry.UnknownImplementation) as exc:
        raise CLIError(str(exc).strip("\"'")) from None


def cmd_list(args: argparse.Namespace) -> int:
    reg = _registry(args)
    entries = reg.select(args.impl or None, available_only=False)
    width = max(len(e.name) for e in entries)
    for e in entries:
        d = e.description  # from the cache when fresh: no framework imported
        if d is None:
            print(f"{e.name.ljust(width)}  unavailable: {e.error}")
            continue
        devices = d.devices
        dtypes = ",".join(d.dtypes[devices[0]]) if devices else "-"
        features = ",".join(d.features) or "-"
        line = (f"{e.name.ljust(width)}  {d.framework} {d.framework_version}  "
                f"devices={','.join(devices) or 'none'}  dtypes={dtypes}  features={features}")
        if d.deviations:
            line += f"  deviations={','.join(sorted(d.deviations))}"
        if e.source != "builtin":
            line += f"  ({e.source})"
        print(line)
    return 0


def conformance_args(args: argparse.Namespace, json_path: Optional[str]) -> List[str]:
    """pytest arguments for a conformance run with the CLI's selection."""
    progress = getattr(args, "progress", None)
    if progress is None:
        progress = sys.stderr.isatty()  # a live bar on a terminal; pytest's counts in logs
    out = ["--pyargs", "suite.conformance", "-p", "no:cacheprovider", "-q",
           "-o", "console_output_style=" + ("classic" if progress else "count"),
           "--benchmark-disable", f"--timeout={getattr(args, 'timeout', None) or 0}"]
    if progress:
        out.append("--progress")
    for flag in ("impl", "plugin", "device", "dtype"):
        for value in getattr(args, flag, None) or []:
            out += [f"--{flag}", value]
    if getattr(args, "k", None):
        out += ["-k", args.k]
    if json_path:
        out += ["--conformance-json", json_path]
    if getattr(args, "hypothesis_examples", None):
        out += ["--hypothesis-examples", str(args.hypothesis_examples)]
    return out + list(getattr(args, "pytest_args", None) or [])


def cmd_check(args: argparse.Namespace) -> int:
    import pytest

    _registry(args)  # fail fast, in one line, on a bad --plugin or --impl
    code = int(pytest.main(conformance_args(args, args.json)))
    # pytest: 0 all passed, 1 some failed, 5 nothing collected; the rest are usage errors.
    return code


def cmd_run(args: argparse.Namespace) -> int:
    """The main job: conformance, the sweep, the report."""
    from reports.cli import build_report
    from suite import sweep

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _registry(args)
    started = time.monotonic()
    # The conformance matrix covers the dtypes the sweep times (mha-suite check: all).
    dtypes = args.dtype or sweep.preset_dtypes(args.preset)
    print(f"[1/3] conformance ({', '.join(dtypes)}) -> {out / 'conformance.json'}", flush=True)
    check_code = cmd_check(argparse.Namespace(**{**vars(args), "json": str(out / "conformance.json"),
                                                 "dtype": dtypes, "k": None, "pytest_args": []}))
    print(f"[2/3] sweep (preset {args.preset}) -> {out}", flush=True)
    sweep_parser = argparse.ArgumentParser(prog="mha-suite sweep")
    sweep.add_arguments(sweep_parser)
    sweep_args = sweep_parser.parse_args([f"--preset={args.preset}", f"--out={out}",
                              *(["--resume"] if args.resume else []),
                              *[f"--impl={i}" for i in args.impl],
                              *[f"--plugin={p}" for p in args.plugin],
                              *[f"--device={d}" for d in args.device]])
    sweep_code = sweep.run(sweep_args)
    print("[3/3] report", flush=True)
    report = build_report([str(out)], out / "report.html")
    minutes = (time.monotonic() - started) / 60
    print(f"report: {report.resolve()}  ({minutes:.1f} min)")
    if check_code not in (0, 5):
        print("conformance found failures: see the report's matrix", file=sys.stderr)
    return max(check_code if check_code != 5 else 0, sweep_code)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, metavar="SECONDS",
                   help="a case taking longer is an error of that implementation and the run "
                        f"goes on (pytest-timeout; default {CASE_TIMEOUT_S:.0f}, 0 = none)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar with an ETA (default: when stderr is a terminal)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mha-suite", description="Conformance and benchmarks for multi-head attention.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="list implementations, their devices and features")
    _add_selection(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("check", help="run the conformance cases")
    _add_selection(p)
    p.add_argument("--device", action="append", default=[], help="device prefix, e.g. cpu, cuda")
    p.add_argument("--dtype", action="append", default=[], help="float64/32/16, bfloat16")
    p.add_argument("-k", default=None, metavar="EXPR", help="pytest -k expression on case ids")
    p.add_argument("--json", default=None, metavar="PATH", help="write results JSON to PATH")
    p.add_argument("--hypothesis-examples", type=int, default=None, metavar="N",
                   help="examples per property-based case (default: the CI bound)")
    _add_run_options(p)
    p.add_argument("pytest_args", nargs="*", help="further pytest arguments (after --)")
    p.set_defaults(func=cmd_check)

    from suite import sweep

    p = sub.add_parser("sweep", help="time implementations over a grid (pytest-benchmark)")
    sweep.add_arguments(p)
    p.set_defaults(func=sweep.run)

    from reports import cli as report_cli

    p = sub.add_parser("report", help="build the HTML report from results files")
    report_cli.add_arguments(p)
    p.set_defaults(func=report_cli.run)

    p = sub.add_parser("run", help="the main job: conformance + sweep + HTML report")
    _add_selection(p)
    p.add_argument("--device", action="append", default=[], help="device prefix, e.g. cpu")
    p.add_argument("--dtype", action="append", default=[],
                   help="conformance dtypes (default: the preset's; mha-suite check runs all)")
    p.add_argument("--preset", default="default", choices=sorted(sweep.PRESETS),
                   help="sweep preset (default: default)")
    p.add_argument("--out", default="mha-results", help="output directory (default mha-results)")
    p.add_argument("--resume", action="store_true", help="keep finished sweep points")
    _add_run_options(p)
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (CLIError, InputError, registry.PluginError, registry.UnknownImplementation,
            FileNotFoundError) as exc:
        print(f"mha-suite: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mha-suite: interrupted; results written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

