"""jax.nn and torch.flex on the inference forms (#40 item 5), through their own arguments:
jax.nn's ``key_value_seq_lengths`` for key padding and a decode step's cache length, its
``mask`` for rows at an offset, generation steps against a cache the adapter keeps; torch.flex's
block mask whose mask_mod reads each batch's offset and cache length. Each path is shown taken
(a spy on the library's call), the cases pass, and the same adapter with the path wrong fails.
torch.flex compiles each shape (seconds): a few cases only."""

from __future__ import annotations

import numpy as np
import pytest

from suite.conformance import catalog
from suite.plugins import adapters
from tests.conftest import run_catalog_case


def _jax_nn():
    pytest.importorskip("jax")
    from implementations.jax import nn as jax_nn

    return jax_nn


def _spy(monkeypatch, module, name):
    """Wrap ``module.name`` so each call's keyword names (and arrays' shapes) are recorded."""
    calls = []
    real = getattr(module, name)

    def spy(*args, **kw):
        calls.append({k: getattr(v, "shape", v) for k, v in kw.items() if v is not None})
        return real(*args, **kw)

    monkeypatch.setattr(module, name, spy)
    return calls


# --- jax.nn ---------------------------------------------------------------------------------

@pytest.mark.parametrize("family, name", [
    ("decode", "one_row"), ("decode", "offsets_alone"), ("decode", "few_rows"),
    ("decode", "window_in_cache"), ("decode", "prefill_chunk"), ("generation", "static_cache"),
    ("generation", "window_in_cache"), ("generation", "chunked_prefill"),
    ("packed", "causal_docs"), ("packed", "agrees_with_padded"), ("masking", "valid_lens"),
])
def test_jax_nn_runs_the_inference_forms(family, name):
    jax_nn = _jax_nn()
    out = run_catalog_case(jax_nn.JaxNN(), family, name, "float32")
    assert out.outcome == "pass", (out.outcome, out.reason)


@pytest.mark.parametrize("name, form, lengths", [
    ("one_row", "kv_lengths", [16, 7, 1]),  # the step's cache lengths
    ("offsets_alone", "kv_lengths", [16, 10, 3]),  # no lengths: offset + 1
    ("static_cache", "kv_lengths", [10, 4, 17]),
    ("few_rows", "kv_lengths+bool_B1LS", [16, 9, 3]),  # rows at an offset: its mask beside
])
def test_jax_nn_gives_a_decode_cache_as_its_key_lengths(name, form, lengths):
    jax_nn = _jax_nn()
    p = jax_nn.as_lengths(catalog.get("decode", name).problem(), jax_nn.JaxNN.mask_forms)
    assert p.mask_form == form
    np.testing.assert_array_equal(adapters.form_mask(p).kv_lengths, lengths)


def test_jax_nn_passes_key_value_seq_lengths_not_a_mask(monkeypatch):
    """The spy sees jax.nn.dot_product_attention called with key_value_seq_lengths (B,) and
    no mask for a decode step, the lengths beside a (B, 1, Lq, S) mask for rows at an offset,
    and, in generation against a static cache, the prefill with is_causal and each step with
    the lengths alone."""
    jax_nn = _jax_nn()
    import jax

    calls = _spy(monkeypatch, jax.nn, "dot_product_attention")
    assert run_catalog_case(jax_nn.JaxNN(), "decode", "one_row", "float32").outcome == "pass"
    (call,) = calls
    assert call["key_value_seq_lengths"] == (3,) and "mask" not in call
    assert "is_causal" not in call or not call["is_causal"]
    calls.clear()
    assert run_catalog_case(jax_nn.JaxNN(), "decode", "few_rows", "float32").outcome == "pass"
    (call,) = calls
    assert call["key_value_seq_lengths"] == (3,) and call["mask"] == (3, 1, 3, 16)
    calls.clear()
    assert run_catalog_case(jax_nn.JaxNN(), "generation", "static_cache",
                            "float32").outcome == "pass"
    prefill, *steps = calls  # steps (5, 1, 1, 1, 1) into 16 slots
    assert prefill["is_causal"] and prefill["key_value_seq_lengths"] == (2,)
    assert len(steps) == 4 and all(s["key_value_seq_lengths"] == (2,) and "mask" not in s
                                   and not s.get("is_causal") for s in steps)
    calls.clear()  # a window of 4: local_window_size at the prefill only (aligned at query 0)
    assert run_catalog_case(jax_nn.JaxNN(), "generation", "window_in_cache",
                            "float32").outcome == "pass"
    prefill, *steps = calls  # steps (6, 1, 1, 1, 1, 1, 1), a growing cache
    assert prefill["local_window_size"] == (3, 11) and prefill["is_causal"]  # causal cuts right
    assert [s["mask"] for s in steps] == [(2, 1, 1, n) for n in range(7, 13)]
    assert not any("local_window_size" in s or "key_value_seq_lengths" in s for s in steps)


def test_jax_nn_with_a_cache_length_one_short_fails(monkeypatch):
    """The same adapter with a decode step's length off by one (offset, not offset + 1: the
    row misses its own key) fails the decode family: the lengths reach the numbers."""
    jax_nn = _jax_nn()
    real = jax_nn.as_lengths

    def one_short(problem, taken):
        p = real(problem, taken)
        if p is None or problem.L != 1:
            return p
        import dataclasses

        return dataclasses.replace(p, mask=dataclasses.replace(
            p.mask, valid_lens=np.maximum(p.mask.valid_lens - 1, 0)))

    monkeypatch.setattr(jax_nn, "as_lengths", one_short)
    out = run_catalog_case(jax_nn.JaxNN(), "decode", "static_cache", "float32")
    assert out.outcome == "fail", (out.outcome, out.reason)


def test_jax_nn_steps_that_reuse_the_prefill_mask_fail(monkeypatch):
    """Generation with each step's rows given top-left is_causal (the offset dropped, as a
    port that forgets jax.nn's causal flag is aligned at query 0) fails at a step."""
    jax_nn = _jax_nn()

    class TopLeftSteps(jax_nn.JaxNN):
        name = "bug.jax_nn_steps_top_left"

        def attend_chunk(self, q, k, v, mask, scale, start, end):
            import jax

            q, k, v = q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)
            out = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True)
            return out.swapaxes(1, 2)

    out = run_catalog_case(TopLeftSteps(), "generation", "prefill_then_steps", "float32")
    assert out.outcome == "fail" and "step 2 of 6" in out.reason, (out.outcome, out.reason)


# --- torch.flex -----------------------------------------------------------------------------

def _flex():
    pytest.importorskip("torch")
    from implementations.torch import compiled as torch_compiled

    if torch_compiled.forced_below_native():
        pytest.skip(torch_compiled.forced_below_native())
    return torch_compiled


@pytest.mark.parametrize("family, name", [("decode", "few_rows"), ("decode", "offsets_alone"),
                                          ("generation", "static_cache")])
def test_torch_flex_runs_the_decode_form_through_its_block_mask(family, name, monkeypatch):
    """The decode block mask is built (a spy) and the case passes."""
    tc = _flex()
    calls = _spy(monkeypatch, tc, "_decode_block_mask")
    out = run_catalog_case(tc.TorchFlex(), family, name, "float32")
    assert out.outcome == "pass", (out.outcome, out.reason)
    assert calls  # one per call (per generation step)


def test_torch_flex_with_the_offset_dropped_fails(monkeypatch):
    """The same adapter whose block mask forgets the offsets (every batch's rows at 0, top
    left) fails the decode family."""
    tc = _flex()
    real = tc._decode_block_mask

    def at_zero(mask, L, S, device):
        return real(mask.replace(query_offset=np.zeros_like(mask.query_offset)), L, S, device)

    monkeypatch.setattr(tc, "_decode_block_mask", at_zero)
    out = run_catalog_case(tc.TorchFlex(), "decode", "few_rows", "float32")
    assert out.outcome == "fail", (out.outcome, out.reason)
