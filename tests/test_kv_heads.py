"""#42 item 8: a module whose key/value head count is fixed (``kv_heads``) runs every case
that does not need more key/value heads than it has, each in its grouped-query form."""


import numpy as np
import pytest

from suite.conformance import catalog
from suite.conformance.judge import Outcome
from suite.plugins.interface import Unsupported, check_interface, with_kv_heads
from suite.spec.oracle import oracle
from suite.spec.problem import make_problem
from tests.conftest import planted

FAMILIES = ("masking", "shapes", "numerics", "variants", "packed", "decode", "generation")


def _plugins():
    return planted("fixed_kv_heads")


def _outcomes(impl, families=FAMILIES):
    out = {}
    for c in catalog.ALL:
        if c.family in families:
            o = c.run(impl, Outcome(impl.name, "cpu", "float64", c.family, c.name, c.seed,
                                    "pass"))
            out[f"{c.family}/{c.name}"] = o
    return out


def test_the_grouped_form_keeps_the_first_kv_heads_and_the_query_side():
    p = make_problem(3, 2, 5, 7, 16, 4)
    q = with_kv_heads(p, 1)
    assert (q.H, q.K, q.D) == (4, 1, 4)
    np.testing.assert_array_equal(q.weights.w_k, p.weights.w_k[:, :4])
    np.testing.assert_array_equal(q.weights.b_v, p.weights.b_v[:4])
    assert q.weights.w_q is p.weights.w_q and q.query is p.query
    assert oracle(q)[0].shape == oracle(p)[0].shape
    assert with_kv_heads(p, "half").K == 2 and with_kv_heads(p, None) is p
    with pytest.raises(Unsupported, match="fewer than the module's 2"):
        with_kv_heads(q, 2)
    with pytest.raises(Unsupported, match="do not divide"):
        with_kv_heads(p, 3)


@pytest.mark.parametrize("kind", ["MultiQuery", "HalfHeads"])
def test_a_fixed_kv_module_runs_the_families_it_can(kind):
    """Every case passes or is unsupported for a reason other than its kv heads, except the
    cases with fewer kv heads than the module has (the MQA cases for HalfHeads)."""
    impl = getattr(_plugins(), kind)()
    outs = _outcomes(impl)
    ran = [k for k, o in outs.items() if o.outcome == "pass"]
    bad = {k: (o.outcome, o.reason) for k, o in outs.items()
           if o.outcome not in ("pass", "unsupported")}
    assert not bad, bad
    heads = {k: o.reason for k, o in outs.items()
             if o.outcome == "unsupported" and "key/value head" in o.reason}
    if kind == "MultiQuery":
        assert not heads, heads
    else:
        assert heads and all("fewer than the module's" in r or "none at H=1" in r
                             for r in heads.values()), heads
    assert len(ran) >= 0.8 * len(outs), (len(ran), len(outs))


def test_a_wrong_kv_heads_declaration_is_one_clear_line():
    class Bad(_plugins().MultiQuery):
        kv_heads = 0

    with pytest.raises(TypeError, match="kv_heads: expected None, a positive int or 'half'"):
        check_interface(Bad)
