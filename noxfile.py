"""nox sessions: tests, check_full, conformance, bench, fidelity, report, run, lint, docs, compat
(+ GPU variants).

CPU sessions install through constraints/cpu.txt, which pins the CPU build of
torch; the GPU sessions install without it and are not run by default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Tuple

import nox

ROOT = Path(__file__).parent
CPU_CONSTRAINTS = str(ROOT / "constraints" / "cpu.txt")
RESULTS = os.environ.get("MHA_SUITE_RESULTS", "mha-results")

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


def install(session: nox.Session, extras: str = "all", gpu: bool = False) -> None:
    """Install mha-suite with ``extras``; CPU wheels unless ``gpu``."""
    args = ["-e", f".[{extras}]"]
    if not gpu:
        args += ["-c", CPU_CONSTRAINTS]
    session.install(*args)


# CI's check runs the covering selection (`--cover`, suite/conformance/cover.py): every built-in on every
# case family in every dtype it has (the main job's sample), every lane length once per
# implementation, and the cases every known-failure entry names; `--strict-declarations`
# fails it where an entry or a known library behaviour held and no case needed it. The whole
# matrix is `nox -s check_full`.
CHECK_CI = ["--cover", "--strict-declarations"]


class Steps:
    """Each step's wall time, printed at the end of a session (also when a step fails), so
    CI's log shows where its budget goes, and recorded in RESULTS/timings/SESSION.json (the
    machine, the commit, each step, how the session ended) for the docs' "Measured" page."""

    def __init__(self, session: nox.Session) -> None:
        self.session, self.times, self.ok = session, [], False
        self.started = time.time()

    def run(self, label: str, *args: str, **kwargs) -> None:
        self.call(label, self.session.run, *args, **kwargs)

    def call(self, label: str, fn, *args, **kwargs) -> None:
        start = time.monotonic()
        try:
            fn(*args, **kwargs)
        finally:
            self.times.append((label, time.monotonic() - start))

    def summary(self, ok: bool) -> None:
        total = sum(t for _, t in self.times)
        lines = [f"{label:<42} {t / 60:6.1f} min" for label, t in self.times]
        self.session.log("step times:\n  " + "\n  ".join(
            [*lines, f"{'total':<42} {total / 60:6.1f} min"]))
        record = {"session": self.session.name, "commit": _commit(), "machine": _machine(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
                  "cache_dir": os.environ.get("MHA_SUITE_CACHE_DIR"),
                  "steps": [{"step": label, "seconds": round(t, 1)} for label, t in self.times],
                  "seconds": round(total, 1), "passed": ok}
        path = Path(RESULTS) / "timings" / f"{self.session.name}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1) + "\n")
        except OSError as exc:  # the times are in the log above; a record is a copy
            self.session.warn(f"timings not recorded in {path}: {exc}")

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.summary(ok=kind is None)


def _commit() -> str:
    """HEAD's short hash, "+changes" when the working tree differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT,
                              timeout=30).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD") or "unknown"
        return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _machine() -> dict:
    """The CPU as /proc/cpuinfo names it, its cores and the vector extensions that set
    torch's kernels (a timing means little without them)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(),
            "flags": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})}


@nox.session
def tests(session: nox.Session) -> None:
    """The manual's strict build, the harness tests, CI's covering conformance check, and a
    ci-preset sweep with its report."""
    with Steps(session) as steps:
        steps.call("install", install, session, "all,docs")
        manual(session, steps)
        ci_steps(session, steps)


def ci_steps(session: nox.Session, steps: Steps) -> None:
    steps.run("mha-suite list", "mha-suite", "list")
    # The harness tests on one pytest-xdist worker per core; worksteal rebalances the tail (a
    # module of long tests collected last no longer runs alone on one worker).
    # --durations: each run's slowest tests in CI's log (every case keeps 3x under --timeout).
    # The tests marked slow (verdicts the same on one thread and all, serially and on xdist
    # workers; no false alarm over 200 seeds a case) run in check_full.
    steps.run("pytest tests", "pytest", "tests", "-n", "auto", "--dist", "worksteal",
              "-m", "not slow", "--durations=15", *session.posargs)
    steps.run("check --cover (native level)", "mha-suite", "check", "--isa", "native",
              *CHECK_CI, "--json", f"{RESULTS}/ci/conformance.json", "--", "--durations=15")
    # Every lower CPU level of torch's kernels (suite.plugins.isa; default and avx2 on an AVX-512
    # CPU, default on an AVX2 one), each in its own process, on the families where a vector
    # width shows (lanes, special values, masking, tiles, layouts).
    steps.run("check --cover (lower levels)", "mha-suite", "check", "--isa", "lower",
              *CHECK_CI, "--json", f"{RESULTS}/ci/conformance.json")
    # Keras binds one backend per process (torch above): its jax backend gets its own run.
    steps.run("check --cover (Keras on jax)", "mha-suite", "check", "--impl", "keras.mha*",
              *CHECK_CI, "--json", f"{RESULTS}/ci/conformance.json",
              env={"KERAS_BACKEND": "jax"})
    # --sample as the main job: a per-shape compiler times every other length at one head
    # count (4 of its 12 points: each point compiles anew, the ci sweep's largest cost).
    steps.run("sweep --preset ci --sample", "mha-suite", "sweep", "--preset", "ci", "--sample",
              "--out", f"{RESULTS}/ci")
    steps.run("report", "mha-suite", "report", f"{RESULTS}/ci",
              "--out", f"{RESULTS}/ci/report.html")


@nox.session(default=False)
def check_full(session: nox.Session) -> None:
    """The harness tests marked slow, then the whole conformance matrix: every case of every
    implementation in every dtype, at every CPU level here (Keras on each backend, jax.nn's
    float64 in JAX's 64-bit mode),
    declarations strict; then its outcomes compared case by case with the previous run's
    (kept as conformance.json.previous: `mha-suite compare`, printed, never failing the
    session), and its report. Run it on a fresh clone before resolving work that changes
    verdicts."""
    out = f"{RESULTS}/full"
    # (not *.json: a report of a folder reads every *.json in it, and would show the old run)
    results, previous = Path(out) / "conformance.json", Path(out) / "conformance.json.previous"
    with Steps(session) as steps:
        steps.call("install", install, session)
        steps.run("pytest tests -m slow", "pytest", "tests", "-n", "auto", "-m", "slow",
                  "--durations=5")
        # The last run's results are moved aside, not merged into: this run's file holds
        # this run's records only, and the comparison sees what each run found.
        if results.exists():
            results.replace(previous)
            session.log(f"the previous run's results: {previous}")
        try:
            steps.run("check (every level)", "mha-suite", "check", "--isa", "all",
                      "--strict-declarations", "--json", str(results),
                      *session.posargs, "--", "--durations=15")
            steps.run("check (Keras on jax)", "mha-suite", "check", "--impl", "keras.mha*",
                      "--strict-declarations", "--json", str(results),
                      *session.posargs, env={"KERAS_BACKEND": "jax"})
            # JAX's 64-bit mode is process-wide: jax.nn's float64 in a run of its own.
            steps.run("check (jax.nn in float64)", "mha-suite", "check", "--impl", "jax.nn",
                      "--dtype", "float64", "--strict-declarations", "--json", str(results),
                      *session.posargs, env={"JAX_ENABLE_X64": "1"})
        finally:  # also after a check that failed: which outcomes changed is the question
            if previous.exists() and results.exists():
                steps.run("compare with the previous run", "mha-suite", "compare",
                          str(previous), str(results), success_codes=[0, 1])
        steps.run("report", "mha-suite", "report", out, "--out", f"{out}/report.html")


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance cases; posargs go to pytest (e.g. --impl 'torch.*' -k masking)."""
    install(session)
    session.run("pytest", "--pyargs", "suite.conformance.tests", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """A sweep (default preset); posargs go to `mha-suite sweep`."""
    session.install("-e", f".[{RUN_EXTRAS}]", "-c", CPU_CONSTRAINTS)
    session.run("mha-suite", "sweep", *(session.posargs or ["--preset", "default",
                                                            "--out", RESULTS]))


@nox.session(default=False)
def fidelity(session: nox.Session) -> None:
    """Sweep medians vs torch.utils.benchmark / timeit for one point per framework."""
    install(session)
    session.run("python", "-m", "suite.sweep.fidelity", *session.posargs)


@nox.session(default=False)
def bench_gpu(session: nox.Session) -> None:
    """The gpu preset with CUDA builds of torch and jax (needs a GPU); triton.flash and
    pallas.gpu.flash run compiled there."""
    install(session, "torch,triton,report,dev", gpu=True)
    session.install("jax[cuda12]")
    session.run("mha-suite", "sweep", "--preset", "gpu", *(session.posargs or ["--out", RESULTS]))


@nox.session(default=False)
def conformance_gpu(session: nox.Session) -> None:
    """Conformance on CUDA devices only (needs a GPU): triton.flash and pallas.gpu.flash
    compiled, not interpreted."""
    install(session, "torch,triton,report,dev", gpu=True)
    session.install("jax[cuda12]")
    session.run("pytest", "--pyargs", "suite.conformance.tests", "--device", "cuda", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """The HTML report from results files (posargs: files/dirs, --baseline, --out)."""
    install(session, "report")
    session.run("mha-suite", "report", *(session.posargs or [RESULTS]))


# What the main job needs: the built-in frameworks, the report, and Hypothesis (its
# property-based conformance cases); not the linters and test tools of the `dev` extra, nor
# optional frameworks' extras (installed, they would be checked and swept too). The runtimes
# and export paths (extras onnx, export, openvino) are left out: with them a fresh clone's main
# job ran past 17 min (measured at 7bcfbea; each export path and ov.convert_model converts
# anew per case and per sweep point), against 6 min without. `mha-suite run` in an
# environment that has them runs them too.
RUN_EXTRAS = "torch,jax,report"
RUN_PACKAGES = ["hypothesis>=6.90"]


@nox.session
def run(session: nox.Session) -> None:
    """The main job: conformance + the default sweep + the HTML report."""
    with Steps(session) as steps:
        steps.call("install", session.install, "-e", f".[{RUN_EXTRAS}]", *RUN_PACKAGES,
                   "-c", CPU_CONSTRAINTS)
        steps.run("mha-suite run", "mha-suite", "run", "--out", RESULTS, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and the import contracts in pyproject.toml (layers, no cycles, no product module
    importing a test module or a conftest); no framework installed (seconds)."""
    with Steps(session) as steps:
        steps.call("install", session.install, "ruff>=0.5", "import-linter>=2.1")
        steps.run("ruff", "ruff", "check", ".", *session.posargs)
        # import-linter reads the packages from the source tree: no install, no frameworks
        steps.run("import contracts", "lint-imports", env={"PYTHONPATH": str(ROOT)})


@nox.session(name="docs")
def docs_session(session: nox.Session) -> None:
    """The manual alone (``nox -s tests`` builds it too, in its own environment)."""
    with Steps(session) as steps:
        steps.call("install", install, session, "all,docs")
        manual(session, steps)


def manual(session: nox.Session, steps: Steps) -> None:
    """The manual: ``mkdocs build --strict`` (offline; a broken link or a missing page fails).
    Its reference pages and findings catalogue are generated from the registry, so it builds
    where the frameworks are installed (the tests session's environment: one install of them
    for both; a missing one lists its built-ins as unavailable)."""
    steps.run("manual (mkdocs build --strict)", "mkdocs", "build", "--strict",
              "--site-dir", str(ROOT / "site"),
              env={"DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1",
                   "PYTHONPATH": str(ROOT)})


# compat: a version matrix. Every version inside a declared range must work, so each
# framework is checked at its declared minimum (read from pyproject), at versions in the
# middle of its range, and at the newest pip installs beside constraints/cpu.txt; one nox
# session per (framework, version): `nox -s compat` runs them all, `nox -s "compat(hf-5.3.0)"`
# one. torch stays constraints/cpu.txt's CPU wheel. Each run writes its own results file,
# RESULTS/compat/<framework>-<installed versions>/conformance*.json, which
# `mha-suite report RESULTS/compat` merges (its "versions" table: outcomes per library version).
COMPAT_KNOWN = str(ROOT / "suite" / "conformance" / "known_failures_compat.toml")


@dataclasses.dataclass(frozen=True)
class CompatFramework:
    extra: str  # the pyproject extra whose requirement declares the range
    dist: str  # the distribution the range is about
    impls: Tuple[str, ...]  # the built-ins it provides (--impl globs)
    # Versions strictly inside the range (chosen by hand: a release where an API the adapters
    # read changed, or the range's midpoint); empty where the index holds none (said why).
    middle: Tuple[str, ...]
    torch: bool = False  # installs torch (constraints/cpu.txt's CPU wheel)
    backends: Tuple[str, ...] = ("",)  # KERAS_BACKEND per check ("" = not set)


COMPAT_FRAMEWORKS = {
    # jax >= 0.4.30: 0.4.31 brought jax.nn.dot_product_attention (jax.nn unavailable before
    # it), 0.6.2 is the middle of 0.4.30..0.10.2.
    "jax": CompatFramework("jax", "jax", ("jax.*",), ("0.4.31", "0.6.2")),
    # transformers >= 5.0: 5.3.0 is the last release before GPT2Attention kept a `scaling`
    # attribute (5.4), 5.12.0 the middle of 5.0..5.24.
    "hf": CompatFramework("hf", "transformers", ("hf.*",), ("5.3.0", "5.12.0"), torch=True),
    # keras >= 3.15, < 4: the index holds 3.15.0 and 3.15.1 only, so no middle release.
    "keras": CompatFramework("keras", "keras", ("keras.mha*",), (), torch=True,
                             backends=("torch", "jax")),
    # flax >= 0.12.8, < 0.13: 0.12.8 is the only release in the range the index holds (later
    # 0.12.x need a jax newer than constraints/cpu.txt's); its minimum runs on the lowest jax it
    # accepts (FLAX_MIN_JAX), its newest on the newest jax.
    "flax": CompatFramework("flax", "flax", ("flax.*",), ()),
    # onnxruntime >= 1.23: 1.23 is the first with the ONNX Attention op (opset 23; opset 24 from
    # 1.24, measured: 1.22 refuses both), 1.27.0 the middle of 1.23..1.32.
    "onnxruntime": CompatFramework("onnx", "onnxruntime", ("onnxruntime.*",), ("1.24.1", "1.27.0")),
    # onnx >= 1.19: onnx.reference's Attention (opset 23) from 1.18 reshapes 3-D inputs into
    # heads without a transpose and takes only an (L, S) attn_mask (measured: 139 of 143 float32
    # cases failed); 1.20.1 is the middle of 1.19..1.23.
    "onnx": CompatFramework("onnx", "onnx", ("onnx.reference*",), ("1.20.1",)),
    # openvino >= 2025.0: its ScaledDotProductAttention op and ov.convert_model of torch modules;
    # 2025.4.1 is the middle of 2025.0..2026.4.
    "openvino": CompatFramework("openvino", "openvino", ("openvino.*",), ("2025.4.1",),
                                torch=True),
    # executorch >= 1.4: the first whose runtime loads beside torch 2.13 (1.1 to 1.3 install but
    # their pybindings miss a c10 symbol); 1.5.0 the middle of 1.4.0..1.5.1.
    "executorch": CompatFramework("executorch", "executorch", ("export.executorch*",), ("1.5.0",),
                                  torch=True),
}
# flax 0.12.8 (its declared minimum) requires jax >= 0.10.0 (its own metadata).
FLAX_MIN_JAX = "0.10.0"
NEWEST = "newest"


def declared_minimums(*extras: str) -> list:
    """``name==lowest`` for every requirement of pyproject's ``extras`` with a ``>=`` bound
    (jaxlib pinned with jax), torch excepted: it stays on constraints/cpu.txt's CPU wheel."""
    from packaging.requirements import Requirement

    extras_of = nox.project.load_toml(ROOT / "pyproject.toml")["project"]["optional-dependencies"]
    pins = {}
    for extra in extras:
        for req in map(Requirement, extras_of[extra]):
            lowest = [spec.version for spec in req.specifier if spec.operator == ">="]
            if lowest and req.name != "torch":
                pins[req.name] = lowest[0]
    if "jax" in pins:
        pins["jaxlib"] = pins["jax"]
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def declared_minimum(framework: str) -> str:
    """The lowest version pyproject declares for ``framework``'s distribution."""
    fw = COMPAT_FRAMEWORKS[framework]
    pin = next(p for p in declared_minimums(fw.extra) if p.startswith(f"{fw.dist}=="))
    return pin.split("==")[1]


def compat_matrix() -> List[Tuple[str, str]]:
    """(framework, version) per compat session: the declared minimum, the middle versions,
    and NEWEST (whatever pip resolves beside constraints/cpu.txt)."""
    return [(name, v) for name, fw in COMPAT_FRAMEWORKS.items()
            for v in (declared_minimum(name), *fw.middle, NEWEST)]


def compat_pins(framework: str, version: str) -> List[str]:
    """What a compat session installs besides mha-suite: ``dist==version`` (jaxlib beside jax;
    flax's minimum on the lowest jax it accepts), or the extra's own range for NEWEST."""
    fw = COMPAT_FRAMEWORKS[framework]
    if version == NEWEST:
        return []
    pins = [f"{fw.dist}=={version}"]
    if fw.dist == "jax":
        pins.append(f"jaxlib=={version}")
    if fw.dist == "flax" and version == declared_minimum(framework):
        pins += [f"jax=={FLAX_MIN_JAX}", f"jaxlib=={FLAX_MIN_JAX}"]
    return pins


def compat_constraints(pins: List[str], out: Path) -> str:
    """constraints/cpu.txt less the lines about pinned distributions (its jax/flax caps would
    refuse an older pin; torch's CPU wheel stays), written to ``out``."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    def about(line: str) -> Optional[str]:
        """The distribution a constraints line names (None: a comment, a blank or an option)."""
        try:
            return canonicalize_name(Requirement(line.split("#")[0].strip()).name)
        except InvalidRequirement:
            return None

    pinned = {canonicalize_name(p.split("==")[0]) for p in pins}
    lines = [line for line in Path(CPU_CONSTRAINTS).read_text().splitlines()
             if about(line) not in pinned]
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def _installed(session: nox.Session, *dists: str) -> Optional[str]:
    """``dist-version`` of each installed distribution, joined by "-" (None when the session
    only installs)."""
    code = ("import importlib.metadata as m, sys; "
            "print('-'.join(f'{d}-{m.version(d)}' for d in sys.argv[1:]))")
    out = session.run("python", "-c", code, *dists, silent=True)
    return None if out is None else out.strip().splitlines()[-1]


@nox.session(default=False)
@nox.parametrize("framework,version", compat_matrix(),
                 ids=[f"{f}-{v}" for f, v in compat_matrix()])
def compat(session: nox.Session, framework: str, version: str) -> None:
    """mha-suite check of one framework's built-ins at one version of its declared range
    (torch 2.13 CPU); posargs go to each check (e.g. --dtype float32)."""
    fw = COMPAT_FRAMEWORKS[framework]
    pins = compat_pins(framework, version)
    constraints = (CPU_CONSTRAINTS if not pins else
                   compat_constraints(pins, Path(session.create_tmp()) / "constraints.txt"))
    packages = ["torch"] if fw.torch else []
    if framework == "keras":
        packages.append("jax")  # its jax backend
    session.install("-e", f".[{fw.extra}]", "hypothesis>=6.90", *packages, *pins,
                    "-c", constraints)
    label = _installed(session, fw.dist, *(["jax"] if framework == "flax" else []))
    if label is None:  # --install-only
        return
    out = Path(RESULTS) / "compat" / label
    for backend in fw.backends:
        env = {"KERAS_BACKEND": backend} if backend else {}
        name = f"conformance-{backend}.json" if backend else "conformance.json"
        session.run("mha-suite", "list", env=env)
        session.run("mha-suite", "check", "--known-failures", COMPAT_KNOWN,
                    "--json", str(out / name), *(a for g in fw.impls for a in ("--impl", g)),
                    *session.posargs, env=env)
