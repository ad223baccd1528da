"""The agreement rule's false-alarm rate is zero: every agreement case over 200 seeds on
the reference implementations (correct by assumption) passes; and the rule still fails
wrong implementations.

The full sweep (``suite.false_alarms``) is marked slow and runs in CI (``pytest tests``):
about 36 cases x 200 seeds x 4 implementations, measured at 8 to 13 min on a loaded 2-core
machine with one thread per library (README, "The agreement rule's false-alarm rate").
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from suite import cases, false_alarms, oracle
from suite.agreement import compare
from tests.conftest import ROOT

SEEDS = 200
# One thread per library: the verdicts do not depend on it (the rule is BLAS- and
# thread-independent), and the many tiny calls run fastest without thread hand-offs.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}


@pytest.mark.slow
def test_no_false_alarm_over_200_seeds_per_case():
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    proc = subprocess.run([sys.executable, "-m", "suite.false_alarms", "--seeds", str(SEEDS)],
                          capture_output=True, text=True, cwd=ROOT, timeout=3000,
                          env={**os.environ, **ONE_THREAD})
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert "0 fails in " in proc.stdout and f"{SEEDS} seeds" in proc.stdout, tail


def test_sweep_counts_a_wrong_implementation_on_every_seed():
    """The sweep can fail: an implementation that drops the scale fails each seed."""
    from tests.plugins.wrong_scale import ForgetsScale

    case = cases.get("numerics", "explicit_scale")
    (bug,) = false_alarms.sweep_case(case, {"bug": ForgetsScale()}, seeds=5)
    assert (bug.seeds, bug.fails) == (5, 5)
    assert bug.worst > 1


def test_large_logits_seed_lottery_no_longer_decides_the_verdict():
    """numerics/large_logits, seed case.seed + 16: logits in the thousands; both naive orders
    happen to round luckily (err 9.2e-5), so the naive rule alone (2 x naive + atol) fails
    torch's plain float32 computation (err 2.0e-4), while the first-order bound says what
    float32 rounding there may do (2.3e-4)."""
    torch = pytest.importorskip("torch")
    case = cases.get("numerics", "large_logits")
    p = case.build(case.seed + 16).validate()
    ref, _ = oracle.oracle(p)
    naive = [b[0] for b in oracle.baselines(p, "float32")]
    model, _ = oracle.first_order(p, "float32")
    from implementations.torch_eager import TorchEager
    from suite.plugin import call

    with torch.inference_mode():
        got = call(TorchEager(), p, "cpu", "float32").output
    old = compare("output", got, ref, naive, "float32")
    new = compare("output", got, ref, naive, "float32", model=model)
    assert not old.passed, old.describe()  # the old rule's false alarm
    assert new.passed, new.describe()
    assert new.err_model > new.err_naive


def test_first_order_bound_scales_with_the_logits_and_stays_below_the_naive_error_elsewhere():
    """The bound grows with |logits| (condition): relative to the output's size it is over
    ten times larger on the x30 inputs of numerics/large_logits than on masking/none."""
    none = cases.get("masking", "none")
    p = none.problem()
    model, _ = oracle.first_order(p, "float32")
    ref, _ = oracle.oracle(p)
    assert float(model.max()) > 0
    large = cases.get("numerics", "large_logits").problem()
    m_large = float(oracle.first_order(large, "float32")[0].max())
    scale = max(1.0, float(np.abs(oracle.oracle(large)[0]).max()))
    m_p = float(model.max()) / max(1.0, float(np.abs(ref).max()))
    assert m_large / scale > 10 * m_p  # relative to the output's size: x30 inputs, worse condition


def test_first_order_bound_is_per_dtype():
    p = cases.get("masking", "bias").problem()
    m32 = float(oracle.first_order(p, "float32")[0].max())
    m16 = float(oracle.first_order(p, "float16")[0].max())
    assert m16 == pytest.approx(m32 * 2.0**13, rel=1e-9)  # u(float16) / u(float32) = 2^13
    with pytest.raises(KeyError):
        oracle.first_order(p, "float8")
