"""KerasModuleCore: a Keras layer of the process's backend as a plugin. Fused and nested
projections go in and come back (weights and gradients), an unbuilt layer is built on the
inputs, the cases catch a layer that reads its fused projection in the wrong order, a wrong
``layers`` path is one line, and the other backend (a process of its own) runs the same."""

from __future__ import annotations

import json

import pytest

from suite.conformance import catalog
from suite.conformance.judge import run_case
from suite.plugins import registry
from suite.spec.problem import make_problem
from tests.conftest import PLUGINS

pytest.importorskip("implementations.keras.common")  # keras on this process's backend

FUSED = str(PLUGINS / "keras_fused.py")


def _entries():
    return registry.build(plugins=[FUSED], builtins=False, entry_points=False, env={}).entries


def _outcome(name: str, family: str, case: str, dtype: str = "float32"):
    return run_case(_entries()[name].impl, name, "cpu", dtype, catalog.get(family, case))


def test_weights_round_trip_through_a_fused_nested_dense_layer():
    impl = _entries()["kfused.ok"].impl
    assert impl.check_wrapper(make_problem(0, B=2, L=5, E=8, H=2)) == []


@pytest.mark.parametrize("family, case", [("masking", "none"), ("masking", "causal"),
                                          ("masking", "valid_lens"), ("gradients", "plain")])
def test_a_correct_fused_layer_passes(family, case):
    outcome = _outcome("kfused.ok", family, case)
    assert outcome.outcome == "pass", outcome.reason


def test_a_layer_that_reads_its_fused_projection_in_the_wrong_order_fails():
    outcome = _outcome("kfused.k_before_q", "masking", "causal")
    assert outcome.outcome == "fail", outcome.reason


def test_a_layers_path_the_layer_lacks_is_one_line_naming_it():
    outcome = _outcome("kfused.no_such_layer", "masking", "none")
    assert outcome.outcome == "error"
    assert "layers: Attention has no attribute 'output_dense'" in outcome.reason


def test_keras_mha_reads_its_weights_back_and_its_own_mask_arguments_are_unsupported():
    from implementations.keras.mha import KerasMHA

    p = make_problem(0, B=2, L=5, E=8, H=2)
    assert KerasMHA().check_wrapper(p) == []
    with pytest.raises(Exception, match="module_mask returns dict"):
        KerasMHA().check_mask(p)


def test_the_other_backend_runs_the_same_layer(cli, tmp_path):
    """The fused layer on the backend this process does not use: masks and gradients (the
    jitted call in a StatelessScope on jax; the eager call on torch)."""
    from implementations.keras.common import BACKEND

    other = "jax" if BACKEND == "torch" else "torch"
    pytest.importorskip(other)
    out = tmp_path / "c.json"
    proc = cli("check", "--plugin", FUSED, "--impl", "kfused.ok", "--impl", "kfused.k_before_q",
               "--dtype", "float32", "--workers", "0", "--isa", "native", "--json", str(out),
               # the three cases asserted below, each name's ("]" ends a test id: not the
               # other causal cases or gradient problems, 30 cases where 6 are read)
               "-k", "masking/causal] or float32-plain] or wrapper/weights]",
               env={"KERAS_BACKEND": other})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    outcome = {(r["impl"], r["family"], r["case"]): r["outcome"]
               for r in json.loads(out.read_text())["results"]}
    assert outcome[("kfused.ok", "masking", "causal")] == "pass"
    assert outcome[("kfused.ok", "gradients", "plain")] == "pass"
    assert outcome[("kfused.ok", "wrapper", "weights")] == "pass"
    assert outcome[("kfused.k_before_q", "masking", "causal")] == "fail"
