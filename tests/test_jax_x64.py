"""jax.nn in float64 (#50 item 7): JAX's 64-bit mode is process-wide (JAX_ENABLE_X64=1), so
float64 runs in a process of its own (``nox -s check_full`` has a step for it). There its
softmax runs in float32 (``_dot_product_attention_core``), declared as float64_softmax=float32:
the output and the gradients pass against float32-softmax baselines, and the same library
without the declaration fails."""

import json

import pytest

from tests.conftest import PLUGINS

pytest.importorskip("jax")

# (random_inference's draws reach a one-dimension decode problem whose error is the weights'
# cast to float32 alone: the first-order bound's term for it under the policy)
CASES = ("masking/causal or masking/fully_masked_bool_row or (test_gradient and plain) or "
         "test_random_inference")


def test_jax_nn_in_float64_declares_its_float32_softmax_and_without_it_fails(cli, tmp_path):
    out = tmp_path / "c.json"
    proc = cli("check", "--impl", "jax.nn", "--plugin", str(PLUGINS / "jax_x64_planted.py"),
               "--impl", "x64.undeclared", "--dtype", "float64", "--workers", "0",
               "--json", str(out), "-k", CASES, "--no-progress",
               env={"JAX_ENABLE_X64": "1"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    records = json.loads(out.read_text())["results"]
    got = {(r["impl"], f"{r['family']}/{r['case']}"): r for r in records}
    for case in ("masking/causal", "masking/fully_masked_bool_row", "gradients/plain"):
        declared, undeclared = got[("jax.nn", case)], got[("x64.undeclared", case)]
        assert declared["dtype"] == "float64"
        assert declared["outcome"] == "deviation", (case, declared["reason"])
        assert "float64_softmax" in declared["policies_used"], case
        assert undeclared["outcome"] == "fail", (case, undeclared["reason"])
    drawn = got[("jax.nn", "hypothesis/random_inference")]
    assert drawn["outcome"] in ("pass", "deviation"), drawn["reason"]
    # the gradients are judged against baselines whose softmax backward runs in float32 too
    assert "float64_softmax=float32" in got[("jax.nn", "gradients/plain")]["reason"]


def test_without_64_bit_mode_jax_nn_takes_no_float64(cli):
    proc = cli("check", "--impl", "jax.nn", "--dtype", "float64", "--workers", "0",
               env={"JAX_ENABLE_X64": "0"})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--dtype" in proc.stderr and "float64" in proc.stderr
