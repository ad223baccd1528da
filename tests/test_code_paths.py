"""Built-in names that claim a library code path reach it: torch.nn[fast] runs
``torch._native_multi_head_attention`` for each boolean mask form it declares, and the
hf.gpt2 config names build modules whose own scale differs from the canonical one (so
the fold into W_q is what makes them agree with the oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from suite.conformance.families import mask_forms
from suite.plugins import adapters
from suite.plugins.interface import call
from suite.spec.oracle import oracle
from suite.spec.problem import make_problem


def test_torch_nn_fast_takes_the_inference_fast_path(monkeypatch):
    torch = pytest.importorskip("torch")
    from implementations.torch.nn import TorchNNFast

    calls = []
    native = torch._native_multi_head_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return native(*args, **kwargs)

    monkeypatch.setattr(torch, "_native_multi_head_attention", spy)
    impl = TorchNNFast()
    for case in mask_forms.CASES:
        if case.form not in impl.mask_forms or case.form.startswith("causal_flag"):
            continue  # the fast path drops is_causal alone: a known failure with a reproducer
        before = len(calls)
        p = adapters.with_form(case.problem(self_attention=True), case.form)
        res = call(impl, p, "cpu", "float64")
        fast = len(calls) > before
        # Float masks are a condition of why_not_fast_path: those forms run the SDPA path.
        assert fast == ("float" not in case.form), case.form
        np.testing.assert_allclose(res.output, oracle(p)[0], atol=1e-10)


@pytest.mark.parametrize("option", ["unscaled", "scale_by_layer"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_gpt2_config_names_change_the_module_scale_and_fold_it(option, attn):
    pytest.importorskip("transformers")
    from implementations.hf import transformers as hf_transformers

    cls = next(c for c in hf_transformers.variants() if c.name == f"hf.gpt2[{attn},{option}]")
    impl = cls()
    p = make_problem(3, 2, 6, 6, 16, 2, self_attention=True)
    state = impl.prepare(p, "cpu", "float64")
    assert abs(state["module"].scaling - p.effective_scale) > 0.1 * p.effective_scale
    res = impl.fetch(state, impl.run(state))
    np.testing.assert_allclose(res.output, oracle(p)[0], atol=1e-10)
    no_fold = type("NoFold", (cls,), {"fold_scale": False})()
    with pytest.raises(Exception, match="scales q.k by"):
        no_fold.prepare(p, "cpu", "float64")
