"""nox sessions: tests, conformance, bench, fidelity, report, run, lint, compat (+ GPU variants).

CPU sessions install through constraints/cpu.txt, which pins the CPU build of
torch; the GPU sessions install without it and are not run by default.
"""

from __future__ import annotations

import os
from pathlib import Path

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


# What CI's check leaves to `mha-suite check` (which runs everything): outside float32, the
# compiled plugins' cases with shapes of their own (a compile per shape: tiles and
# special_values, about 15 min of CPU for torch.compile and 25 for torch.flex over their
# dtypes; the one-query NaN padding case and torch.flex's window forms, about 70 s more),
# and the interpreted kernels (pallas.*, triton.flash on cpu-interpret), whose other dtypes
# were checked when they were added (README). Every plugin keeps its whole float32 matrix
# here, the interpreted kernels included, and every other family in every dtype.
COMPILED_OWN_SHAPES = "tiles or special_values or nan_padding_one_query or local_window or chunked_causal"
CI_CHECK_SELECTION = (f"not (({COMPILED_OWN_SHAPES}) and (compile or flex) and not float32)"
                      " and not (interpret and not float32)")


@nox.session
def tests(session: nox.Session) -> None:
    """Harness tests, conformance of every available implementation, and a ci-preset sweep."""
    install(session)
    session.run("mha-suite", "list")
    # The harness tests on one pytest-xdist worker per core; worksteal rebalances the tail (a
    # module of long tests collected last no longer runs alone on one worker).
    # --durations: each run's slowest tests in CI's log (every case keeps 3x under --timeout).
    session.run("pytest", "tests", "-n", "auto", "--dist", "worksteal", "--durations=15",
                *session.posargs)
    session.run("mha-suite", "check", "--json", f"{RESULTS}/ci/conformance.json",
                "-k", CI_CHECK_SELECTION, "--", "--durations=15")
    # Keras binds one backend per process (torch above): its jax backend gets its own run.
    session.run("mha-suite", "check", "--impl", "keras.mha*", "--json",
                f"{RESULTS}/ci/conformance.json", env={"KERAS_BACKEND": "jax"})
    session.run("mha-suite", "sweep", "--preset", "ci", "--out", f"{RESULTS}/ci")
    session.run("mha-suite", "report", f"{RESULTS}/ci", "--out", f"{RESULTS}/ci/report.html")


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance cases; posargs go to pytest (e.g. --impl 'torch.*' -k masking)."""
    install(session)
    session.run("pytest", "--pyargs", "suite.conformance", *session.posargs)


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
    session.run("python", "-m", "suite.fidelity", *session.posargs)


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
    session.run("pytest", "--pyargs", "suite.conformance", "--device", "cuda", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """The HTML report from results files (posargs: files/dirs, --baseline, --out)."""
    install(session, "report")
    session.run("mha-suite", "report", *(session.posargs or [RESULTS]))


# What the main job needs: the built-in frameworks, the report, and Hypothesis (its
# property-based conformance cases); not the linters and test tools of the `dev` extra,
# nor optional frameworks' extras (installed, they would be checked and swept too).
RUN_EXTRAS = "torch,jax,report"
RUN_PACKAGES = ["hypothesis>=6.90"]


@nox.session
def run(session: nox.Session) -> None:
    """The main job: conformance + the default sweep + the HTML report."""
    session.install("-e", f".[{RUN_EXTRAS}]", *RUN_PACKAGES, "-c", CPU_CONSTRAINTS)
    session.run("mha-suite", "run", "--out", RESULTS, *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and the import contracts in pyproject.toml (layers, no cycles, no product
    module importing a test module or a conftest)."""
    session.install("ruff>=0.5", "import-linter>=2.1")
    session.run("ruff", "check", ".", *session.posargs)
    # import-linter reads the packages from the source tree: no install, no frameworks
    session.run("lint-imports", env={"PYTHONPATH": str(ROOT)})


# compat: the lowest versions pyproject declares, read from its extras (">=" taken as "==").
COMPAT_EXTRAS = ("jax", "hf", "keras")
# flax 0.12.8 (its declared minimum) requires jax >= 0.10.0 (its own metadata): the flax
# built-ins are checked on that jax, in a second step.
FLAX_JAX = "0.10.0"
COMPAT_KNOWN = str(ROOT / "suite" / "conformance" / "known_failures_compat.txt")


def declared_minimums(*extras: str) -> list:
    """``name==lowest`` for every ``name>=lowest`` requirement of pyproject's ``extras``
    (jaxlib pinned with jax), torch excepted: it stays on constraints/cpu.txt's CPU wheel."""
    import re

    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for extra in extras:
        for req in project["optional-dependencies"][extra]:
            m = re.match(r"^([A-Za-z0-9_.-]+)>=([0-9][^,;]*)", req)
            if m and m.group(1) != "torch":
                pins[m.group(1)] = m.group(2)
    if "jax" in pins:
        pins["jaxlib"] = pins["jax"]
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


@nox.session(default=False)
def compat(session: nox.Session) -> None:
    """mha-suite check of the jax, Hugging Face, Keras and flax built-ins at the lowest versions
    pyproject declares (torch 2.13 CPU); posargs go to each check (e.g. --dtype float32)."""
    session.install("torch", "-c", CPU_CONSTRAINTS)
    session.install("-e", ".[dev]", *declared_minimums(*COMPAT_EXTRAS))
    check = ["mha-suite", "check", "--known-failures", COMPAT_KNOWN,
             "--json", f"{RESULTS}/compat/conformance.json", *session.posargs]
    session.run("mha-suite", "list", env={"KERAS_BACKEND": "torch"})
    session.run(*check, "--impl", "jax.*", "--impl", "hf.*", "--impl", "keras.mha*",
                env={"KERAS_BACKEND": "torch"})
    session.run(*check, "--impl", "keras.mha*", env={"KERAS_BACKEND": "jax"})
    session.install(*declared_minimums("flax"), f"jax=={FLAX_JAX}", f"jaxlib=={FLAX_JAX}")
    session.run(*check, "--impl", "flax.*")
