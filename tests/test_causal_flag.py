"""The causal flag alone (``causal_flag``) on torch.nn: ``nn.MultiheadAttention.forward``
and ``F.multi_head_attention_forward`` with ``is_causal=True`` and no ``attn_mask``.

torch 2.13 refuses that call outside the inference fast path: the case is unsupported in
torch's words, never an error. torch 2.0.0 accepted it and dropped the causal mask on the
need_weights path: planted here, the case fails.
"""

from __future__ import annotations

import pytest

from suite.conformance.families import mask_forms
from suite.conformance.judge import Outcome

torch = pytest.importorskip("torch")

CASES = {c.form: c for c in mask_forms.CASES}
FORMS = ("causal_flag", "causal_flag+kpm_bool")


def _outcome(impl, form: str) -> Outcome:
    out = Outcome(impl.name, "cpu", "float32", "mask_forms", form, 0, "pass")
    return CASES[form].run(impl, out)


def test_every_torch_nn_path_declares_the_causal_flag_alone():
    from implementations.torch.fmha import TorchFMHA, TorchFMHAWeights
    from implementations.torch.nn import TorchNN, TorchNNFast, TorchNNSDPA

    for cls in (TorchNN, TorchNNSDPA, TorchNNFast, TorchFMHA, TorchFMHAWeights):
        assert set(FORMS) <= cls.mask_forms, cls.name


@pytest.mark.parametrize("need_weights", [True, False])
def test_a_refused_causal_flag_is_unsupported_in_torchs_words(need_weights):
    from implementations.torch.fmha import TorchFMHA, TorchFMHAWeights
    from implementations.torch.nn import TorchNN, TorchNNSDPA

    for cls in ((TorchNN, TorchFMHAWeights) if need_weights else (TorchNNSDPA, TorchFMHA)):
        for form in FORMS:
            got = _outcome(cls(), form)
            assert got.outcome in ("pass", "unsupported"), (cls.name, form, got.reason)
            if got.outcome == "unsupported":  # torch's refusal, not a missing declaration
                assert "is_causal without attn_mask" in got.reason, got.reason


@pytest.mark.parametrize("need_weights", [True, False])
def test_a_causal_flag_dropped_on_either_path_fails(need_weights):
    """torch 2.0.0's behaviour, planted: is_causal accepted without attn_mask and ignored."""
    from implementations.torch.nn import TorchNN

    class DropsFlag(TorchNN):
        name = "bug.torch_nn_drops_causal_flag"
        features = TorchNN.features if need_weights else TorchNN.features - {"weights"}

        def call(self, mha, query, key, value, mask, need_weights):
            return super().call(mha, query, key, value, {**mask, "is_causal": False},
                                need_weights)

    DropsFlag.need_weights = need_weights
    for form in FORMS:
        got = _outcome(DropsFlag(), form)
        assert got.outcome == "fail", (form, got.outcome, got.reason)
