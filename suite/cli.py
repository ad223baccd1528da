"""The ``mha-suite`` command: list, check, sweep, report, run, repro, compare."""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from suite.plugins import registry
from suite.plugins.interface import declared
from suite.plugins.selection import PLUGIN_OPTION, add_impl_plugin
from suite.results.records import ResultsError
from suite.spec.problem import InputError
from suite.sweep import shard

CASE_TIMEOUT_S = 300.0  # one conformance case: small problems, but torch.compile compiles


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def _add_selection(p: argparse.ArgumentParser) -> None:
    add_impl_plugin(p)
    p.add_argument("--replace-builtin", action="append", default=[], metavar="NAME",
                   help="let a --plugin class named NAME replace the built-in of that name "
                        f"(repeatable; also ${registry.REPLACE_ENV}); without it such a "
                        "plugin is refused")


def _allow_replacing(names: Sequence[str]) -> None:
    """--replace-builtin goes to the environment, so every registry this command builds
    (pytest sessions, xdist workers, the sweep) sees it."""
    if names:
        old = [n for n in os.environ.get(registry.REPLACE_ENV, "").split(",") if n]
        os.environ[registry.REPLACE_ENV] = ",".join(dict.fromkeys([*old, *names]))


def _registry(args: argparse.Namespace, patterns_required: bool = True) -> registry.Registry:
    _allow_replacing(getattr(args, "replace_builtin", None) or [])
    try:
        reg = registry.shared(args.plugin)
        if patterns_required:
            reg.select(args.impl or None, available_only=False)  # unknown names fail here
        return reg
    except (registry.PluginError, registry.UnknownImplementation) as exc:
        raise CLIError(str(exc).strip("\"'")) from None


def cmd_list(args: argparse.Namespace) -> int:
    from suite.plugins import cache

    if args.refresh:
        cache.refresh()
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
        on = f" on {d.array_library}" if d.array_library else ""
        line = (f"{e.name.ljust(width)}  {d.framework} {d.framework_version}{on}  "
                f"devices={','.join(devices) or 'none'}  dtypes={dtypes}  features={features}")
        if d.kv_source != "separate":
            line += f"  kv_source={d.kv_source}"
        if d.deviations:
            line += f"  deviations={','.join(sorted(d.deviations))}"
        if e.source != "builtin":
            line += f"  ({e.source})"
        print(line)
    from suite.plugins import isa

    if any(isa.dispatches(e.description) for e in entries):
        levels = isa.machine_levels()
        print(f"CPU instruction-set levels torch dispatches to here: {', '.join(levels) or 'none'}"
              f" (native {levels[-1] if levels else 'unknown'}); mha-suite check runs the "
              "implementations on torch at each (--isa)")
    if cache.READ:
        print(f"(read from the cache in {cache.cache_dir()}: kept while the installed packages, "
              "Python and the suite's sources stay the same; --refresh probes again)")
    return 0


# The pytest plugins a conformance run uses, and only those: xdist, timeout, hypothesis, and
# pytest-benchmark (its machine and commit hooks describe the run in the results file).
RUN_PLUGINS = ("xdist.plugin", "pytest_timeout", "_hypothesis_pytestplugin",
               "pytest_benchmark.plugin")


def conformance_args(args: argparse.Namespace, json_path: Optional[str]) -> List[str]:
    """pytest arguments for a conformance run with the CLI's selection."""
    progress = getattr(args, "progress", None)
    if progress is None:
        progress = sys.stderr.isatty()  # a live bar on a terminal; pytest's counts in logs
    workers = getattr(args, "workers", 0) or 0
    workers = workers if isinstance(workers, int) else 0
    progress = progress and workers < 2  # the xdist controller collects nothing to count
    # rootdir is the folder holding the suite package, so FAILED lines and test ids are
    # real paths from there (suite/conformance/...), wherever the command runs and wherever
    # a --plugin file lies (pytest would otherwise drop the folders).
    # -rfE: pytest's short summary names the failures and errors only (with their reasons;
    # the replay command is in the FAILURES section above it), not every known failure,
    # deviation and unsupported case with its whole reason (pyproject's -ra): the matrix and
    # its lines per implementation name those (summary.outcome_lines), the results file
    # keeps each case's reason. The later -r wins over an ini file's addopts.
    # The command imported suite before pytest starts, which pytest warns it cannot rewrite.
    from suite.plugins.selection import only_plugins

    out = ["--pyargs", "suite.conformance.tests", *only_plugins(*RUN_PLUGINS), "-q", "-rfE",
           "-W", "ignore::pytest.PytestAssertRewriteWarning",
           f"--rootdir={Path(__file__).resolve().parents[1]}",
           "-o", "console_output_style=" + ("classic" if progress else "count"),
           "--benchmark-disable", f"--timeout={getattr(args, 'timeout', None) or 0}"]
    if workers > 1:  # an implementation's cases of one family on one worker (conftest)
        out += ["-n", str(workers), "--dist", "loadgroup"]
    elif progress:
        out.append("--progress")
    for flag in ("impl", "plugin", "device", "dtype", "known_failures"):
        for value in getattr(args, flag, None) or []:
            out += [f"--{flag.replace('_', '-')}", value]
    if getattr(args, "k", None):
        out += ["-k", args.k]
    if json_path:
        out += ["--conformance-json", json_path]
    if (getattr(args, "repeat", None) or 1) > 1:
        out += ["--repeat", str(args.repeat)]
    if getattr(args, "hypothesis_examples", None):
        out += ["--hypothesis-examples", str(args.hypothesis_examples)]
    if getattr(args, "sample", False):
        out.append("--sample")
    if getattr(args, "shard", None):
        out += ["--shard", "{}/{}".format(*args.shard)]
    for flag in ("cover", "strict_declarations"):
        if getattr(args, flag, False):
            out.append(f"--{flag.replace('_', '-')}")
    return out + list(getattr(args, "pytest_args", None) or [])


def conformance_workers(workers: Optional[str], implementations: int) -> int:
    """pytest-xdist workers for a conformance run: ``auto`` is one per core, at most one per
    implementation (each implementation's cases stay on one worker); 0 or 1 runs serially."""
    if workers in (None, "auto"):
        import importlib.util

        if importlib.util.find_spec("xdist") is None:
            return 0
        return min(os.cpu_count() or 1, implementations) if implementations > 1 else 0
    try:
        n = int(workers)
    except ValueError:
        n = -1
    if n < 0:
        raise CLIError(f"--workers: expected 'auto' or a whole number >= 0, got {workers!r}")
    return n


def preflight_check(args: argparse.Namespace) -> None:
    """Everything `check` needs, checked before any case runs (one line, exit 2)."""
    from suite import preflight
    from suite.results import records

    entries = preflight.usable_entries(_registry(args), args.impl)
    args.workers = conformance_workers(getattr(args, "workers", "auto"), len(entries))
    preflight.dtypes(args.dtype)
    preflight.devices(entries, args.device)
    preflight.targets(entries, args.device, args.dtype)
    preflight.positive(args.timeout, "--timeout", integer=False, zero_ok=True)
    preflight.positive(getattr(args, "hypothesis_examples", None), "--hypothesis-examples")
    preflight.positive(getattr(args, "repeat", None), "--repeat")
    if getattr(args, "sample", False) and getattr(args, "cover", False):
        raise CLIError("--sample and --cover: expected one selection, got both (--sample is "
                       "the main job's, --cover CI's)")
    if getattr(args, "known_failures", None):
        from suite.conformance.known_failures import (
            KnownFailuresError,
            read_known_failures,
            unknown_error,
            unknown_implementations,
        )

        try:
            listed = read_known_failures(args.known_failures)
        except KnownFailuresError as exc:
            raise CLIError(f"--known-failures: {exc}") from None
        if getattr(args, "strict_declarations", False):  # (without: a warning at the end)
            unknown = unknown_implementations(listed.values(), _registry(args).entries,
                                              args.known_failures)
            if unknown:
                raise CLIError(unknown_error(unknown))
    if getattr(args, "json", None):
        records.check_writable(args.json, "--json", kind="conformance")


class _SessionOf:
    """A pytest plugin that keeps the config of the session it is handed to."""

    config = None

    def pytest_configure(self, config) -> None:
        self.config = config


# The families every lower instruction-set level runs (suite.plugins.isa): where a vector loop's tail,
# a NaN or a row with no key meets a kernel the level changes. The native level runs all.
ISA_FAMILIES = ("lanes", "special_values", "masking", "tiles", "layouts")
ISA_ENV = "MHA_SUITE_ISA"  # --isa's default where the option is not given


def isa_plan(args: argparse.Namespace) -> tuple:
    """(run the native level here?, the lower levels to run in processes of their own, the
    selected implementations whose array library dispatches on the level), checked before any
    work: a level above this CPU's is refused in one line."""
    from suite.plugins import isa

    words = _isa_words(args)
    if words == ["native"]:
        return True, [], []
    reg = _registry(args)
    # On torch's CPU kernels: not a per-shape compiler (inductor generates its own code, and
    # a compile per shape at every level costs minutes) nor an interpreted kernel.
    dispatching = [e.name for e in reg.select(args.impl or None, available_only=True)
                   if isa.dispatches(e.description) and "cpu" in e.description.devices
                   and not declared(e.impl, "compiles_per_shape")]
    have = isa.machine_levels()
    native = have[-1] if have else None
    if "all" in words:
        wanted = list(have)
    elif words == ["lower"]:
        wanted = list(have[:-1])
    else:
        wanted = [native if w == "native" else w for w in words]
        beyond = [w for w in wanted if w is not None and w not in have]
        if beyond:
            raise CLIError(f"--isa: this CPU cannot run {', '.join(beyond)} (torch's levels "
                           f"here: {', '.join(have) or 'none: torch is not installed'})")
    lower = [w for w in dict.fromkeys(wanted) if w and w != native] if dispatching else []
    return (native in wanted or not have) and words != ["lower"], lower, dispatching


def _say_lower_levels_left(args: argparse.Namespace) -> None:
    """One line at the start of a check that runs the native level by default, where this
    CPU has lower levels and a selected implementation dispatches on them."""
    from suite.plugins import isa

    levels = isa.machine_levels()
    if len(levels) < 2:
        return
    if not any(isa.dispatches(e.description) and "cpu" in e.description.devices
               for e in _registry(args).select(args.impl or None, available_only=True)):
        return
    print(f"mha-suite check: the native CPU level ({levels[-1]}) only; --isa all also runs "
          f"{', '.join(ISA_FAMILIES)} at {', '.join(levels[:-1])}, as CI and the main job do",
          flush=True)


# Under --cover (CI) the families a vector width shows in most directly, and that the
# known-failure entries at a lower level name, run at every lower level; the others are
# spread over the lower levels, each at one (all at the one lower level of an AVX2 CPU).
ISA_FAMILIES_EVERY_LEVEL = ("lanes", "special_values")


def level_families(args: argparse.Namespace, index: int, count: int) -> Tuple[str, ...]:
    """The families lower level ``index`` (of ``count``) runs."""
    if not getattr(args, "cover", False):
        return ISA_FAMILIES
    spread = [f for f in ISA_FAMILIES if f not in ISA_FAMILIES_EVERY_LEVEL]
    return ISA_FAMILIES_EVERY_LEVEL + tuple(
        f for j, f in enumerate(spread) if j % count == index)


def _level_command(args: argparse.Namespace, impls: List[str],
                   families: Sequence[str] = ISA_FAMILIES) -> List[str]:
    """The pytest run of one lower level: the run's own conformance arguments, narrowed to
    the dispatching implementations and ``families`` (and the run's -k), into the same
    results file."""
    k = " or ".join(families)
    k = f"({k}) and ({args.k})" if getattr(args, "k", None) else k
    level_args = argparse.Namespace(**{**vars(args), "impl": impls, "k": k})
    return [sys.executable, "-m", "pytest", *conformance_args(level_args, getattr(args, "json", None))]


def cmd_check(args: argparse.Namespace) -> int:
    """The conformance run: the native level here, each lower level asked for (--isa) in a
    process of its own, its records beside the native ones in the same results file."""
    import subprocess

    from suite.plugins import isa

    preflight_check(args)
    native, lower, impls = isa_plan(args)
    if native and not lower and not getattr(args, "isa", None) \
            and not os.environ.get(ISA_ENV):
        _say_lower_levels_left(args)
    codes = []
    if native:
        codes.append(_check_here(args))
        if codes[-1] == 130:  # interrupted: said, and the finished cases saved
            return 130
    for index, level in enumerate(lower):
        families = level_families(args, index, len(lower))
        print(f"mha-suite check: instruction-set level {level} ({isa.TORCH_ENV}={level}): "
              f"{', '.join(impls)} on {', '.join(families)}", flush=True)
        env = {**os.environ, **isa.env_for(level)}
        try:
            code = subprocess.run(_level_command(args, impls, families), env=env).returncode
        except KeyboardInterrupt:
            return 130
        if code == 2:  # pytest's "interrupted": said, and the finished cases saved
            return 130
        codes.append(code)
    real = [c for c in codes if c != 5]  # 5: nothing collected (a -k that selects nothing)
    return max(real) if real else (5 if codes else 0)


def _check_here(args: argparse.Namespace) -> int:
    """The conformance run in this process (its native level)."""
    import pytest

    from suite.conformance.session import ConformanceSession

    holder = _SessionOf()
    code = int(pytest.main(conformance_args(args, args.json), plugins=[holder]))
    session = ConformanceSession.of(holder.config) if holder.config is not None else None
    if session is not None and session.save_error:
        return 1  # said in one line by the session; the records saved before are kept
    if code == pytest.ExitCode.INTERRUPTED:
        return 130  # Ctrl-C or SIGTERM: said in one line, the finished cases saved
    # pytest: 0 all passed, 1 some failed, 5 nothing collected; the rest are usage errors.
    return code


def _check_folder(out: Path, argument: str) -> None:
    """``out`` is a folder that can be created and written (checked before any work)."""
    if out.exists() and not out.is_dir():
        raise CLIError(f"{argument}: expected a folder, got the file {out}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise CLIError(f"{argument}: expected a writable folder, got {out} "
                       f"({exc.strerror or type(exc).__name__})") from None


def cmd_repro(args: argparse.Namespace) -> int:
    """Write a reproducer of one conformance case (suite.conformance.repro)."""
    from suite.conformance import repro

    try:
        parts = repro.parse(args.case_id)
        reg = _registry(argparse.Namespace(plugin=args.plugin, impl=[parts["impl"]]))
        entry = reg.entries[parts["impl"]]
        if not entry.available:
            raise CLIError(f"{entry.name} is unavailable here: {entry.error}")
        out = Path(args.out or Path("repro") / re.sub(r"[^A-Za-z0-9._-]+", "_", args.case_id))
        _check_folder(out, "--out")
        written = repro.write(entry.impl, args.case_id, out, args.plugin or [])
    except repro.ReproError as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:  # the folder changed under us (full disk, removed)
        raise CLIError(f"--out: cannot write {out}: {exc.strerror or exc}") from None
    for path in written:
        if path.suffix == ".py":
            what = ("the library alone, for an upstream report" if path.name == "repro.py"
                    else "the plugin on the saved problem, with the verdict")
            print(f"reproducer: {path}  ({what}); run it: python {path}")
    print(f"inputs: {', '.join(str(p) for p in written if p.suffix == '.npz')}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Two conformance results files case by case (suite.conformance.compare)."""
    from suite.conformance import compare

    if args.show < 0:
        raise CLIError(f"--show: expected a whole number >= 0, got {args.show}")
    return compare.run(args.before, args.after, known_failures=args.known_failures,
                       shown=args.show, numbers=args.numbers)


def cmd_run(args: argparse.Namespace) -> int:
    """The main job: conformance, the sweep, the report."""
    from reports.cli import build_report, check_report_target
    from suite.results import records
    from suite.sweep import presets

    out = Path(args.out)
    started = time.monotonic()
    # The conformance matrix covers the dtypes the sweep times (mha-suite check: all).
    dtypes = args.dtype or presets.preset_dtypes(args.preset)
    # One screen after the progress bars: totals and what failed (the report has the rest).
    check_args = argparse.Namespace(**{**vars(args), "json": str(out / "conformance.json"),
                                       "dtype": dtypes, "k": None, "sample": not args.full,
                                       "pytest_args": ["--brief-summary", "--disable-warnings",
                                                       "--tb=no", "-rN"]})
    sweep_args = presets.arguments(preset=args.preset, out=str(out), resume=bool(args.resume),
                                 sample=not args.full,
                                 impl=list(args.impl), plugin=list(args.plugin),
                                 progress=args.progress, brief=True,
                                 device=[w for d in args.device for w in presets._words(d)] or None)
    # All three steps' inputs are checked before the first one starts.
    preflight_check(check_args)
    try:
        presets.preflight(sweep_args)
    except argparse.ArgumentTypeError as exc:
        raise CLIError(str(exc)) from None
    records.check_writable(out / "report.html", "--out")
    check_report_target(out / "report.html")
    steps = {}  # seconds per step, printed at the end: where the main job's time went
    what = "every case" if args.full else \
        "the main job's sample of the cases; mha-suite check runs them all"
    print(f"[1/3] conformance ({', '.join(dtypes)}; {what}) -> {out / 'conformance.json'}",
          flush=True)
    start = time.monotonic()
    check_code = cmd_check(check_args)
    steps["conformance"] = time.monotonic() - start
    print(f"[2/3] sweep (preset {args.preset}" + ("" if args.full else
          "; per-shape compilers at fewer lengths, the rest left to mha-suite sweep")
          + f") -> {out}", flush=True)
    start = time.monotonic()
    sweep_code = presets.run(sweep_args)
    steps["sweep"] = time.monotonic() - start
    print("[3/3] report", flush=True)
    start = time.monotonic()
    report = build_report([str(out)], out / "report.html")
    steps["report"] = time.monotonic() - start
    minutes = (time.monotonic() - started) / 60
    print(f"report: {report.resolve()}  ({minutes:.1f} min: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in steps.items()) + ")")
    if check_code not in (0, 5):
        print("conformance found failures: see the report's matrix", file=sys.stderr)
    return max(check_code if check_code != 5 else 0, sweep_code)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, metavar="SECONDS",
                   help="a case taking longer is an error of that implementation and the run "
                        f"goes on (pytest-timeout; default {CASE_TIMEOUT_S:.0f}, 0 = none)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar with an ETA (default: when stderr is a terminal)")
    p.add_argument("--workers", default="auto", metavar="N",
                   help="pytest-xdist worker processes for the conformance cases (default "
                        "auto: one per core, at most one per implementation; 0 = serial)")


def _isa_levels(text: str) -> List[str]:
    from suite.plugins import isa

    try:
        return isa.parse_levels(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--isa: ")) from None


def _add_isa(p: argparse.ArgumentParser, default: str) -> None:
    """--isa; ``default`` where neither the option nor $MHA_SUITE_ISA says: ``check`` (a
    plugin author's loop) runs the native level, ``run`` (the main job) every level."""
    p.add_argument("--isa", type=_isa_levels, metavar="LEVELS", default=None,
                   help="CPU instruction-set levels to run the implementations on torch at, "
                        "each in its own process (ATEN_CPU_CAPABILITY): all (every level this "
                        "CPU has), native, lower (all but the native one), or some of "
                        f"default,avx2,avx512; default ${ISA_ENV}, else {default}; the lower "
                        f"levels run the families {', '.join(ISA_FAMILIES)}, without the "
                        "per-shape compilers")
    p.set_defaults(isa_default=default)


def _isa_words(args: argparse.Namespace) -> List[str]:
    """The --isa levels asked for: the option, else $MHA_SUITE_ISA, else the command's."""
    words = getattr(args, "isa", None)
    if words:
        return words
    try:
        return _isa_levels(os.environ.get(ISA_ENV) or getattr(args, "isa_default", "native"))
    except argparse.ArgumentTypeError as exc:
        raise CLIError(f"${ISA_ENV}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mha-suite", description="Conformance and benchmarks for multi-head attention.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="list implementations, their devices and features")
    _add_selection(p)
    p.add_argument("--refresh", action="store_true",
                   help="probe every built-in again instead of reading the cache (and rewrite it)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("check", help="run the conformance cases")
    _add_selection(p)
    p.add_argument("--device", action="append", default=[], help="device prefix, e.g. cpu, cuda")
    p.add_argument("--dtype", action="append", default=[], help="float64/32/16, bfloat16")
    p.add_argument("-k", default=None, metavar="EXPR", help="pytest -k expression on case ids")
    p.add_argument("--json", default=None, metavar="PATH", help="write results JSON to PATH")
    p.add_argument("--hypothesis-examples", type=int, default=None, metavar="N",
                   help="examples per property-based case (default: the CI bound)")
    p.add_argument("--sample", action="store_true",
                   help="only the main job's sample of the cases: every family, a few cases "
                        "each (suite/conformance/sample.py); what it leaves is counted in the results")
    p.add_argument("--cover", action="store_true",
                   help="CI's covering selection (suite/conformance/cover.py): the main job's sample, "
                        "every lane length once per implementation, and the cases every "
                        "known-failure entry names; what it leaves is counted in the results")
    p.add_argument("--strict-declarations", action="store_true",
                   help="fail where a known-failure entry or a known library behaviour held "
                        "and no case needed it (stale or wrong), not only warn")
    p.add_argument("--shard", type=shard.parse, default=None, metavar="I/N",
                   help="run part I of N (1-based) of the selected cases, one per machine, "
                        "same install and arguments, a results file each (--json); the report "
                        "reads the parts together (see suite/sweep/shard.py)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run each case N times on fresh instances (recompiling); a case whose "
                        "outcome changes is reported as flaky (default 1)")
    p.add_argument("--known-failures", action="append", default=[], metavar="FILE",
                   help="more known failures: a .toml file of [[failure]] records (as "
                        "suite/conformance/known_failures.toml), or the short form: a test id "
                        "glob, optionally where it holds in braces ({torch<2.5; isa=avx512}), "
                        "'#', the reason, one a line")
    _add_run_options(p)
    _add_isa(p, "native")
    p.add_argument("pytest_args", nargs="*", help="further pytest arguments (after --); the run "
                   "loads only the pytest plugins it uses: name another with -p MODULE")
    p.set_defaults(func=cmd_check)

    from suite.sweep import presets

    p = sub.add_parser("sweep", help="time implementations over a grid (pytest-benchmark)")
    presets.add_arguments(p)
    p.set_defaults(func=presets.run)

    from reports import cli as report_cli

    p = sub.add_parser("report", help="build the HTML report from results files")
    report_cli.add_arguments(p)
    p.set_defaults(func=report_cli.run)

    p = sub.add_parser("repro", help="write a reproducer of one conformance case (any plugin)")
    p.add_argument("case_id", metavar="CASE_ID",
                   help="IMPL-DEVICE-DTYPE-FAMILY/CASE, as in a test id "
                        "(e.g. torch.flex-cpu-float32-shapes/no_projection_bias)")
    p.add_argument(PLUGIN_OPTION[0], **PLUGIN_OPTION[1])
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for repro.py and inputs.npz (default repro/<case id>)")
    p.set_defaults(func=cmd_repro)

    p = sub.add_parser("run", help="the main job: conformance + sweep + HTML report")
    _add_selection(p)
    p.add_argument("--device", action="append", default=[], help="device prefix, e.g. cpu")
    p.add_argument("--dtype", action="append", default=[],
                   help="conformance dtypes (default: the preset's; mha-suite check runs all)")
    p.add_argument("--preset", default="default", choices=sorted(presets.PRESETS),
                   help="sweep preset (default: default)")
    p.add_argument("--full", action="store_true",
                   help="every conformance case and sweep point, as mha-suite check and sweep "
                        "run them (default: the main job's sample, suite/conformance/sample.py: every "
                        "family with a few cases each, per-shape compilers at fewer lengths)")
    p.add_argument("--out", default="mha-results", help="output directory (default mha-results)")
    p.add_argument("--resume", action="store_true", help="keep finished sweep points")
    _add_run_options(p)
    _add_isa(p, "all")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "compare", help="compare two conformance results files case by case",
        description="Compare two conformance results files (mha-suite check --json) case by "
                    "case, keyed by implementation, device, dtype, CPU level and test id: the "
                    "records only one holds and the cases whose outcome changed, each side's "
                    "reason on one line. A case an intermittent known-failure record lists "
                    "(condition 'intermittent') is reported under that record and is not a "
                    "change. nox -s check_full compares its run with the previous one "
                    "(conformance.json.previous). Exit status: 0 no outcome changed but "
                    "intermittent ones, 1 an outcome changed or a record is in one file only, "
                    "2 a file missing, unreadable or not a conformance results file.")
    p.add_argument("before", metavar="BEFORE", help="the earlier conformance results file")
    p.add_argument("after", metavar="AFTER", help="the later conformance results file")
    p.add_argument("--known-failures", action="append", default=[], metavar="FILE",
                   help="more known-failure files whose intermittent entries excuse a change "
                        "(as mha-suite check's; the suite's own file is always read)")
    p.add_argument("--numbers", action="store_true",
                   help="also compare err and bound of the cases that passed in both files: "
                        "how many changed and the largest relative change (off by default)")
    from suite.conformance.compare import SHOWN

    p.add_argument("--show", type=int, default=SHOWN, metavar="N",
                   help=f"lines per kind (changed, intermittent, only before, only after) at "
                        f"most, the rest counted (default {SHOWN})")
    p.set_defaults(func=cmd_compare)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (CLIError, InputError, ResultsError, registry.PluginError,
            registry.UnknownImplementation, FileNotFoundError) as exc:
        print(f"mha-suite: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mha-suite: interrupted; results written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

