"""Sweeps: named presets declared as data, command-line overrides, and ``mha-suite sweep``.

A sweep is a pytest-benchmark run of ``suite.sweep.benchmarks`` over a grid. A preset
is a list of blocks; each block is the cross product of its axes, so a preset can
vary length at a fixed head count in one block and heads at a fixed length in
another without paying for the whole cross product.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

from suite.plugins.selection import add_impl_plugin
from suite.results.vocabulary import FAILED_STATUSES
from suite.sweep import shard
from suite.sweep.point import MASK_ALIASES, MASKS, Point

POINT_TIMEOUT_S = 1800.0  # one point, all its rounds: the largest CPU points take minutes
DTYPES = ("float64", "float32", "float16", "bfloat16")
AXES = ("lengths", "heads", "kv_heads", "batch", "head_dim", "dtype", "mask", "device", "grad")

# Per preset: blocks of axes, plus timing options for pytest-benchmark.
PRESETS: Dict[str, Dict[str, Any]] = {
    "ci": {  # seconds: a smoke test of every available implementation
        # length scaling at H=4 with both masks, head scaling at L=128 (the default's shape:
        # 7 points an implementation, where the cross product of both axes had 12)
        "blocks": [{"lengths": [64, 128, 256], "heads": [4], "mask": ["none", "causal"]},
                   {"lengths": [128], "heads": [1], "mask": ["none"]}],
        "defaults": {"batch": [1], "head_dim": [32], "dtype": ["float32"], "device": ["cpu"]},
        "timing": {"max_time": 0.05, "min_rounds": 3, "warmup_iterations": 1},
        # under --sample, a per-shape compiler times the longest length only (a compile per
        # point, 5-30 s each cold: most of this preset's time otherwise)
        "sample_compiled": "longest",
    },
    # default: minutes on a 2-core CPU. Length scaling at H=8: seven lengths up to 2048 (4
    # degrees of freedom for the three-term cost model; 4096 cost twice this whole block);
    # head scaling at L=1024 without a mask (a causal mask halves every H alike).
    "default": {
        "blocks": [{"lengths": [128, 256, 512, 768, 1024, 1536, 2048], "heads": [8],
                    "mask": ["none", "causal"]},
                   {"lengths": [1024], "heads": [1, 2, 4, 16], "mask": ["none"]}],
        "defaults": {"batch": [1], "head_dim": [64], "dtype": ["float32"], "device": ["cpu"]},
        "timing": {"max_time": 0.2, "min_rounds": 3, "warmup_iterations": 1},
    },
    "long": {  # long sequences on the CPU: where linear-memory kernels go on alone
        "blocks": [{"lengths": [8192, 16384, 32768, 65536], "heads": [8], "mask": ["none"]}],
        "defaults": {"batch": [1], "head_dim": [64], "dtype": ["float32"], "device": ["cpu"]},
        "timing": {"max_time": 0.5, "min_rounds": 2, "warmup_iterations": 1},
    },
    "gpu": {  # large: every SDPA backend, half precision, up to 32k tokens
        "blocks": [{"lengths": [1024, 2048, 4096, 8192, 16384, 32768], "heads": [16],
                    "mask": ["none", "causal"]},
                   {"lengths": [4096], "heads": [1, 4, 8, 32], "mask": ["none", "causal"]}],
        "defaults": {"batch": [1], "head_dim": [64, 128], "dtype": ["float16", "bfloat16"],
                     "device": ["cuda"]},
        "timing": {"max_time": 0.5, "min_rounds": 5, "warmup_iterations": 3},
    },
}


def preset_dtypes(preset: str) -> List[str]:
    """The dtypes a preset sweeps, in the order it names them."""
    spec = PRESETS[preset]
    found: List[str] = []
    for block in spec["blocks"]:
        for d in block.get("dtype", spec["defaults"]["dtype"]):
            if d not in found:
                found.append(d)
    return found


def _ints(text: str) -> List[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def _words(text: str) -> List[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                   help="grid and timing preset (ci: seconds; default: minutes; long: CPU, "
                        "8k-64k tokens; gpu: large)")
    add_impl_plugin(p)
    p.add_argument("--lengths", type=_ints, help="sequence lengths, e.g. 128,256 (Lq = Lk)")
    p.add_argument("--heads", type=_ints, help="head counts, e.g. 1,8")
    p.add_argument("--kv-heads", dest="kv_heads", type=_ints,
                   help="kv head counts (GQA); default = heads")
    p.add_argument("--batch", type=_ints, help="batch sizes")
    p.add_argument("--head-dim", dest="head_dim", type=_ints, help="head widths D (E = H*D)")
    p.add_argument("--dtype", type=_words, help="dtypes, e.g. float32,bfloat16")
    p.add_argument("--mask", type=_words,
                   help="masks: none, causal, valid_lens (key padding; 'padding' is accepted too)")
    p.add_argument("--device", type=_words, action="extend",
                   help="device prefixes, e.g. cpu or cuda (default: the preset's)")
    p.add_argument("--grad", action="store_true", help="time forward + backward")
    p.add_argument("--shard", type=shard.parse, default=None, metavar="I/N",
                   help="run part I of N (1-based): one per machine or GPU, same install; "
                        "the report merges the parts (see suite/sweep/shard.py)")
    p.add_argument("--out", default="mha-results", help="results directory")
    p.add_argument("--name", default=None, help="results file stem (default sweep-<preset>)")
    p.add_argument("--resume", action="store_true",
                   help="keep the points already in the results file; run only the missing ones")
    p.add_argument("--sample", action="store_true",
                   help="the main job's sample: a plugin that compiles each shape anew times "
                        "every other length at the grid's usual head count (suite/conformance/sample.py); "
                        "the points it leaves are recorded as not measured, with the reason")
    p.add_argument("--memory-budget", dest="memory_budget", type=float, default=None,
                   metavar="GB", help="skip points predicted to need more (default 50%% of free)")
    p.add_argument("--threads", type=int, default=None, help="BLAS/torch threads (default: cores)")
    p.add_argument("--max-time", dest="max_time", type=float, default=None,
                   help="pytest-benchmark max seconds per point")
    p.add_argument("--min-rounds", dest="min_rounds", type=int, default=None)
    p.add_argument("--timeout", type=float, default=POINT_TIMEOUT_S, metavar="SECONDS",
                   help="a point taking longer is recorded as a timeout and the sweep goes on "
                        f"(pytest-timeout; default {POINT_TIMEOUT_S:.0f}, 0 = none)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar with an ETA (default: when stderr is a terminal)")
    p.add_argument("--brief", action="store_true",
                   help="no line per point, only what went wrong and the summary (the points "
                        "are in the results file and the report; the main job's output)")
    p.add_argument("--stop-after", dest="stop_after", type=int, default=None,
                   help=argparse.SUPPRESS)  # tests: stop as if interrupted after N points


def arguments(**values: Any) -> argparse.Namespace:
    """The sweep's arguments with their defaults, and ``values`` (checked like the command
    line's by ``preflight``): how another command (``run``, fidelity) starts a sweep."""
    parser = argparse.ArgumentParser(prog="mha-suite sweep")
    add_arguments(parser)
    args = parser.parse_args([])
    unknown = sorted(set(values) - set(vars(args)))
    if unknown:
        raise TypeError(f"not sweep arguments: {', '.join(unknown)}")
    vars(args).update(values)
    return args


def grid(args: argparse.Namespace) -> Dict[str, Any]:
    """The preset's points with the command line's overrides applied, as plain data."""
    preset = PRESETS[args.preset]
    overrides = {a: getattr(args, a, None) for a in AXES if getattr(args, a, None)}
    if getattr(args, "grad", False):
        overrides["grad"] = [True]
    if "mask" in overrides:
        overrides["mask"] = [MASK_ALIASES.get(m, m) for m in overrides["mask"]]
    for axis, known in (("mask", MASKS), ("dtype", DTYPES)):
        bad = sorted(set(overrides.get(axis, [])) - set(known))
        if bad:
            raise argparse.ArgumentTypeError(
                f"--{axis}: expected some of {', '.join(known)}, got {', '.join(bad)}")
    for axis in ("lengths", "heads", "kv_heads", "batch", "head_dim"):
        bad = [v for v in overrides.get(axis, []) if v < 1]
        if bad:
            raise argparse.ArgumentTypeError(f"--{axis.replace('_', '-')}: expected positive "
                                             f"integers, got {', '.join(map(str, bad))}")
    points = []
    for block in preset["blocks"]:
        axes = {"kv_heads": [None], "grad": [False], **preset["defaults"], **block, **overrides}
        for values in itertools.product(*(axes[a] for a in AXES)):
            a = dict(zip(AXES, values))
            if a["kv_heads"] is not None and a["heads"] % a["kv_heads"]:
                raise argparse.ArgumentTypeError(
                    f"--kv-heads {a['kv_heads']} does not divide heads {a['heads']}")
            point = dataclasses.asdict(Point(
                B=a["batch"], L=a["lengths"], H=a["heads"], K=a["kv_heads"] or 0,
                D=a["head_dim"], dtype=a["dtype"], mask=a["mask"], device=a["device"],
                grad=a["grad"]))  # plain data: the spec travels to pytest as JSON
            if point not in points:
                points.append(point)
    timing = dict(preset["timing"])
    for k in ("max_time", "min_rounds"):
        if getattr(args, k, None) is not None:
            timing[k] = getattr(args, k)
    return {"preset": args.preset, "points": points, "timing": timing,
            "sample_compiled": preset.get("sample_compiled", "every_other")}


def point_problem(point: Point):
    """The seeded problem of a sweep point (E = H * D; S = L for the presets' points)."""
    import numpy as np

    from suite.spec.problem import Mask, make_problem

    B, S = point.B, point.S
    mask = {"none": Mask(), "causal": Mask(causal=True),
            # key padding: a quarter of the keys padded out in every other batch item
            "valid_lens": Mask(valid_lens=np.array([S if b % 2 == 0 else max(1, 3 * S // 4)
                                                    for b in range(B)]))}
    return make_problem(0, B, point.L, S, point.E, point.H, point.K, mask=mask[point.mask])


def results_path(args: argparse.Namespace) -> Path:
    part = f"-{args.shard[0]}of{args.shard[1]}" if getattr(args, "shard", None) else ""
    return Path(args.out) / f"{args.name or 'sweep-' + args.preset}{part}.json"


def preflight(args: argparse.Namespace) -> Dict[str, Any]:
    """Check everything the sweep needs before any point is measured; the grid spec.

    Raises InputError, ResultsError, argparse.ArgumentTypeError or a registry error,
    each one line naming the argument.
    """
    from suite import preflight as check
    from suite.plugins import registry
    from suite.results import records

    # The arguments first: a bad one is said before the registry probes any library.
    spec = grid(args)
    check.positive(args.threads, "--threads")
    check.positive(args.min_rounds, "--min-rounds")
    check.positive(args.max_time, "--max-time", integer=False)
    check.positive(args.memory_budget, "--memory-budget", integer=False)
    check.positive(args.timeout, "--timeout", integer=False, zero_ok=True)
    entries = check.usable_entries(registry.shared(args.plugin), args.impl)
    swept = sorted({p["device"] for p in spec["points"]})
    if args.shard:
        shard.check_has_work([(e.name, d) for e in entries for d in e.impl.devices()
                              if any(d.startswith(s) for s in swept)], *args.shard)
    check.devices(entries, swept, "--device" if args.device else f"--preset {args.preset} (device)")
    records.check_writable(results_path(args), "--out", kind="sweep")
    return spec


def run(args: argparse.Namespace) -> int:
    """Run the sweep in this process; each finished point is merged into the results file."""
    import pytest

    from suite.plugins import registry
    from suite.plugins.selection import Selection
    from suite.results import records
    from suite.spec.problem import InputError
    from suite.sweep.session import SweepSession

    try:
        spec = preflight(args)
    except (registry.PluginError, registry.UnknownImplementation, InputError,
            records.ResultsError, argparse.ArgumentTypeError) as exc:
        print(f"mha-suite: error: {exc}", file=sys.stderr)
        return 2
    out = results_path(args)  # existing points are kept; a point measured again replaces its own
    spec.update(out=str(out), resume=bool(args.resume), threads=args.threads,
                memory_budget_gb=args.memory_budget, stop_after=args.stop_after,
                shard=args.shard, sample=bool(getattr(args, "sample", False)),
                progress=sys.stderr.isatty() if args.progress is None else args.progress,
                brief=bool(getattr(args, "brief", False)))
    # The device option filters the devices an implementation offers; the grid's points
    # name the device prefixes, so the selection's devices stay empty here.
    session = SweepSession(spec, Selection(impl=tuple(args.impl), plugins=tuple(args.plugin)))
    t = spec["timing"]
    from suite.plugins.selection import only_plugins

    pytest_args = ["--pyargs", "suite.sweep.benchmarks",
                   *only_plugins("pytest_benchmark.plugin", "pytest_timeout"),
                   "-o", "addopts=", "-p", "no:terminal", "--capture=no",
                   "--benchmark-warmup=on",
                   f"--benchmark-warmup-iterations={t['warmup_iterations']}",
                   f"--benchmark-max-time={t['max_time']}",
                   f"--benchmark-min-rounds={t['min_rounds']}", "--benchmark-disable-gc",
                   "--benchmark-sort=name", f"--timeout={args.timeout or 0}",
                   *session.selection.pytest_args()]
    # The sweep is its own pytest session, never a distributed one: pytest-xdist's variables
    # inherited from a pytest run that launched it (a test, a CI job under -n) would make
    # pytest-benchmark switch itself off, and every point would have no timing.
    inherited = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("PYTEST_XDIST_")}
    try:
        code = int(pytest.main(pytest_args, plugins=[session]))
    finally:
        os.environ.update(inherited)
    for line in session.not_measured_lines():  # a brief sweep's, one per reason
        print(line)
    if session.save_error:
        return 1  # said in one line by the session; the points saved before are kept
    if code == pytest.ExitCode.INTERRUPTED:
        return 130  # the session said so, and which points were kept
    counts = session.not_measured_counts()
    if counts:
        print("not measured: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    failed = sum(counts[s.value] for s in FAILED_STATUSES)
    written = session.written or out
    if written.exists():
        print(f"sweep results: {written.resolve()}")
    # 0 ok; 5 nothing to run (e.g. everything resumed); 130 interrupted (points kept);
    # 1 when a point raised, timed out or returned an invalid output (recorded; the
    # other points were measured).
    if code not in (0, 5):
        return code
    return 1 if failed else 0
