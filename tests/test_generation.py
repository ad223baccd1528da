"""The generation family (``Problem.steps``): a prefill and decode steps against a module's
own cache, judged row by row against the oracle of the whole prefill."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from suite.conformance import catalog
from suite.conformance.judge import Outcome
from suite.spec.problem import InputError, Mask, make_problem
from tests.conftest import planted, run_catalog_case

NAMES = ("prefill_then_steps", "token_by_token", "chunked_prefill", "static_cache",
         "window_in_cache", "window_fills_in_steps", "static_cache_exactly_full", "gqa_cache",
         "agrees_with_prefill")
# with a score variant (issue 50): Gemma 2's cap, gpt-oss's sinks beside its window, ALiBi,
# a score modifier of positions
VARIANT_NAMES = ("softcap_steps", "sinks_window_steps", "softcap_agrees_with_prefill",
                 "alibi_steps", "alibi_key_steps", "score_mod_steps",
                 "score_mod_agrees_with_prefill")


def _run(impl, name: str, dtype: str = "float64") -> Outcome:
    return run_catalog_case(impl, "generation", name, dtype)


def _planted():
    return planted("generation_planted")


def test_the_family_has_its_cases_and_every_problem_is_valid():
    cases = {c.name: c for c in catalog.of_family("generation")}
    assert set(cases) == set(NAMES + VARIANT_NAMES)
    for c in cases.values():
        p = c.problem()
        assert p.steps is not None and sum(p.steps) == p.L == p.S and p.mask.causal
    assert cases["static_cache"].problem().cache_len > cases["static_cache"].problem().L


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_numpy_reference_passes_every_step(dtype):
    from implementations.numpy.mha import NumpyMHA

    for name in NAMES + VARIANT_NAMES:
        out = _run(NumpyMHA(), name, dtype)
        assert out.outcome == "pass", (name, out.reason)


def test_steps_whose_alibi_starts_at_the_chunk_s_row_0_fail_the_distance_case():
    """ALiBi measured from each chunk's own row 0 (the decode step's row index, not its
    position): the prefill is right, every step after it wrong under the distance
    convention; under BLOOM's key convention a row constant that softmax cancels."""
    from implementations.numpy.mha import NumpyMHA

    class StepsAlibiAtZero(NumpyMHA):
        name = "bug.steps_alibi_at_zero"

        def positions(self, align, L, S, mask):
            return super().positions(align, L, S, mask.replace(query_offset=None))

    out = _run(StepsAlibiAtZero(), "alibi_steps", "float32")
    assert out.outcome == "fail" and "first wrong at step 2 of 5" in out.reason, out.reason
    assert _run(StepsAlibiAtZero(), "alibi_key_steps", "float32").outcome == "pass"
    assert _run(StepsAlibiAtZero(), "prefill_then_steps", "float32").outcome == "pass"


def test_decode_steps_that_drop_the_cap_fail_the_capped_cases_and_pass_the_rest():
    """A module that soft-caps its prefill and drops the cap at its decode steps: the
    oracle fails it at step 2 of softcap_steps, its own prefill disagrees with its steps
    (softcap_agrees_with_prefill), and every other case, prefill ones with a cap included,
    passes (before issue 50 no generation case carried a cap: it passed them all)."""
    bug = _planted().StepsDropCap()
    for name in NAMES + VARIANT_NAMES:
        out = _run(bug, name, "float32")
        assert (out.outcome == "fail") == ("softcap" in name), (name, out.outcome, out.reason)
    assert "first wrong at step 2 of 5" in _run(bug, "softcap_steps").reason
    agree = _run(bug, "softcap_agrees_with_prefill", "float32")
    assert agree.reason.startswith("decode steps vs the module's own prefill") \
        and "(step 1 of 5" not in agree.reason, agree.reason  # the worst step, not the prefill
    out = run_catalog_case(bug, "variants", "softcap_self_causal_padding", "float32")
    assert out.outcome == "pass", out.reason


def test_a_cache_appended_twice_fails_after_its_first_chunk():
    bug = _planted().AppendedTwice()
    for name in ("prefill_then_steps", "token_by_token", "chunked_prefill", "gqa_cache"):
        out = _run(bug, name)
        assert out.outcome == "fail", (name, out.reason)


def test_decode_steps_that_disagree_with_the_module_s_own_prefill_fail_the_contract():
    """agrees_with_prefill compares the module with itself: a cache appended twice fails it
    at the first decode step (its prefill path is right), and the reference passes."""
    from implementations.numpy.mha import NumpyMHA

    assert _run(NumpyMHA(), "agrees_with_prefill", "float32").outcome == "pass"
    out = _run(_planted().AppendedTwice(), "agrees_with_prefill", "float32")
    assert out.outcome == "fail", out.reason
    assert out.reason.startswith("decode steps vs the module's own prefill") \
        and "(step 2 of 5" in out.reason, out.reason


def test_a_sliding_cache_rolled_one_step_early_fails_the_window_case():
    out = _run(_planted().RolledEarly(), "window_in_cache")
    assert out.outcome == "fail", out.reason


def test_a_window_that_first_fills_at_a_step_and_evicts_one_more_fails_only_there():
    """A sliding-window cache (of the windowed cases' window) right when the prefill fills
    the window (window_in_cache passes), wrong at the step where the cache first holds the
    window: the new case fails at its third chunk (the second decode step, rows 3..3)."""
    bug = _planted().FirstFillEvictsOneMore()
    assert _run(bug, "window_in_cache").outcome == "pass"
    out = _run(bug, "window_fills_in_steps")
    assert out.outcome == "fail" and "first wrong at step 3 of 8 (rows 3..3" in out.reason, out.reason


def test_a_full_static_cache_that_drops_its_last_write_fails_only_when_exactly_full():
    bug = _planted().FullCacheDropsLastWrite()
    for name in NAMES:
        out = _run(bug, name)
        assert (out.outcome == "fail") == (name == "static_cache_exactly_full"), \
            (name, out.outcome, out.reason)


def test_a_static_cache_written_one_slot_late_fails_only_with_a_static_cache():
    bug = _planted().WrittenOneLate()
    assert _run(bug, "static_cache").outcome == "fail"
    assert _run(bug, "prefill_then_steps").outcome == "pass"  # a growing cache: right


def test_a_plugin_without_steps_is_unsupported_not_failed():
    from implementations.numpy.flash import NumpyFlashMHA

    out = _run(NumpyFlashMHA(), "prefill_then_steps")
    assert out.outcome == "unsupported" and "steps" in out.reason, out.reason


@pytest.mark.parametrize("change, field", [
    (dict(steps=(3, 3)), "steps"),  # sums to 6, L = 8
    (dict(steps=(8,), cache_len=5), "cache_len"),  # shorter than the sequence
    (dict(steps=None, cache_len=12), "cache_len"),  # without steps
    (dict(steps=(4, 0, 4)), "steps"),  # an empty chunk
])
def test_a_bad_steps_field_is_one_clear_error(change, field):
    p = make_problem(0, 1, 8, 8, 8, 2, self_attention=True, mask=Mask(causal=True))
    with pytest.raises(InputError, match=f"^{field}"):
        dataclasses.replace(p, **change).validate()


def test_steps_need_causal_self_attention():
    p = make_problem(0, 1, 8, 8, 8, 2, self_attention=True)  # no causal mask
    with pytest.raises(InputError, match="^steps: expected a causal self-attention"):
        dataclasses.replace(p, steps=(4, 4)).validate()
    assert np.array_equal(p.query, p.key)


def test_the_failure_names_the_first_wrong_step():
    out = _run(_planted().AppendedTwice(), "prefill_then_steps")
    assert "first wrong at step 2 of 6 (rows 6..6; the chunks before it right)" in out.reason, \
        out.reason


def test_a_hugging_face_model_generates_with_its_own_caches_and_a_forgetting_cache_fails():
    """hf.model.mistral[eager] runs every case with transformers' DynamicCache (its sliding
    window layer's included) and StaticCache; the same model with a cache that forgets the
    chunks before each step fails at step 2."""
    pytest.importorskip("transformers")
    import torch
    import transformers

    from suite.plugins.registry import shared

    entry = shared([]).select(["hf.model.mistral[[]eager]"], available_only=True)[0]
    for name in NAMES:
        out = _run(entry.impl, name, "float32")
        assert out.outcome == "pass", (name, out.reason)

    class Forgets(type(entry.impl)):
        name = "bug.forgetting_cache"

        def generate(self, model, query, attention_mask, p):
            outs, start = [], 0
            for n in p.steps:  # a fresh cache at every step, at the right positions
                out, _ = self.first_layer(
                    model, query[:, start:start + n].contiguous(), p, False,
                    past_key_values=transformers.DynamicCache(config=model.config),
                    use_cache=True, cache_position=torch.arange(start, start + n))
                outs.append(out)
                start += n
            return torch.cat(outs, dim=1)

    out = _run(Forgets(), "prefill_then_steps", "float32")
    assert out.outcome == "fail" and "first wrong at step 2 of 6" in out.reason, out.reason


def test_torch_references_generate_with_their_own_cache_and_a_planted_one_fails():
    """torch.eager and torch.sdpa run the chunks through TorchCore (cache_append,
    cache_write; a chunk's rows as a mask over the cache, no causal flag); torch.eager with
    a cache appended twice fails at step 2."""
    torch_eager = pytest.importorskip("implementations.torch.eager")
    from implementations.torch.sdpa import TorchSDPA

    for impl in (torch_eager.TorchEager(), TorchSDPA()):
        for name in NAMES:
            out = _run(impl, name, "float32")
            assert out.outcome == "pass", (impl.name, name, out.reason)

    class Twice(torch_eager.TorchEager):
        name = "bug.torch_cache_appended_twice"

        def cache_append(self, kc, vc, k, v):
            return super().cache_append(*super().cache_append(kc, vc, k, v), k, v)

    out = _run(Twice(), "prefill_then_steps", "float32")
    assert out.outcome == "fail" and "first wrong at step 2 of 6" in out.reason, out.reason


# --- a torch module with a cache of its own, on TorchModuleCore (#52 item 4) -------------------
def _module_with_cache(bug: str = "", declare_cache: bool = True):
    """A TorchModuleCore plugin of a small module that takes the cache its call hands it
    (``mask.cache``, from ``new_cache``): growing, or static with ``cache_len`` slots written
    at ``mask.positions``. ``bug``: ``typo`` (a growing cache that appends a chunk's keys
    where its values go), ``one_late`` (a static cache written one slot late)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from implementations.torch.common import TorchModuleCore

    class Cache:
        def __init__(self, slots):
            self.slots, self.k, self.v = slots, None, None

        def update(self, k, v, positions):  # (B, H, n, D) -> the keys and values held
            if self.slots is None:  # growing
                if self.k is None:
                    self.k, self.v = k, v
                else:
                    self.k = torch.cat([self.k, k], dim=2)
                    self.v = torch.cat([self.v, k if bug == "typo" else v], dim=2)
            else:  # static: each chunk at its positions, the other slots zeros
                if self.k is None:
                    self.k = k.new_zeros(k.shape[:2] + (self.slots, k.shape[3]))
                    self.v = v.new_zeros(v.shape[:2] + (self.slots, v.shape[3]))
                at = positions + 1 if bug == "one_late" else positions
                self.k[:, :, at], self.v[:, :, at] = k, v
            return self.k, self.v

    class CachedAttention(torch.nn.Module):
        def __init__(self, E, H):
            super().__init__()
            self.H = H
            for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
                setattr(self, n, torch.nn.Linear(E, E))

        def forward(self, x, mask, cache=None, positions=None):
            B, L, E = x.shape

            def heads(t):
                return t.view(B, L, self.H, E // self.H).transpose(1, 2)

            q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
            if cache is not None:
                k, v = cache.update(k, v, positions)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.out_proj(out.transpose(1, 2).reshape(B, L, E)), None

    class Cached(TorchModuleCore):
        name = "test.module_cache"
        kv_source = "self"
        features = frozenset({"valid_lens", "causal", "bool_mask", "steps", "static_cache"})

        def build(self, p):
            return CachedAttention(p.E, p.H)

        def call(self, module, query, key, value, mask, need_weights):
            return module(query, mask.mask, cache=mask.cache, positions=mask.positions)

    if declare_cache:
        Cached.new_cache = lambda self, module, p: Cache(p.cache_len)
    return Cached()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_module_plugin_generates_through_the_cache_its_call_hands_the_module(dtype):
    """TorchModuleCore runs a generation problem chunk by chunk through ``call``, the cache
    from ``new_cache`` in ``mask.cache``: every case passes but the grouped-query one (the
    module has no kv heads of its own: unsupported)."""
    impl = _module_with_cache()
    for name in NAMES:
        out = _run(impl, name, dtype)
        want = "unsupported" if name == "gqa_cache" else "pass"
        assert out.outcome == want, (name, out.outcome, out.reason)


def test_a_module_plugin_with_a_wrong_cache_fails_at_its_first_wrong_step():
    """Before TorchModuleCore ran the chunks, a module plugin declaring ``steps`` was called
    once on the whole problem, its cache never used, and passed every generation case
    whatever its cache did."""
    out = _run(_module_with_cache("typo"), "prefill_then_steps", "float32")
    assert out.outcome == "fail" and "first wrong at step 2 of 6" in out.reason, out.reason
    assert _run(_module_with_cache("typo"), "static_cache", "float32").outcome == "pass"
    out = _run(_module_with_cache("one_late"), "static_cache", "float32")
    assert out.outcome == "fail" and "first wrong at the prefill" in out.reason, out.reason
    assert _run(_module_with_cache("one_late"), "chunked_prefill", "float32").outcome == "pass"


def test_each_chunk_mask_covers_the_cache_slots_and_hides_the_unwritten_ones():
    torch = pytest.importorskip("torch")

    impl = _module_with_cache()
    p = catalog.get("generation", "static_cache").problem()  # steps (5, 1, 1, 1, 1), 16 slots
    chunks = impl.chunk_masks(p, torch.device("cpu"), torch.float32)
    assert [tuple(c.mask.shape[-2:]) for c in chunks] == [(5, 16)] + [(1, 16)] * 4
    assert [c.positions.tolist() for c in chunks] == [[0, 1, 2, 3, 4], [5], [6], [7], [8]]
    for c in chunks:
        end = int(c.positions[-1]) + 1
        assert not c.mask[..., end:].any() and c.key_padding is None and c.causal is None
        assert c.mask[..., -1, :end].all()  # the chunk's last row sees every key before it
    growing = impl.chunk_masks(catalog.get("generation", "chunked_prefill").problem(),
                               torch.device("cpu"), torch.float32)
    assert [tuple(c.mask.shape[-2:]) for c in growing] == [(5, 5), (4, 9), (3, 12), (2, 14)]


def test_a_module_plugin_declaring_steps_without_new_cache_errors_naming_it():
    out = _run(_module_with_cache(declare_cache=False), "prefill_then_steps", "float32")
    assert out.outcome == "error" and "new_cache" in out.reason, out.reason
