"""Fidelity self-check: does the sweep's median agree with an independent timer?

For one point and one implementation per framework, run the sweep (pytest-benchmark,
as ``mha-suite sweep`` does) and then, in the same process and on the same prepared
problem, time the same call with a timer the sweep does not use:
``torch.utils.benchmark.Timer`` for torch, ``timeit`` for NumPy and JAX. Both
include the plugin's barrier (``synchronize``), so JAX's asynchronous dispatch cannot
make either look faster than the work. Prints sweep / independent per implementation;
a ratio outside [0.9, 1.1] means one of the two timers is not measuring the forward.

    python -m suite.sweep.fidelity [--impl NAME ...] [--length 1024] [--heads 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# One implementation per framework: the framework's own fused kernel where it has one.
DEFAULT_IMPLS = ("numpy", "torch.sdpa", "jax.jit")
LOW, HIGH = 0.9, 1.1


def independent_seconds(framework: str, fn: Callable[[], None],
                        min_run_s: float) -> Tuple[float, str]:
    """Median seconds per call of ``fn`` by a timer other than pytest-benchmark."""
    if framework == "torch":
        import torch
        from torch.utils.benchmark import Timer

        # Timer runs with one thread unless told otherwise; the sweep pinned the count.
        timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        return timer.blocked_autorange(min_run_time=min_run_s).median, \
            "torch.utils.benchmark.Timer.blocked_autorange"
    timer = timeit.Timer(fn)  # timeit turns the garbage collector off, as the sweep does
    number, seconds = timer.autorange()  # calls per repeat so that a repeat takes >= 0.2 s
    repeats = max(5, int(min_run_s / max(seconds, 1e-9)) + 1)
    per_call = [t / number for t in timer.repeat(repeat=repeats, number=number)]
    return statistics.median(per_call), f"timeit ({repeats} x {number} calls)"


def sweep_medians(args: argparse.Namespace, out_dir: Path) -> Dict[str, Dict[str, Any]]:
    """Run the one-point sweep in this process; impl -> {median_s, iqr_s}."""
    from suite.sweep import presets

    sweep_args = presets.arguments(
        preset="default", lengths=[args.length], heads=[args.heads], head_dim=[args.head_dim],
        batch=[1], mask=["none"], dtype=["float32"], device=["cpu"], max_time=args.max_time,
        min_rounds=10, out=str(out_dir), name="fidelity", impl=list(args.impl),
        plugin=list(args.plugin))
    code = presets.run(sweep_args)
    path = presets.results_path(sweep_args)
    if code != 0 or not path.exists():
        raise RuntimeError(f"the fidelity sweep failed (exit {code}); see its output above")
    from suite.results.records import read_file, sweep_rows

    return {r["impl"]: {"median_s": r["median_s"], "iqr_s": r["iqr_s"]}
            for r in sweep_rows(read_file(path, "sweep")) if r["status"] == "ok"}


def check(args: argparse.Namespace) -> List[Dict[str, Any]]:
    from suite.plugins import registry
    from suite.plugins.interface import array_library
    from suite.sweep import measure
    from suite.sweep.presets import Point, point_problem

    # Unknown names fail here, before anything is timed.
    entries = {e.name: e for e in registry.build(plugins=args.plugin).select(
        args.impl, available_only=False)}
    with tempfile.TemporaryDirectory() as tmp:
        swept = sweep_medians(args, Path(tmp))
    point = Point(B=1, L=args.length, H=args.heads, D=args.head_dim)
    rows = []
    for name in args.impl:
        entry = entries[name]
        if not entry.available or name not in swept:
            why = entry.error if not entry.available else "no sweep median (see above)"
            rows.append({"impl": name, "status": f"not measured: {why}"})
            continue
        impl = entry.impl
        # untimed: prepared as the sweep prepares; each call includes the same barrier
        ready = measure.prepare(impl, point_problem(point), "cpu", "float32")
        ready.call()  # warm, as the sweep's warmup is
        seconds, method = independent_seconds(array_library(impl), ready.call,
                                               args.min_run_time)
        ratio = swept[name]["median_s"] / seconds
        rows.append({"impl": name, "framework": impl.framework, "method": method,
                     "sweep_ms": swept[name]["median_s"] * 1e3,
                     "sweep_iqr_ms": swept[name]["iqr_s"] * 1e3,
                     "independent_ms": seconds * 1e3, "ratio": ratio,
                     "status": "ok" if LOW <= ratio <= HIGH else f"outside [{LOW}, {HIGH}]"})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.sweep.fidelity", description=__doc__.split("\n")[0])
    p.add_argument("--impl", action="append", default=None, metavar="NAME",
                   help=f"implementations (repeatable; default {', '.join(DEFAULT_IMPLS)})")
    p.add_argument("--plugin", action="append", default=[], metavar="SPEC",
                   help="register module:Class or path/to/file.py[:Class] (repeatable)")
    p.add_argument("--length", type=int, default=1024, help="L = S (default 1024)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", dest="head_dim", type=int, default=64)
    p.add_argument("--max-time", dest="max_time", type=float, default=2.0,
                   help="pytest-benchmark seconds for the sweep point (default 2)")
    p.add_argument("--min-run-time", dest="min_run_time", type=float, default=2.0,
                   help="seconds of the independent measurement (default 2)")
    args = p.parse_args(argv)
    args.impl = args.impl or list(DEFAULT_IMPLS)
    from suite.plugins.registry import PluginError, UnknownImplementation

    try:
        rows = check(args)
    except (UnknownImplementation, PluginError, RuntimeError) as exc:
        print(f"fidelity: error: {exc}", file=sys.stderr)
        return 2
    print(f"\nfidelity: B=1 L={args.length} H={args.heads} D={args.head_dim} float32 cpu, "
          "sweep median / independent median")
    for r in rows:
        if "ratio" not in r:
            print(f"  {r['impl']:<12} {r['status']}")
            continue
        print(f"  {r['impl']:<12} sweep {r['sweep_ms']:9.3f} ms (IQR {r['sweep_iqr_ms']:.3f})  "
              f"independent {r['independent_ms']:9.3f} ms  ratio {r['ratio']:.3f}  {r['status']}"
              f"  [{r['method']}]")
    measured = [r for r in rows if "ratio" in r]
    return 0 if measured and all(r["status"] == "ok" for r in measured) else 1


if __name__ == "__main__":
    sys.exit(main())
