"""Modules as shipped (implementations/hf/shipped.py): a transformers layer runs with its own
weights, norms and rotary embeddings, the q, k and v it hands its attention function are
captured, and the attention it computed on them is judged against the oracle of the same
problem posed on them (``Result.posed``). Every case here runs through the usual harness
(``run_case``, as ``mha-suite check`` runs it; one test runs the command itself). The example
layers (examples/shipped_layers.py) pass; a layer whose norms and rotary are real but whose
attention drops the cap, or applies the mask one key off, fails exactly the cases about
them."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from suite.conformance import catalog  # noqa: E402
from suite.conformance.judge import run_case  # noqa: E402
from suite.plugins.interface import Posed  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

MASKING = ("none", "valid_lens", "causal", "bool_mask", "bias", "combined",
           "fully_masked_valid_lens")
SOFTCAP = ("softcap_valid_lens", "softcap_large_logits", "softcap_self_causal_padding")


@pytest.fixture(scope="module")
def shipped():
    from implementations.hf import shipped

    return shipped


@pytest.fixture(scope="module")
def layers():
    from examples import shipped_layers

    return shipped_layers


def _outcomes(impl, family, names, dtype="float32"):
    """Cases ``family/name`` on ``impl``, judged as ``mha-suite check`` judges them."""
    return {n: run_case(impl, impl.name, "cpu", dtype, catalog.get(family, n)) for n in names}


def _verdicts(outcomes):
    return {name: o.outcome for name, o in outcomes.items()}


@pytest.mark.parametrize("plugin", ["LatentAttention", "RotaryAttention", "CappedAttention"])
def test_example_layers_pass_the_masking_cases_as_shipped(shipped, layers, plugin):
    impl = getattr(layers, plugin)()
    got = _verdicts(_outcomes(impl, "masking", MASKING))
    # transformers' eager mask fills with finfo.min: the rows with no key follow the declared
    # mean of the values; the sdpa path gives the spec's zero rows
    dead = "pass" if impl.attn == "sdpa" else "deviation"
    assert got == {**{n: "pass" for n in MASKING}, "fully_masked_valid_lens": dead}, got


def test_the_capped_layer_passes_its_cap_cases_as_shipped(shipped, layers):
    got = _verdicts(_outcomes(layers.CappedAttention(), "variants", SOFTCAP))
    assert got == {n: "pass" for n in SOFTCAP}, got


def test_the_layers_own_norms_and_rotary_are_in_what_is_judged(shipped, layers):
    """The captured q is the module's: the latent RMSNorm and the rotary embedding applied
    (not the projections' output), and the oracle is posed on it with identity projections
    whose output is the attention function's heads."""
    impl = layers.LatentAttention()
    p = catalog.get("masking", "causal").problem_for(impl)
    state = impl.prepare(p, "cpu", "float64")
    res = impl.fetch(state, impl.run(state))
    (c,) = state["captured"]
    assert isinstance(res.posed, Posed) and res.posed.how.startswith("the module called ")
    attn = state["module"].attn
    x = torch.tensor(p.query)
    with torch.no_grad():
        q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x))).view(p.B, p.L, p.H, -1)
    q = q.transpose(1, 2).numpy()
    nope = attn.qk_nope_head_dim
    assert c.query.shape == (p.B, p.H, p.L, 10) and c.value.shape[-1] == 5
    np.testing.assert_array_equal(c.query[..., :nope], q[..., :nope])  # normed, not rotated
    assert not np.allclose(c.query[..., nope:], q[..., nope:])  # rotated by the positions
    rope = q[:, :, 0, nope:]  # position 0: cos 1, sin 0, DeepSeek's interleaved pairs
    np.testing.assert_array_equal(c.query[:, :, 0, nope:],
                                  np.concatenate([rope[..., 0::2], rope[..., 1::2]], -1))
    posed = shipped.pose(p, c)
    assert posed.scale == pytest.approx(c.kwargs["scaling"]) and posed.V == 5
    from suite.spec import oracle

    ref, _ = oracle.oracle(posed)
    got = shipped.posed_output(c, posed)  # (B, L, H*D'): the heads, then zero columns
    assert (got[..., p.H * 5:] == 0).all() and (ref[..., p.H * 5:] == 0).all()
    # transformers' eager path takes its softmax in float32 (the float64 known failure of
    # hf.*[eager]): about 1e-7 from the float64 oracle, 0.25 if the heads were misread
    assert 1e-9 < np.abs(got - ref).max() < 1e-6


def test_a_layer_that_drops_its_cap_fails_the_cap_cases_only(shipped, layers):
    class DropsCap(layers.CappedAttention):  # the config's cap, never handed to attention
        name = "planted.gemma2_attention[drops_cap]"

        def build(self, p):
            module = super().build(p)
            module.attn.attn_logit_softcapping = None  # the forward passes softcap=this
            return module

    impl = DropsCap()
    capped = _outcomes(impl, "variants", SOFTCAP)
    assert {n: o.outcome for n, o in capped.items()} == {n: "fail" for n in SOFTCAP}
    assert "softcap=None" in capped["softcap_large_logits"].reason
    plain = _verdicts(_outcomes(impl, "masking", ("none", "causal")))
    assert plain == {"none": "pass", "causal": "pass"}, plain


def _register_mask_one_key_off():
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def mask_one_key_off(module, query, key, value, attention_mask, **kwargs):
        if attention_mask is not None:  # each row's mask read one key to the right
            attention_mask = torch.roll(attention_mask, 1, dims=-1)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("planted_mask_one_key_off", mask_one_key_off)


def test_a_latent_layer_whose_attention_shifts_the_mask_fails_the_masked_cases(shipped,
                                                                                layers):
    _register_mask_one_key_off()

    class ShiftsMask(layers.LatentAttention):  # real norms and rotary, a faulty attention
        name, attn = "planted.deepseek_v3_attention[mask_off]", "planted_mask_one_key_off"
        features = layers.LatentAttention.features - {"weights"}  # sdpa returns none
        deviations = {}

    got = _outcomes(ShiftsMask(), "masking", ("none", "valid_lens", "causal", "bool_mask"))
    assert _verdicts(got) == {"none": "pass", "valid_lens": "fail", "causal": "fail",
                              "bool_mask": "fail"}, _verdicts(got)
    assert "the module called planted_mask_one_key_off(" in got["causal"].reason


def test_cases_comparing_calls_are_unsupported_for_a_posed_result(layers):
    """The property families compare calls of the handed problem: a result posed on the
    module's own q, k and v cannot be judged there (the judge says why)."""
    impl = layers.RotaryAttention()
    for name in ("repeatable", "batch_equals_items"):
        out = run_case(impl, impl.name, "cpu", "float32", catalog.get("properties", name))
        assert out.outcome == "unsupported" and "Result.posed" in out.reason, out.reason


def test_cases_about_the_projections_are_unsupported(layers):
    impl = layers.RotaryAttention()
    got = _outcomes(impl, "variants", ("value_width_wide_gqa",))
    assert got["value_width_wide_gqa"].outcome == "unsupported"  # value_width not declared

    class Wide(layers.RotaryAttention):  # declared: the module still cannot take it
        name = "mine.llama_attention[shipped,value_width]"
        features = layers.RotaryAttention.features | {"value_width"}

    got = _outcomes(Wide(), "variants", ("value_width_wide_gqa",))
    assert got["value_width_wide_gqa"].outcome == "unsupported"
    assert "as shipped: the value heads' width" in got["value_width_wide_gqa"].reason


def test_a_layer_calling_no_attention_function_is_an_error(shipped, layers):
    class Bypass(layers.RotaryAttention):
        name = "planted.llama_attention[bypass]"

        def call(self, module, query, key, value, mask, need_weights):
            return module.attn.o_proj(module.attn.q_proj(query)), None

    out = run_case(Bypass(), Bypass.name, "cpu", "float32", catalog.get("masking", "none"))
    assert out.outcome == "error" and "0 times" in out.reason, out.reason


def test_gemma3s_qk_norm_layer_as_shipped_and_the_cap_its_forward_never_hands_on(shipped,
                                                                                 layers):
    """Gemma3Attention (q_norm and k_norm, then rotary) passes the masking cases as shipped.
    Its config takes attn_logit_softcapping, but its forward (transformers 5.24) hands the
    attention function no softcap=: a plugin declaring the cap fails every cap case, the
    module's call showing no softcap. Keyed to the source, so a release that passes it on
    must pass them."""
    import inspect

    from transformers.models.gemma3 import modeling_gemma3

    impl = layers.QKNormAttention()
    got = _verdicts(_outcomes(impl, "masking", MASKING))
    assert got == {**{n: "pass" for n in MASKING}, "fully_masked_valid_lens": "deviation"}, got

    class Capped(layers.QKNormAttention):
        name = "mine.gemma3_attention[shipped,softcap]"
        features = layers.QKNormAttention.features | {"softcap"}

    capped = _outcomes(Capped(), "variants", SOFTCAP)
    hands_cap = "softcap=" in inspect.getsource(modeling_gemma3.Gemma3Attention.forward)
    want = "pass" if hands_cap else "fail"
    assert _verdicts(capped) == {n: want for n in SOFTCAP}, _verdicts(capped)
    if not hands_cap:
        assert "softcap" not in capped["softcap_large_logits"].reason.split("module called")[1]


@pytest.fixture(scope="module")
def torch_module():
    from examples import shipped_torch_module

    return shipped_torch_module


def test_a_torch_modules_sdpa_call_is_captured_and_judged(shipped, torch_module):
    """A plain torch module (QK-norm, rotary, torch's SDPA): its SDPA call is read; the
    module passes the masking cases; the same module handed the mask transposed (each row
    reads a column of the mask) fails the masked ones and passes the unmasked one."""
    names = ("none", "valid_lens", "causal", "bool_mask", "fully_masked_valid_lens")
    got = _verdicts(_outcomes(torch_module.NormedRotary(), "masking", names))
    assert got == {n: "pass" for n in names}, got

    class Transposed(torch_module.NormedRotary):
        name = "planted.normed_rotary[mask_transposed]"

        def call(self, module, query, key, value, mask, need_weights):
            m = mask.additive()
            return module(query, None if m is None else m.transpose(-1, -2)), None

    # a subclass that inherits ShippedCore's features runs packed rows on its own module:
    # the packed mask alone, no positions keyword its forward does not take
    class Inherits(torch_module.NormedRotary):
        name = "mine.normed_rotary[inherited]"
        features = torch_module.ShippedCore.features

    packed = _outcomes(Inherits(), "packed", ("docs", "causal_docs"))
    assert _verdicts(packed) == {"docs": "pass", "causal_docs": "pass"}, _verdicts(packed)

    bad = _outcomes(Transposed(), "masking", names[:4])
    assert _verdicts(bad) == {"none": "pass", "valid_lens": "fail", "causal": "fail",
                              "bool_mask": "fail"}, _verdicts(bad)
    assert "scaled_dot_product_attention(" in bad["causal"].reason
    assert torch.nn.functional.scaled_dot_product_attention.__module__.startswith("torch")


SINKS = ("sinks_self_causal_padding", "sinks_large_logits")


def test_gpt_oss_sinks_as_shipped_and_the_sdpa_path_that_drops_them(shipped, layers):
    """GptOssAttention with rotary and the case's sinks passes the sink cases on its eager
    path. On transformers' sdpa path (which gpt-oss's model refuses, _supports_sdpa = False,
    but a standalone layer's config takes) sdpa_attention_forward ignores s_aux: both cases
    fail, by far more than their bounds. Keyed to the source."""
    import inspect

    from transformers.integrations import sdpa_attention

    got = _verdicts(_outcomes(layers.SinkAttention(), "variants", SINKS))
    assert got == {n: "pass" for n in SINKS}, got

    class OnSdpa(layers.SinkAttention):
        name, attn = "mine.gpt_oss_attention[shipped,sdpa]", "sdpa"
        features = layers.SinkAttention.features - {"weights"}  # sdpa returns none

    reads_sinks = "s_aux" in inspect.getsource(sdpa_attention.sdpa_attention_forward)
    got = _outcomes(OnSdpa(), "variants", SINKS)
    want = "pass" if reads_sinks else "fail"
    assert _verdicts(got) == {n: want for n in SINKS}, _verdicts(got)
    if not reads_sinks:
        assert "s_aux=array(" in got["sinks_large_logits"].reason


def test_weights_an_attention_function_returns_are_judged(shipped, layers):
    """A plugin declaring weights has the weights its attention function returns judged: an
    attention function whose output is right but whose returned weights are the rows of
    another query fails every case with more than one row, and only on the weights."""
    from transformers import AttentionInterface
    from transformers.models.deepseek_v3 import modeling_deepseek_v3

    def rows_reversed(module, query, key, value, attention_mask, **kwargs):
        out, w = modeling_deepseek_v3.eager_attention_forward(module, query, key, value,
                                                              attention_mask, **kwargs)
        return out, w.flip(-2)

    AttentionInterface.register("planted_weights_rows_reversed", rows_reversed)

    class ReversedWeights(layers.LatentAttention):
        name, attn = "planted.deepseek_v3_attention[weights]", "planted_weights_rows_reversed"

        def call(self, module, query, key, value, mask, need_weights):  # the eager fill
            return module(query, mask.additive(torch.finfo(query.dtype).min))[0], None

    got = _outcomes(ReversedWeights(), "masking", ("none", "causal"))
    assert _verdicts(got) == {"none": "fail", "causal": "fail"}, _verdicts(got)
    assert got["none"].reason.startswith("weights:"), got["none"].reason


PLANTED_FILE = """
from examples.shipped_layers import CappedAttention


class DropsCap(CappedAttention):  # the config's cap, never handed to attention
    name = "planted.gemma2_attention[drops_cap]"

    def build(self, p):
        module = super().build(p)
        module.attn.attn_logit_softcapping = None
        return module
"""


def test_mha_suite_check_runs_a_module_as_shipped_with_records_and_results(cli, tmp_path):
    """``mha-suite check --plugin FILE`` runs these plugins like any name: the results file
    holds their outcomes, a known-failure record turns its case into a known failure, the
    other planted failure stays a failure (exit 1), and the example layer beside it passes."""
    plugin = tmp_path / "planted_shipped.py"
    plugin.write_text(PLANTED_FILE)
    known = tmp_path / "known.txt"
    known.write_text("test_case[[]planted.gemma2_attention[[]drops_cap[]]-cpu-float32-"
                     "variants/softcap_large_logits[]]  # planted: the layer drops its cap\n")
    out = tmp_path / "c.json"
    proc = cli("check", "--plugin", str(ROOT / "examples" / "shipped_layers.py"), "--plugin",
               str(plugin), "--impl", "planted.gemma2_attention[[]drops_cap[]]", "--impl",
               "mine.gemma2_attention[[]shipped[]]", "--dtype", "float32", "--workers", "0",
               "--no-progress", "-k", "softcap_large_logits or softcap_valid_lens",
               "--known-failures", str(known), "--json", str(out),
               env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    got = {(r["impl"], r["case"]): r for r in json.loads(out.read_text())["results"]}
    verdicts = {k: r["outcome"] for k, r in got.items()}
    assert verdicts == {
        ("planted.gemma2_attention[drops_cap]", "softcap_large_logits"): "known_failure",
        ("planted.gemma2_attention[drops_cap]", "softcap_valid_lens"): "fail",
        ("mine.gemma2_attention[shipped]", "softcap_large_logits"): "pass",
        ("mine.gemma2_attention[shipped]", "softcap_valid_lens"): "pass"}, verdicts
    failed = got[("planted.gemma2_attention[drops_cap]", "softcap_valid_lens")]
    assert "softcap=None" in failed["reason"] and failed["ratio"] is not None
    assert "1 failed (variants/softcap_valid_lens), 1 known failure " \
           "(variants/softcap_large_logits)" in proc.stdout, proc.stdout[-3000:]


class _PlainSdpa(torch.nn.Module):
    """Self-attention through torch's SDPA with no rotary embedding: any head width runs."""

    def __init__(self, E, H):
        super().__init__()
        self.H, self.qkv, self.out = H, torch.nn.Linear(E, 3 * E), torch.nn.Linear(E, E)

    def forward(self, x, mask=None):
        B, L, E = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.H, -1).transpose(1, 3).unbind(2)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(o.transpose(1, 2).reshape(B, L, E))


def test_a_rotary_declaration_makes_an_odd_head_width_unsupported_before_building(
        shipped, layers, torch_module):
    """``rotary = True`` is checked by ShippedCore itself: an odd head width is unsupported
    with the one-line reason before ``build`` runs, an even one runs; the same module without
    the declaration runs the odd width (the declaration alone decides), and the examples that
    rotate the head width declare it."""
    built = []

    class Plain(shipped.ShippedCore):
        name, framework, capture = "planted.plain_sdpa[shipped]", "torch", "sdpa"
        features = frozenset({"valid_lens", "causal", "bool_mask", "bias"})

        def build(self, p):
            built.append(p.D)
            return _PlainSdpa(p.E, p.H)

    class Rotary(Plain):
        name, rotary = "planted.plain_sdpa[shipped,rotary]", True

    odd, even = catalog.get("shapes", "head_width_1"), catalog.get("masking", "none")
    assert odd.problem_for(Rotary()).D % 2 == 1 and even.problem_for(Rotary()).D % 2 == 0
    out = run_case(Rotary(), Rotary.name, "cpu", "float32", odd)
    assert (out.outcome, out.reason) == ("unsupported", shipped.ODD_ROTARY), out.reason
    assert shipped.ODD_ROTARY == "rotary embeddings rotate pairs: an odd head width"
    assert built == []  # refused before the module was built
    assert run_case(Rotary(), Rotary.name, "cpu", "float32", even).outcome == "pass"
    assert run_case(Plain(), Plain.name, "cpu", "float32", odd).outcome == "pass"
    for impl in (layers.RotaryAttention(), layers.CappedAttention(), layers.QKNormAttention(),
                 layers.SinkAttention(), torch_module.NormedRotary()):
        assert impl.rotary, impl.name
        assert "if p.D % 2" not in inspect.getsource(type(impl).build), impl.name
    assert not layers.LatentAttention.rotary  # its rotated width is its own, not p.D


def test_repro_saves_and_replays_the_problem_a_module_as_shipped_posed(cli, tmp_path,
                                                                       shipped, layers):
    """``mha-suite repro`` on a module as shipped: problem.npz is the posed problem that was
    judged (the module's own q, k, v through identity projections, and its oracle's output),
    handed.npz the case's problem the plugin is given; replay.py reruns the module, gives the
    case's verdict and compares the output with the posed problem's oracle (the planted layer
    that drops its cap: far off; the example layer: within its bound), its q, k and v with
    the saved ones."""
    from suite.conformance import repro
    from suite.spec import oracle

    plugin = tmp_path / "planted_shipped.py"
    plugin.write_text(PLANTED_FILE)
    case_id = "planted.gemma2_attention[drops_cap]-cpu-float32-variants/softcap_valid_lens"
    out = tmp_path / "fail"
    made = cli("repro", "--plugin", str(plugin), case_id, "--out", str(out),
               env={"PYTHONPATH": str(ROOT)})
    assert made.returncode == 0, made.stdout + made.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["handed.npz", "problem.npz", "replay.py"]
    posed, saved = repro.load_problem(out / "problem.npz")
    handed, _ = repro.load_problem(out / "handed.npz")
    case = catalog.get("variants", "softcap_valid_lens")
    impl = layers.CappedAttention()
    want = case.problem_for(impl)
    np.testing.assert_array_equal(handed.query, want.query)
    state = impl.prepare(want, "cpu", "float32")  # the cap is the same: the same q, k, v
    computed = impl.fetch(state, impl.run(state)).posed.problem
    for name in ("query", "key", "value"):
        np.testing.assert_array_equal(getattr(posed, name), getattr(computed, name))
    assert np.array_equal(posed.weights.w_q, np.eye(posed.E)) and posed.weights.b_q is None
    assert posed.softcap == want.softcap and posed.scale == computed.scale
    np.testing.assert_array_equal(saved["expected"], oracle.oracle(posed)[0])
    assert "softcap=None" in str(saved["posed_how"])
    ran = subprocess.run([sys.executable, str(out / "replay.py")], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600, env={
                             **os.environ, "PYTHONPATH": str(ROOT)})
    assert ran.returncode == 1, ran.stdout + ran.stderr[-2000:]
    assert ran.stdout.startswith("planted.gemma2_attention[drops_cap] on cpu/float32, case "
                                 "variants/softcap_valid_lens: fail"), ran.stdout
    assert "its q, k, v now vs the saved posed problem: max abs difference 0, 0, 0" \
        in ran.stdout, ran.stdout
    err = float(ran.stdout.split("saved float64 oracle: max abs error ")[1].split(",")[0])
    assert err > 0.01, ran.stdout

    good = tmp_path / "pass"
    good_id = "mine.gemma2_attention[shipped]-cpu-float32-variants/softcap_valid_lens"
    examples = [str(ROOT / "examples" / "shipped_layers.py")]
    repro.write(impl, good_id, good, examples)
    assert (good / "handed.npz").exists()
    code = repro.replay(good / "problem.npz", impl.name, examples, "cpu", "float32",
                        "variants", "softcap_valid_lens")
    assert code == 0


PACKED = ("docs", "causal_docs", "loud_neighbour", "single_token_docs")


def test_packed_sequences_as_shipped_keep_apart_and_restart_their_positions(shipped, layers):
    """A packed row is one call (#52 item 2, #50's cap in packed sequences): the mask keeps
    the sequences apart and the rotary positions restart at each, as padding-free training's
    position_ids do. Gemma 2's capped layer passes the packed cases, its cap among them; the
    same layer handed a plain causal mask instead (the sequences attend each other) fails;
    the positions it hands the rotary embedding restart at each sequence's first token."""
    impl = layers.CappedAttention()
    names = PACKED + ("softcap_causal_docs",)
    assert _verdicts(_outcomes(impl, "packed", names)) == {n: "pass" for n in names}

    class Mixed(layers.CappedAttention):
        name = "bug.packed_sequences_mixed"

        def call(self, module, query, key, value, mask, need_weights):
            causal = torch.tril(torch.ones(query.shape[1], query.shape[1], dtype=torch.bool))
            mixed = torch.where(causal, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
            return module(query, mixed.expand(query.shape[0], -1, -1)[:, None])[0], None

    got = _verdicts(_outcomes(Mixed(), "packed", ("causal_docs", "softcap_causal_docs")))
    assert got == {"causal_docs": "fail", "softcap_causal_docs": "fail"}, got

    seen = {}

    class Positions(layers.CappedAttention):
        def call(self, module, query, key, value, mask, need_weights):
            seen["positions"] = getattr(self, "_packed_positions", None)
            return super().call(module, query, key, value, mask, need_weights)

    _outcomes(Positions(), "packed", ("causal_docs",))
    p = catalog.get("packed", "causal_docs").problem_for(impl)
    starts = np.flatnonzero(np.diff(p.mask.segments[0])) + 1
    assert seen["positions"][0, 0] == 0 and (seen["positions"][0, starts] == 0).all()
