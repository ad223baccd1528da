"""The compat version matrix (noxfile.py's ``compat`` sessions): every framework is checked at
its declared minimum, inside its range and at the newest release, each run into its own
results file."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any, List

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def noxfile():
    pytest.importorskip("nox")
    spec = importlib.util.spec_from_file_location("mha_noxfile", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _declared(extra: str, dist: str) -> List[str]:
    """The specifiers pyproject's ``extra`` puts on ``dist`` (e.g. [">=3.15", "<4"])."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    req = next(r for r in project["optional-dependencies"][extra]
               if re.match(rf"^{re.escape(dist)}\s*[<>=!~]", r))
    return [s.strip() for s in req[len(dist):].split(",")]


def _release(v: str):
    return tuple(int(x) for x in v.split("."))


def _within(version: str, specs: List[str]) -> bool:
    ops = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
           "<=": lambda a, b: a <= b, "==": lambda a, b: a == b}
    for s in specs:
        op, bound = re.match(r"^(>=|<=|==|<|>)(.+)$", s).groups()
        n = max(len(_release(version)), len(_release(bound)))
        a, b = (_release(x) + (0,) * (n - len(_release(x))) for x in (version, bound))
        if not ops[op](a, b):
            return False
    return True


FRAMEWORKS = {"jax": ("jax", "jax"), "hf": ("hf", "transformers"), "keras": ("keras", "keras"),
              "flax": ("flax", "flax"), "onnxruntime": ("onnx", "onnxruntime"),
              "onnx": ("onnx", "onnx"), "openvino": ("openvino", "openvino"),
              "executorch": ("executorch", "executorch")}


def test_the_matrix_holds_minimum_middle_and_newest_of_every_framework(noxfile):
    matrix = noxfile.compat_matrix()
    assert {f for f, _ in matrix} == set(FRAMEWORKS)
    for framework, (extra, dist) in FRAMEWORKS.items():
        versions = [v for f, v in matrix if f == framework]
        specs = _declared(extra, dist)
        minimum = next(s[2:] for s in specs if s.startswith(">="))
        assert versions[0] == minimum, framework  # read from pyproject, not restated
        assert versions[-1] == noxfile.NEWEST, framework
        middle = versions[1:-1]
        for v in middle:  # strictly inside the declared range
            assert _within(v, specs) and _release(v) > _release(minimum), (framework, v)
        assert len(set(versions)) == len(versions), framework
        # many releases: a middle one
        if framework in ("jax", "hf", "onnxruntime", "onnx", "openvino", "executorch"):
            assert middle, framework
    # 5.3.0 is the last transformers before GPT2Attention kept a `scaling` attribute
    assert ("hf", "5.3.0") in matrix


def test_a_minimum_pin_drops_only_the_pinned_caps_from_the_constraints(noxfile, tmp_path):
    pins = noxfile.compat_pins("jax", noxfile.declared_minimum("jax"))
    assert pins == ["jax==0.4.30", "jaxlib==0.4.30"]
    text = Path(noxfile.compat_constraints(pins, tmp_path / "c.txt")).read_text()
    assert "torch==2.13.0" in text.splitlines()  # the CPU wheel stays
    assert not re.search(r"^jax(lib)?\b", text, re.M)
    assert re.search(r"^flax\b", text, re.M)
    assert noxfile.compat_pins("hf", noxfile.NEWEST) == []  # the newest: pip resolves it
    flax_min = noxfile.compat_pins("flax", noxfile.declared_minimum("flax"))
    assert f"jax=={noxfile.FLAX_MIN_JAX}" in flax_min


class FakeSession:
    """Records what a compat session installs and runs; `python -c` answers ``installed``."""

    def __init__(self, tmp: Path, installed: str) -> None:
        self.tmp, self.installed = tmp, installed
        self.installs: List[tuple] = []
        self.runs: List[tuple] = []
        self.posargs = ["--dtype", "float32"]

    def create_tmp(self) -> str:
        return str(self.tmp)

    def install(self, *args: Any, **kw: Any) -> None:
        self.installs.append(args)

    def run(self, *args: Any, env=None, silent=False):
        self.runs.append((args, env or {}))
        return self.installed + "\n" if args[0] == "python" else None


def _checks(session: FakeSession) -> List[tuple]:
    return [(a, env) for a, env in session.runs if a[:2] == ("mha-suite", "check")]


@pytest.mark.parametrize("framework,version,installed,files", [
    ("hf", "5.3.0", "transformers-5.3.0", ["transformers-5.3.0/conformance.json"]),
    ("keras", "newest", "keras-3.15.1", ["keras-3.15.1/conformance-torch.json",
                                         "keras-3.15.1/conformance-jax.json"]),
    ("flax", "0.12.8", "flax-0.12.8-jax-0.10.0", ["flax-0.12.8-jax-0.10.0/conformance.json"]),
    ("executorch", "1.4", "executorch-1.4.0", ["executorch-1.4.0/conformance.json"]),
])
def test_each_session_writes_its_own_results_file(noxfile, tmp_path, framework, version,
                                                  installed, files):
    session = FakeSession(tmp_path, installed)
    noxfile.compat(session, framework=framework, version=version)
    (install,) = session.installs
    assert "-c" in install
    for pin in noxfile.compat_pins(framework, version):
        assert pin in install
    checks = _checks(session)
    assert [Path(a[a.index("--json") + 1]).relative_to(Path(noxfile.RESULTS) / "compat")
            for a, _ in checks] == [Path(f) for f in files]
    for args, _ in checks:
        assert args[args.index("--known-failures") + 1] == noxfile.COMPAT_KNOWN
        assert args[-2:] == ("--dtype", "float32")  # posargs reach each check
        for glob in noxfile.COMPAT_FRAMEWORKS[framework].impls:
            assert ("--impl", glob) in zip(args, args[1:])
    if framework == "keras":
        assert [env["KERAS_BACKEND"] for _, env in checks] == ["torch", "jax"]
    if framework == "executorch":  # the export path runs on torch: the CPU wheel beside it
        assert "torch" in install and ".[executorch]" in install


def test_every_compat_known_failure_says_where_it_holds():
    # Known failures at old versions must not hide a bug in another: each is keyed by version.
    from suite.conformance.known_failures import read_records

    records = read_records(ROOT / "suite" / "conformance" / "known_failures_compat.toml")
    assert records
    for r in records:
        assert r.condition is not None and r.condition.versions, r.name
        assert re.search(r"\d+\.\d+", r.versions), r.name  # the measured version


def test_jax_nn_declares_the_forms_its_installed_signature_takes(monkeypatch):
    # jax 0.4.31's dot_product_attention has no sequence lengths and no window: those forms
    # are not declared there, and the forms it does take must not be handed keywords it lacks.
    jax = pytest.importorskip("jax")
    np = pytest.importorskip("numpy")
    from implementations.jax import nn as jax_nn
    from suite.conformance.families import mask_forms

    real = jax.nn.dot_product_attention

    def old(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
            implementation=None):  # jax 0.4.31's signature
        return real(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                    implementation=implementation)

    taken = jax_nn.forms_taken(frozenset(inspect.signature(old).parameters))
    assert {"bool_B1LS", "float_BHLS", "causal_flag", "causal_flag+bool_B11S"} <= taken
    assert not {f for f in taken if "lengths" in f or "window" in f}
    assert jax_nn.forms_taken(jax_nn.keywords()) <= jax_nn.JAX_NN_FORMS
    problem = mask_forms.build("causal_flag+bool_B11S", 0)
    expected = _run(jax_nn.JaxNN(), problem)
    monkeypatch.setattr(jax.nn, "dot_product_attention", old)
    np.testing.assert_array_equal(_run(jax_nn.JaxNN(), problem), expected)


def _run(impl, problem):
    state = impl.prepare(problem, "cpu", "float32")
    handle = impl.run(state)
    impl.synchronize(state)
    return impl.fetch(state, handle).output
