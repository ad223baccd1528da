"""The dropout family (#39 item 5): training mode judged by the draws' mean and spread."""

import dataclasses

import numpy as np
import pytest

from suite.conformance.cases import by_family
from suite.conformance.families.dropout import DRAWS, dropout_problem, dropout_variance, z_for
from suite.spec.problem import InputError
from tests.conftest import planted, run_catalog_case

DROPOUT = [c.name for c in by_family()["dropout"]]
STATISTICAL = [n for n in DROPOUT if n != "p_zero_is_eval"]


def _builtin(name):
    if name == "numpy":
        from implementations.numpy.mha import NumpyMHA

        return NumpyMHA()
    pytest.importorskip("torch")
    from implementations.torch.eager import TorchEager
    from implementations.torch.nn import TorchNN
    from implementations.torch.sdpa import TorchSDPA

    return {"torch.eager": TorchEager, "torch.sdpa": TorchSDPA, "torch.nn": TorchNN}[name]()


@pytest.mark.parametrize("impl", ["numpy", "torch.eager", "torch.sdpa", "torch.nn"])
@pytest.mark.parametrize("case", DROPOUT)
def test_the_references_pass(impl, case):
    out = run_catalog_case(_builtin(impl), "dropout", case, "float32")
    if impl == "torch.nn" and case == "gqa":  # nn.MultiheadAttention has no GQA
        assert out.outcome == "unsupported" and "gqa" in out.reason, out.reason
    else:
        assert out.outcome == "pass", out.reason


@pytest.mark.parametrize("bug, cases", [
    ("NoRescale", STATISTICAL),  # the mean shrinks by 1 - p
    ("Ignored", STATISTICAL),  # no spread
    ("SameMask", STATISTICAL),  # one mask every call: biased mean, no spread
    ("KeepProbability", ["mean_and_spread", "gqa"]),  # at p = 0.5 (masked) it is right
    ("OneMaskForAllHeads", ["masked"]),  # less spread (ratio about 0.8 there)
    ("OnTheOutput", ["gqa"]),  # whole head rows dropped (ratio about 0.77 there)
    ("DropsAtZero", ["p_zero_is_eval", *STATISTICAL]),
])
def test_planted_dropout_bugs_fail(bug, cases):
    impl = getattr(planted("dropout_planted"), bug)()
    for case in cases:
        out = run_catalog_case(impl, "dropout", case, "float32")
        assert out.outcome == "fail", (bug, case, out.outcome)


def test_the_variance_is_what_the_draws_show():
    """The exact variance of one call against 4,000 draws of the reference's dropout, per
    element: within 15% where it is not tiny."""
    from suite.conformance.judge import attempt

    impl = planted("dropout_planted").NumpyMHA()
    p = dropout_problem(3, 0.3)
    draws = np.stack([attempt(impl, [p], "cpu", "float64")[0][0].output for _ in range(4000)])
    var = dropout_variance(p)
    live = var > 1e-3 * var.max()
    ratio = draws.var(axis=0, ddof=1)[live] / var[live]
    assert 0.85 < ratio.min() and ratio.max() < 1.15, (ratio.min(), ratio.max())
    assert dropout_variance(dataclasses.replace(p, dropout=0.0)).max() == 0.0


def test_z_is_the_bonferroni_quantile():
    import math

    for n in (1, 100, 5000):
        z = z_for(n)
        assert math.isclose(math.erfc(z / math.sqrt(2)), 1e-6 / n, rel_tol=1e-6)
    assert DRAWS >= 100


@pytest.mark.parametrize("rate", [1.0, -0.1, float("nan"), "0.1"])
def test_a_bad_dropout_is_one_line(rate):
    p = dataclasses.replace(dropout_problem(0, 0.1), dropout=rate)
    with pytest.raises(InputError, match=r"^dropout: expected None \(eval mode\) or a "
                                         r"probability in \[0, 1\), got "):
        p.validate()
