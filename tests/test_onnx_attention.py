"""The ONNX ``Attention`` op built-ins (#49 item 1): the graph, the mask posed through the
op's own inputs, and planted bugs, each a one-place change to a correct built-in's graph,
caught by the conformance cases the correct built-ins pass."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from implementations.onnx import attention, common  # noqa: E402
from suite.spec.problem import Mask, make_problem  # noqa: E402
from tests.conftest import run_catalog_case  # noqa: E402

BUILTINS = {"onnxruntime.attention": attention.OrtAttention,
            "onnxruntime.attention[mask]": attention.OrtAttentionMask,
            "onnxruntime.attention[opset23]": attention.OrtAttention23,
            "onnx.reference.attention": attention.RefAttention}


# ------------------------------------------------------------------ planted bugs
class NoCausal(attention.OrtAttention):
    """is_causal dropped from the node."""

    name = "bug.onnx.no_causal"

    def pose(self, p):
        return dataclasses.replace(super().pose(p), is_causal=False)


class FlippedPolarity(attention.OrtAttention):
    """A boolean attn_mask given as True = masked."""

    name = "bug.onnx.flipped_polarity"

    def pose(self, p):
        pose = super().pose(p)
        m = pose.attn_mask
        return pose if m is None or m.dtype != bool else dataclasses.replace(pose, attn_mask=~m)


class NoScale(attention.OrtAttention):
    """The scale attribute omitted (the op's default 1/sqrt(d) instead)."""

    name = "bug.onnx.no_scale"

    def graph(self, p, dtype, pose, cache=None):
        return dataclasses.replace(super().graph(p, dtype, pose, cache), scale=None)


class NoSoftcap(attention.OrtAttention):
    """The softcap attribute dropped."""

    name = "bug.onnx.no_softcap"

    def graph(self, p, dtype, pose, cache=None):
        return dataclasses.replace(super().graph(p, dtype, pose, cache), softcap=None)


class KvHeadsReversed(attention.OrtAttention):
    """The key/value projections' head blocks in reverse order (query head h reads the
    wrong kv head)."""

    name = "bug.onnx.kv_heads_reversed"

    def weights(self, p):
        w, K, D, V = p.weights, p.K, p.D, p.V

        def rev(a, width):
            return None if a is None else \
                a.reshape(a.shape[:-1] + (K, width))[..., ::-1, :].reshape(a.shape)

        return dataclasses.replace(w, w_k=rev(w.w_k, D), b_k=rev(w.b_k, D),
                                   w_v=rev(w.w_v, V), b_v=rev(w.b_v, V))


class PastNotFed(attention.OrtAttention):
    """Generation: each chunk fed an empty past (present_* dropped)."""

    name = "bug.onnx.past_not_fed"

    def next_cache(self, present, past):
        return past


class NonpadOffByOne(attention.OrtAttention):
    """nonpad_kv_seqlen one short."""

    name = "bug.onnx.nonpad_off_by_one"

    def pose(self, p):
        pose = super().pose(p)
        n = pose.nonpad_kv_seqlen
        return pose if n is None else dataclasses.replace(
            pose, nonpad_kv_seqlen=np.maximum(n - 1, 0))


class RefNoCausal(attention.RefAttention):
    """The reference with is_causal dropped (the same change, the other runtime)."""

    name = "bug.onnx.reference.no_causal"

    def pose(self, p):
        return dataclasses.replace(super().pose(p), is_causal=False)


# bug -> (family, cases it must fail); the correct built-ins pass every one of them.
PLANTED = {
    NoCausal: ("masking", ["causal", "causal_top_left_short_query"]),
    RefNoCausal: ("masking", ["causal", "causal_top_left_long_query"]),
    FlippedPolarity: ("masking", ["bool_mask", "bool_mask_broadcast"]),
    NoScale: ("numerics", ["explicit_scale"]),
    NoSoftcap: ("variants", ["softcap_valid_lens", "softcap_large_logits"]),
    KvHeadsReversed: ("shapes", ["gqa", "gqa_groups_of_2"]),
    PastNotFed: ("generation", ["prefill_then_steps", "token_by_token"]),
    NonpadOffByOne: ("masking", ["valid_lens"]),
}
BASE = {b: next(c.name for c in b.__mro__[1:] if c.__dict__.get("name")) for b in PLANTED}


@pytest.mark.parametrize("bug", list(PLANTED), ids=lambda b: b.name)
def test_planted_bug_fails_where_its_builtin_passes(bug):
    family, cases = PLANTED[bug]
    good = BUILTINS[BASE[bug]]()
    for case in cases:
        right = run_catalog_case(good, family, case, "float32")
        assert right.outcome == "pass", (BASE[bug], case, right.reason)
        wrong = run_catalog_case(bug(), family, case, "float32")
        assert wrong.outcome == "fail", (bug.name, case, wrong.outcome, wrong.reason)
        worst = wrong.worst()  # past the rule, not an error or a refusal
        assert worst is not None and not worst.err <= worst.bound, wrong.reason


# Cases that reach each of the op's own inputs, on each path.
PATHS = [("masking", "causal_bottom_right_long_query"), ("masking", "valid_lens"),
         ("masking", "fully_masked_bool_row"), ("masking", "bias"),
         ("decode", "one_row"), ("decode", "offsets_alone"),
         ("generation", "chunked_prefill"), ("generation", "static_cache"),
         ("generation", "window_in_cache"), ("variants", "softcap_causal_bottom_right_long_query"),
         ("variants", "value_width_wide_gqa"), ("shapes", "mqa")]


@pytest.mark.parametrize("name", ["onnxruntime.attention", "onnxruntime.attention[mask]",
                                  "onnxruntime.attention[opset23]"])
@pytest.mark.parametrize("family, case", PATHS)
def test_each_path_passes(name, family, case):
    impl = BUILTINS[name]()
    out = run_catalog_case(impl, family, case, "float32")
    if case == "static_cache" and family == "generation" and impl.opset < 24:
        assert out.outcome == "unsupported", out.reason
    else:
        assert out.outcome == "pass", (name, family, case, out.reason)


# ------------------------------------------------------------------ the pose and the graph
def test_pose_uses_the_ops_own_inputs():
    p = make_problem(0, B=2, L=3, S=5, mask=Mask(causal=True, causal_align="bottom_right"))
    pose = common.pose_mask(p)  # bottom right: is_causal at offset nonpad - L = S - L
    assert pose.is_causal and pose.attn_mask is None
    assert pose.nonpad_kv_seqlen.tolist() == [5, 5]
    assert common.pose_mask(p, nonpad=False).attn_mask is not None  # opset 23: a mask
    lens = make_problem(0, B=2, L=3, S=5, mask=Mask(valid_lens=np.array([2, 5])))
    assert common.pose_mask(lens).nonpad_kv_seqlen.tolist() == [2, 5]
    both = make_problem(0, B=2, L=3, S=5, mask=Mask(valid_lens=np.array([2, 5]), causal=True))
    pose = common.pose_mask(both)  # top left beside lengths: the lengths go in the mask
    assert pose.is_causal and pose.nonpad_kv_seqlen is None and pose.attn_mask.dtype == bool
    explicit = common.pose_mask(both, native=False)
    assert not explicit.is_causal and explicit.nonpad_kv_seqlen is None
    allowed = both.mask.dense_allowed(2, 1, 3, 5)
    assert np.array_equal(np.broadcast_to(explicit.attn_mask, allowed.shape), allowed)


def test_problem_model_is_a_checked_attention_graph():
    import onnx

    p = make_problem(1, B=1, L=4, S=6, H=4, K=2, mask=Mask(bias=np.zeros((1, 1, 4, 6))))
    model = common.problem_model(p, "float16")
    onnx.checker.check_model(model, full_check=True)
    (node,) = [n for n in model.graph.node if n.op_type == "Attention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"q_num_heads": 4, "kv_num_heads": 2}  # no scale: the op's default
    assert node.input[3] == "attn_mask"
    mask_input = next(i for i in model.graph.input if i.name == "attn_mask")
    assert mask_input.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def _graph_of(impl, family, case):
    """The AttentionGraph ``impl`` builds for catalogue case ``family/case``."""
    from suite.conformance import catalog

    (c,) = [c for c in catalog.of_family(family) if c.name == case]
    return impl.prepare(c.problem(), "cpu", "float32")["graph"]


@pytest.mark.parametrize("family, case, native, explicit", [
    # the decode form: is_causal beside nonpad_kv_seqlen, no mask at all
    ("decode", "one_row", dict(is_causal=True, nonpad=True, mask=None),
     dict(is_causal=False, nonpad=False, mask="bool")),
    # bottom-right causal, Lq != Lk: is_causal beside nonpad_kv_seqlen = Lk
    ("masking", "causal_bottom_right_long_query", dict(is_causal=True, nonpad=True, mask=None),
     dict(is_causal=False, nonpad=False, mask="bool")),
    # generation: past_key/past_value fed, is_causal at the past length
    ("generation", "prefill_then_steps", dict(is_causal=True, cache="past", mask=None),
     dict(is_causal=False, cache="past", mask="bool")),
    # a static cache: TensorScatter, nonpad_kv_seqlen, 4-D inputs
    ("generation", "static_cache", dict(is_causal=True, cache="static", nonpad=True, rank=4),
     dict(is_causal=False, cache="static", nonpad=True, mask="bool")),
])
def test_the_native_name_reaches_the_ops_own_inputs(family, case, native, explicit):
    for impl, want in ((attention.OrtAttention(), native),
                       (attention.OrtAttentionMask(), explicit)):
        g = _graph_of(impl, family, case)
        got = {k: getattr(g, k) for k in want}
        assert got == want, (impl.name, family, case)


@pytest.mark.parametrize("cls", [attention.OrtAttention4d, attention.OrtAttentionWeightInputs])
def test_the_graph_variants_take_their_path_and_pass(cls):
    import onnx

    impl = cls()
    p = make_problem(2, B=2, L=5, S=7, E=16, H=4, K=2)
    g = impl.graph(p, "float32", impl.pose(p))
    model = common.attention_model(g, p.weights)
    (node,) = [n for n in model.graph.node if n.op_type == "Attention"]
    heads = {a.name for a in node.attribute} & {"q_num_heads", "kv_num_heads"}
    inputs = {i.name for i in model.graph.input}
    inits = {i.name for i in model.graph.initializer}
    if impl.rank == 4:  # 4-D inputs: the heads from the shapes, no head attributes
        assert not heads and "w_q" in inits
    else:  # the weights fed, not folded into the model
        assert heads and "w_q" in inputs and "w_q" not in inits
    assert onnx.checker.check_model(model) is None
    out = run_catalog_case(impl, "shapes", "gqa", "float32")
    assert out.outcome == "pass", out.reason


def test_unavailable_without_the_runtime(monkeypatch):
    import sys

    from suite.plugins.interface import Unavailable

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises
    with pytest.raises(Unavailable, match="needs onnx and onnxruntime"):
        attention.OrtAttention()
    attention.RefAttention()  # onnx alone still runs the reference
    monkeypatch.setitem(sys.modules, "onnx.reference", None)
    with pytest.raises(Unavailable, match="needs onnx"):
        attention.RefAttention()


def test_a_runtime_without_opset_24_makes_its_names_unavailable_in_one_line(monkeypatch):
    """onnxruntime 1.23 reads ONNX opsets up to 23 (measured): the opset-24 names are
    unavailable with one line naming the opset and the release, the opset-23 name runs."""
    import onnxruntime

    from suite.plugins.interface import Unavailable

    assert attention.ort_onnx_opset() >= 23  # read from the installed runtime's schemas
    monkeypatch.setattr(attention, "ort_onnx_opset", lambda: 23)
    for cls in (attention.OrtAttention, attention.OrtAttentionMask, attention.OrtAttention4d):
        with pytest.raises(Unavailable) as info:
            cls()
        assert str(info.value) == (f"{cls.name} builds an ONNX opset 24 graph; onnxruntime "
                                   f"{onnxruntime.__version__} reads ONNX opsets up to 23")
    out = run_catalog_case(attention.OrtAttention23(), "masking", "causal", "float32")
    assert out.outcome == "pass", out.reason
