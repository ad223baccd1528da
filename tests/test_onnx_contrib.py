"""onnxruntime's contrib attention ops (implementations/onnx/contrib.py): the built-ins pass the
cases that exercise each of their inputs, and planted plugins, each the built-in with one
thing wrong in the graph it builds, fail those cases."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from implementations.onnx import contrib  # noqa: E402
from suite.plugins.interface import Unavailable  # noqa: E402
from tests.conftest import run_catalog_case  # noqa: E402

MHA, KPM2D, MHA_BIAS = (contrib.OrtMultiHeadAttention, contrib.OrtMultiHeadAttentionKpm2d,
                        contrib.OrtMultiHeadAttentionBias)
GQA, GQA_BIAS = contrib.OrtGroupQueryAttention, contrib.OrtGroupQueryAttentionBias
OK = ("pass", "deviation")  # a declared policy observed and checked is the built-in's answer


# --------------------------------------------------------------- planted plugins

class SeqlensOffByOne(GQA):
    """seqlens_k = total - 2: the op reads one key fewer per row."""

    name = "planted.gqa_seqlens"

    def seqlens_k(self, total):
        return (np.asarray(total) - 2).astype(np.int32)


class WindowOffByOne(GQA):
    """local_window_size one short of the window (the op's window counts the current
    token; the old convention did not)."""

    name = "planted.gqa_window"

    def local_window(self, keys):
        return int(keys) - 1


class SoftcapDropped(GQA):
    """The softcap attribute left off."""

    name = "planted.gqa_softcap"

    def attributes(self, p, causal, window):
        attrs = super().attributes(p, causal, window)
        attrs.pop("softcap", None)
        return attrs


class KvHeadsTiled(GQA):
    """kv heads repeated to H by tiling (query head h reads kv head h % K) and given as
    kv_num_heads = H: the pairing the spec does not have."""

    name = "planted.gqa_kv_heads"

    def attributes(self, p, causal, window):
        return dict(super().attributes(p, causal, window), kv_num_heads=p.H)

    def _proj(self, g, x, p, role):
        if role == "q" or p.K == p.H:
            return super()._proj(g, x, p, role)
        import dataclasses

        w, G = p.weights, p.H // p.K
        tile = lambda a: None if a is None else np.tile(a, G)  # noqa: E731  heads h % K
        weights = dataclasses.replace(w, **{f"w_{role}": tile(getattr(w, f"w_{role}")),
                                            f"b_{role}": tile(getattr(w, f"b_{role}"))})
        return super()._proj(g, x, dataclasses.replace(p, weights=weights, num_kv_heads=p.H),
                             role)


class SinkAsSmoothSoftmax(GQA):
    """smooth_softmax=1 (a sink logit of 0) instead of the problem's head_sink."""

    name = "planted.gqa_sinks"

    def attributes(self, p, causal, window):
        attrs = super().attributes(p, causal, window)
        return attrs if p.sinks is None else dict(attrs, smooth_softmax=1)

    def _extras(self, g, p, bias, ins, feeds, t):
        import dataclasses

        super()._extras(g, dataclasses.replace(p, sinks=None), bias, ins, feeds, t)


class PaddingFlipped(KPM2D):
    """The 2-D key_padding_mask with its polarity flipped (1 = padding)."""

    name = "planted.mha_kpm_flipped"

    def mask_inputs(self, p, t):
        kpm, causal, bias = super().mask_inputs(p, t)
        return (None if kpm is None else 1 - kpm), causal, bias


class PastNotFed(MHA):
    """Each decode step given an empty past: it attends only its own chunk."""

    name = "planted.mha_no_past"

    def next_past(self, kc, vc, present_k, present_v):
        return kc, vc


PLANTED = [  # (plugin, the built-in it changes, cases that must catch it)
    (SeqlensOffByOne, GQA, ["decode/static_cache", "decode/offsets_alone", "generation/static_cache",
                            "masking/causal"]),
    (WindowOffByOne, GQA, ["decode/window_in_cache", "generation/window_in_cache"]),
    (SoftcapDropped, GQA, ["variants/softcap_valid_lens", "variants/softcap_large_logits"]),
    (KvHeadsTiled, GQA, ["shapes/gqa"]),
    (SinkAsSmoothSoftmax, GQA, ["variants/sinks_large_logits"]),
    (PaddingFlipped, KPM2D, ["masking/valid_lens"]),
    (PastNotFed, MHA, ["generation/prefill_then_steps", "generation/chunked_prefill"]),
]
# Every case a planted plugin must fail, and a few more for each built-in's paths.
BUILTIN_CASES = {
    MHA: ["masking/valid_lens", "masking/causal", "masking/bool_mask_broadcast", "masking/bias",
          "decode/one_row", "generation/prefill_then_steps", "generation/chunked_prefill",
          "generation/window_in_cache"],
    KPM2D: ["masking/valid_lens", "masking/combined"],
    MHA_BIAS: ["masking/valid_lens", "masking/causal", "generation/prefill_then_steps"],
    GQA: ["decode/one_row", "decode/few_rows", "decode/static_cache", "decode/offsets_alone",
          "decode/window_in_cache", "decode/gqa", "decode/mqa", "generation/static_cache",
          "generation/window_in_cache", "generation/gqa_cache", "generation/chunked_prefill",
          "masking/causal", "masking/valid_lens", "shapes/gqa", "shapes/gqa_groups_of_2",
          "shapes/mqa", "variants/softcap_valid_lens",
          "variants/softcap_large_logits", "variants/sinks_large_logits",
          # heads of 4 padded to the kernel's 8 by a Pad node: an inf query stays an inf
          # score (zero weight columns would make it NaN)
          "variants/softcap_inf_score"],
    GQA_BIAS: ["masking/causal", "masking/valid_lens", "decode/one_row",
               "variants/softcap_valid_lens"],
}


def _case(impl, case, dtype="float32"):
    family, name = case.split("/")
    return run_catalog_case(impl, family, name, dtype)


@pytest.mark.parametrize("cls, case", [(c, k) for c, cases in BUILTIN_CASES.items()
                                       for k in cases],
                         ids=lambda v: getattr(v, "name", v))
def test_the_builtins_pass(cls, case):
    out = _case(cls(), case)
    assert out.outcome in OK, (cls.name, case, out.outcome, out.reason)


@pytest.mark.parametrize("bug, parent, cases", PLANTED, ids=[b.name for b, _, _ in PLANTED])
def test_planted_bugs_fail(bug, parent, cases):
    for case in cases:
        assert case in BUILTIN_CASES[parent], (case, "is not checked to pass on", parent.name)
        out = _case(bug(), case)
        assert out.outcome == "fail", (bug.name, case, out.outcome, out.reason)


def test_float16_runs_on_the_cpu_kernels():
    for cls, case in [(MHA, "masking/valid_lens"), (GQA, "decode/one_row"),
                      (GQA, "generation/static_cache")]:
        out = _case(cls(), case, "float16")
        assert out.outcome in OK, (cls.name, case, out.outcome, out.reason)


def test_window_convention_is_the_current_token_counted():
    """local_window_size = n keys counting the current one: the planted off-by-one (n - 1)
    is the other convention and must differ (a one-hot probe of which keys a row reads)."""
    from suite.spec.problem import Mask, make_problem

    L, n = 8, 3
    i = np.arange(L)
    allowed = (i[None, :] > i[:, None] - n)[None, None]
    p = make_problem(1, 1, L, L, 16, 2, self_attention=True,
                     mask=Mask(causal=True, allowed=allowed))
    assert GQA().pose(p).window == n


def test_unavailable_without_onnxruntime(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(Unavailable, match="onnxruntime"):
        GQA()


# ----------------------------------------------- what an older release's op schema takes

class Gqa123(GQA):
    """GroupQueryAttention as onnxruntime 1.23's schema has it (measured): no ``causal``
    attribute (the op is always causal) and 12 inputs (no query_seqlens)."""

    name = "test.gqa_schema_1_23"

    def schema(self):
        now = contrib.op_schema("GroupQueryAttention")
        attributes = None if now.attributes is None else now.attributes - {"causal"}
        return contrib.OpSchema("1.23.0", attributes or frozenset({"num_heads"}), 12)


def test_the_schema_is_read_from_the_runtime():
    gqa = contrib.op_schema("GroupQueryAttention")
    assert gqa is not None and gqa.takes("num_heads") and gqa.takes("kv_num_heads")
    assert gqa.inputs >= 12  # query .. head_sink on every release in range
    assert contrib.op_schema("NoSuchAttention") is None


def test_an_op_without_causal_is_posed_causal_or_refused():
    """Where the schema has no ``causal`` attribute, a problem whose rows see keys after
    their position is unsupported with the reason, the node never carries ``causal``, and
    causal problems (and a decode row, which sees every key anyway) still run and pass."""
    impl = Gqa123()
    for case in ["masking/valid_lens", "masking/none", "shapes/self_attention"]:
        out = _case(impl, case)
        assert out.outcome == "unsupported", (case, out.outcome, out.reason)
        assert "1.23.0's GroupQueryAttention has no causal attribute" in out.reason, out.reason
    for case in ["masking/causal", "decode/one_row", "decode/static_cache", "decode/gqa",
                 "variants/softcap_self_causal_padding"]:
        out = _case(impl, case)
        assert out.outcome in OK, (case, out.outcome, out.reason)
    from suite.conformance import catalog

    p = catalog.get("masking", "none").problem()
    assert "causal" not in impl.attributes(p, False, -1)
    if GQA().schema().takes("causal"):  # the installed release's: causal=0 where not causal
        assert GQA().attributes(p, False, -1)["causal"] == 0


def test_an_op_without_query_seqlens_runs_items_alone_or_refuses():
    """Without query_seqlens (12 inputs), several causal rows continuing the caches of a
    batch run one item at a time (each its own batch of one) and pass; generation chunks of
    several rows for a batch are unsupported, the reason naming the input."""
    impl = Gqa123()
    for case in ["decode/few_rows", "decode/prefill_chunk"]:
        out = _case(impl, case)
        assert out.outcome in OK, (case, out.outcome, out.reason)
    out = _case(impl, "generation/chunked_prefill")
    assert out.outcome == "unsupported", (out.outcome, out.reason)
    assert "no query_seqlens input (12 inputs)" in out.reason, out.reason
    from suite.conformance import catalog

    p = catalog.get("decode", "few_rows").problem()
    assert p.B > 1 and p.L > 1 and p.mask.causal

    def inputs(impl):
        return [x.name for x in impl.prepare(p, "cpu", "float32")["session"].get_inputs()]

    assert "query_seqlens" not in inputs(impl)
    if GQA().schema().inputs > contrib.QUERY_SEQLENS:  # the installed release's: one call
        assert "query_seqlens" in inputs(GQA())
