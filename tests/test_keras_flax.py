"""The Keras and Flax built-ins: listed when their library is missing, one Keras backend per
process with the others listed and how to run them, and descriptions cached per backend."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from suite.plugins import cache, registry
from suite.results import records
from tests.conftest import ROOT

KERAS_FLAX_BUILTINS = {n: s for n, s in registry.BUILTINS.items() if n.startswith("flax.")}
KERAS_FLAX_FAMILIES = {p: s for p, s in registry.BUILTIN_FAMILIES.items()
                       if p.startswith("keras.")}


def _registry_without(monkeypatch, tmp_path, missing: str) -> registry.Registry:
    """The Keras and Flax built-ins registered in a process where ``missing`` cannot be
    imported (``sys.modules[name] = None`` makes ``import name`` raise ModuleNotFoundError)."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))  # nothing described yet: load them
    monkeypatch.setitem(sys.modules, missing, None)
    for module in ("implementations.keras.mha", "implementations.keras.common",
                   "implementations.jax.flax"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(registry, "BUILTINS", KERAS_FLAX_BUILTINS)
    monkeypatch.setattr(registry, "BUILTIN_FAMILIES", KERAS_FLAX_FAMILIES)
    monkeypatch.setattr(registry, "_FAMILIES", {})
    return registry.build(entry_points=False, env={})


def test_the_builtins_are_registered():
    assert set(KERAS_FLAX_BUILTINS) == {"flax.mha", "flax.mha+weights", "flax.linen[fp32_softmax]"}
    assert set(KERAS_FLAX_FAMILIES) == {"keras.mha*"}


@pytest.mark.parametrize("missing, names", [("flax", ["flax.mha", "flax.mha+weights"]),
                                            ("keras", ["keras.mha*"])])
def test_a_missing_library_lists_its_builtins_with_what_to_install(monkeypatch, tmp_path,
                                                                   missing, names):
    entries = _registry_without(monkeypatch, tmp_path, missing).entries
    for name in names:
        assert not entries[name].available
        assert entries[name].error == (f"{missing} is not installed "
                                       f"(pip install 'mha-suite[{missing}]')")


def test_the_descriptions_cache_is_per_keras_backend_and_jax_64_bit_mode():
    assert registry.descriptions_cache_name({}) == "builtins"
    # JAX's 64-bit mode gives jax.nn float64: its own descriptions, and off is the default's
    assert registry.descriptions_cache_name({"JAX_ENABLE_X64": "1"}) != "builtins"
    assert registry.descriptions_cache_name({"JAX_ENABLE_X64": "0"}) == "builtins"
    assert registry.descriptions_cache_name({"KERAS_BACKEND": "jax"}) != \
        registry.descriptions_cache_name({"KERAS_BACKEND": "torch"})


def test_a_run_that_cannot_run_an_implementation_keeps_another_runs_description(tmp_path):
    path = tmp_path / "conformance.json"
    run = {"machine_info": {}, "commit_info": {}}
    measured = {"name": "keras.mha[torch]", "available": True, "error": None}
    records.merge_conformance(path, run, [measured], [])
    records.merge_conformance(path, run, [{"name": "keras.mha[torch]", "available": False,
                                           "error": "another backend"},
                                          {"name": "keras.mha[jax]", "available": True}], [])
    impls = {i["name"]: i for i in records.read_file(path).doc["implementations"]}
    assert impls["keras.mha[torch]"] == measured
    assert impls["keras.mha[jax]"]["available"]


def _keras_names(backend: str) -> str:
    """The names the Keras family registers, and those it lists as unavailable, in a fresh
    process with KERAS_BACKEND=backend."""
    code = ("from implementations.keras import mha as k; "
            "print([c.name for c in k.variants()]); print(k.DROPPED)")
    env = {**os.environ, "KERAS_BACKEND": backend}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("backend, other", [("jax", "torch"), ("torch", "jax")])
def test_keras_measures_the_backend_of_its_process_and_lists_the_others(backend, other):
    pytest.importorskip("keras")
    pytest.importorskip(backend)
    registered, dropped = _keras_names(backend).splitlines()[-2:]
    assert registered == f"['keras.mha[{backend}]', 'keras.mha[{backend}]+weights']"
    assert f"'keras.mha[{other}]': \"Keras binds one backend per process and this one uses " \
           f"{backend}: run with KERAS_BACKEND={other}" in dropped
    assert f"'keras.mha[{other}]+weights'" in dropped
    assert "'keras.mha[tensorflow]'" in dropped
