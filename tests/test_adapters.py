"""The adapter toolkit: mask splits recombine to the canonical mask, attention computed from
the converted weights and mask parts reproduces the oracle, gradients map back exactly."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from suite.conformance import cases
from suite.conformance.families import mask_forms
from suite.plugins import adapters
from suite.plugins.adapters import Param
from suite.plugins.interface import Unsupported
from suite.spec.oracle import oracle
from suite.spec.oracle_grad import grads as oracle_grads
from suite.spec.problem import GRAD_NAMES, Mask, cotangent, make_problem

# Masks only: the special values family's NaN/inf inputs are about arithmetic, not splitting,
# and the variants family's score variants are not the mask's (suite.spec.variants).
# The masks of the plain cases: this file's own attention computes no score variant nor a
# value width other than the head width (decode, paged, packed and generation carry some: #50).
MASK_CASES = [c for c in cases.CASES if not c.problem().mask.is_empty()
              and c.family not in ("special_values", "variants")
              and not c.problem().has_variants()]
SPLITS = list(itertools.product(("attend", "masked"), (True, False),
                                ((), ("top_left",), ("bottom_right",),
                                 ("top_left", "bottom_right")), (True, False)))


def _split_id(s) -> str:
    true_means, kp, causal, per_head = s
    return f"{true_means}-kp{int(kp)}-causal[{'+'.join(causal)}]-{'heads' if per_head else 'flat'}"


@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("split", SPLITS, ids=_split_id)
def test_split_recombines_to_the_canonical_mask(case, split):
    p = case.problem()
    true_means, key_padding, native_causal, per_head = split
    B, H, L, S = p.B, p.H, p.L, p.S
    if not per_head and adapters.mask_heads(p.mask, H) != 1:
        with pytest.raises(Unsupported, match="varies over heads"):
            adapters.split_mask(p, true_means=true_means, key_padding=key_padding,
                                native_causal=native_causal, per_head=per_head)
        return
    parts = adapters.split_mask(p, true_means=true_means, key_padding=key_padding,
                                native_causal=native_causal, per_head=per_head)
    want = p.mask.dense_allowed(B, H, L, S)
    np.testing.assert_array_equal(np.broadcast_to(parts.allowed(), (B, H, L, S)), want)
    # Each part is in the requested convention and shape, and only where asked.
    vl = p.mask.valid_lens
    if key_padding and vl is not None and np.ndim(vl) == 1:
        keep = np.arange(S)[None] < vl[:, None]
        np.testing.assert_array_equal(parts.key_padding,
                                      keep if true_means == "attend" else ~keep)
    else:
        assert parts.key_padding is None
    if p.mask.query_offset is not None:  # rows at per-batch offsets: no flag says that
        assert parts.causal is None
    elif p.mask.causal and p.mask.causal_align in native_causal:
        assert parts.causal == p.mask.causal_align
    elif p.mask.causal and native_causal and L == S:  # one mask: either flag serves
        assert parts.causal == native_causal[0]
    else:
        assert parts.causal is None
    for a in (parts.mask, parts.bias):
        if a is not None:
            assert a.shape == ((B, parts.heads, L, S) if per_head else (B, L, S))
    if parts.mask is not None:
        assert parts.mask.dtype == np.bool_
    # The fold of everything into one additive mask is the canonical dense bias.
    full = adapters.additive_mask(p, per_head=per_head)
    np.testing.assert_array_equal(np.broadcast_to(
        full if per_head else full[:, None], (B, H, L, S)), p.mask.dense_bias(B, H, L, S))


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("native", [("top_left",), ("bottom_right",)])
def test_either_causal_flag_serves_when_lq_equals_lk(align, native):
    """Top-left and bottom-right causal are one mask when Lq == Lk: a library with either
    flag gets its flag; with Lq != Lk only the same alignment does, the other is folded."""
    square = make_problem(0, 2, 5, 5, mask=Mask(causal=True, causal_align=align))
    parts = adapters.split_mask(square, native_causal=native)
    assert parts.causal == native[0] and parts.mask is None and parts.only_causal
    np.testing.assert_array_equal(parts.allowed()[0, 0], adapters.causal_allowed(5, 5, align))
    wide = make_problem(0, 2, 3, 5, mask=Mask(causal=True, causal_align=align))
    parts = adapters.split_mask(wide, native_causal=native)
    assert parts.causal == (align if align == native[0] else None)
    np.testing.assert_array_equal(parts.allowed()[0, 0], adapters.causal_allowed(3, 5, align))


def test_the_mask_split_is_decided_per_problem():
    """A torch module whose causal flag applies only when no other mask is passed says so in
    ``mask_split_for``: the causal flag alone for a causal problem, one mask otherwise."""
    torch_common = pytest.importorskip("implementations.torch.common")

    class FlagOnlyAlone(torch_common.TorchModuleCore):
        def mask_split_for(self, problem):
            alone = problem.mask.kinds == {"causal"}
            return {**self.mask_split, "native_causal": ("top_left",) if alone else ()}

        def build(self, problem):
            return torch_common.torch.nn.Identity()

        def load_weights(self, module, problem):
            pass

    impl = FlagOnlyAlone()
    alone = make_problem(0, 2, 4, 4, mask=Mask(causal=True))
    both = make_problem(0, 2, 4, 4, mask=Mask(causal=True, valid_lens=np.array([4, 2])))
    assert impl.prepare(alone, "cpu", "float32")["mask"].only_causal
    parts = impl.prepare(both, "cpu", "float32")["mask"]
    assert parts.causal is None
    np.testing.assert_array_equal(parts.mask.numpy(), both.mask.dense_allowed(2, 1, 4, 4))


def test_the_mask_a_module_wrapper_receives_folds_into_a_tensor_on_its_device():
    """#42 item 3: ``MaskParts.additive()`` on the mask ``call`` receives returned a NumPy
    float64 array (106 cases errored when it went to torch); it is a tensor in the compute
    dtype now, the same values as the NumPy fold."""
    torch_common = pytest.importorskip("implementations.torch.common")
    torch = torch_common.torch

    class Plain(torch_common.TorchModuleCore):
        def build(self, problem):
            return torch.nn.Identity()

        def load_weights(self, module, problem):
            pass

    p = make_problem(0, 2, 3, 5, mask=Mask(valid_lens=np.array([5, 2]), causal=True,
                                           bias=np.full((1, 1, 3, 5), 0.5)))
    parts = Plain().prepare(p, "cpu", "float32")["mask"]
    folded = parts.additive()
    assert isinstance(folded, torch.Tensor) and folded.dtype == torch.float32, type(folded)
    want = adapters.split_mask(p, **Plain.mask_split).additive()
    np.testing.assert_array_equal(folded.numpy(), want.astype(np.float32))
    assert parts.additive(dtype=torch.float64).dtype == torch.float64
    out = torch.nn.functional.scaled_dot_product_attention(  # what a wrapper does with it
        *(torch.ones(2, 2, n, 4) for n in (3, 5, 5)), attn_mask=folded)
    assert out.shape == (2, 2, 3, 4)


def test_valid_lens_per_query_is_not_key_padding():
    p = make_problem(0, 2, 3, 5, mask=Mask(valid_lens=np.array([[5, 4, 3], [2, 2, 1]])))
    parts = adapters.split_mask(p, key_padding=True)
    assert parts.key_padding is None and parts.mask is not None
    np.testing.assert_array_equal(parts.allowed(), p.mask.dense_allowed(2, 1, 3, 5))


def test_additive_fill_and_dtype_are_the_callers():
    p = make_problem(0, 2, 3, 5, mask=Mask(valid_lens=np.array([5, 2]),
                                           bias=np.full((1, 1, 3, 5), 0.5)))
    fill = float(np.finfo(np.float16).min)
    add = adapters.additive_mask(p, fill=fill, dtype=np.float16)
    assert add.dtype == np.float16 and add.shape == (2, 1, 3, 5)
    np.testing.assert_array_equal(add[1, 0, :, 2:], fill)
    np.testing.assert_array_equal(add[1, 0, :, :2], np.float16(0.5))
    # With key padding split out, the fold holds only the bias.
    parts = adapters.split_mask(p, key_padding=True)
    np.testing.assert_array_equal(parts.additive(), np.full((2, 1, 3, 5), 0.5))
    assert adapters.additive_mask(make_problem(0)) is None


def test_dead_keys_and_fully_masked_rows():
    p = make_problem(0, 2, 3, 5, mask=Mask(valid_lens=np.array([5, 0])))
    parts = adapters.split_mask(p)
    np.testing.assert_array_equal(parts.dead_keys()[:, 0, :, 0], [[False] * 5, [True] * 5])
    np.testing.assert_array_equal(parts.fully_masked_rows()[:, 0], [[False] * 3, [True] * 3])
    assert adapters.split_mask(make_problem(0)).dead_keys() is None


def test_only_causal_and_bad_arguments():
    p = make_problem(0, mask=Mask(causal=True))
    assert adapters.split_mask(p).only_causal
    assert not adapters.split_mask(p, native_causal=()).only_causal
    with pytest.raises(ValueError, match="true_means"):
        adapters.split_mask(p, true_means="yes")
    with pytest.raises(ValueError, match="native_causal"):
        adapters.split_mask(p, native_causal="top_left")


# ---------------------------------------------------------------- attention from the parts

def _attention(q, k, v, allowed, bias, scale):
    """Plain NumPy attention over heads: q (B, H, L, D), k/v (B, H, S, D)."""
    s = q @ k.swapaxes(-1, -2) * scale + bias  # (B, H, L, S)
    s = np.where(allowed, s, -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(-1, keepdims=True)
    w = e / np.where(total > 0, total, 1)
    return w @ np.where(allowed.any(-2)[..., None], v, 0)  # (B, H, L, D)


def _from_parts(p, parts):
    """What a library given these parts computes: every part applied in its convention."""
    B, H, L, S = p.B, p.H, p.L, p.S
    allowed = np.ones((B, H, L, S), dtype=bool)
    attend = (lambda a: a) if parts.true_means == "attend" else (lambda a: ~a)
    if parts.key_padding is not None:
        allowed &= attend(parts.key_padding)[:, None, None, :]
    if parts.causal is not None:
        allowed &= adapters.causal_allowed(L, S, parts.causal)
    if parts.mask is not None:
        allowed &= attend(parts.mask) if parts.per_head else attend(parts.mask)[:, None]
    bias = np.zeros(())
    if parts.bias is not None:
        bias = parts.bias if parts.per_head else parts.bias[:, None]
    return allowed, bias


def _mha(p, allowed, bias, proj):
    """MHA with projections given as functions of (role, input) -> (B, len, width)."""
    B, L, S, H, K, D = p.B, p.L, p.S, p.H, p.K, p.D
    q = proj("q", p.query).reshape(B, L, H, D).transpose(0, 2, 1, 3)  # (B, H, L, D)
    k = proj("k", p.key).reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
    v = proj("v", p.value).reshape(B, S, K, D).transpose(0, 2, 1, 3)  # (B, K, S, D)
    k, v = np.repeat(k, H // K, axis=1), np.repeat(v, H // K, axis=1)  # (B, H, S, D)
    heads = _attention(q, k, v, allowed, bias, p.effective_scale)
    return proj("o", heads.transpose(0, 2, 1, 3).reshape(B, L, H * D))  # (B, L, E)


def _linear_proj(lin):
    def proj(role, x):
        y = x @ lin[role].weight.T  # nn.Linear: y = x W^T + b
        return y if lin[role].bias is None else y + lin[role].bias
    return proj


@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: c.name)
def test_attention_from_split_parts_matches_the_oracle(case):
    p = case.problem()
    want, _ = oracle(p)
    proj = _linear_proj(adapters.to_linear(p.weights))
    per_head = adapters.mask_heads(p.mask, p.H) != 1
    for true_means, native in (("attend", ("top_left",)), ("masked", ("bottom_right",))):
        parts = adapters.split_mask(p, true_means=true_means, native_causal=native,
                                    per_head=per_head)
        got = _mha(p, *_from_parts(p, parts), proj)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=true_means)
    # Everything folded into one additive mask (HF style) gives the same output, except
    # that an additive mask cannot hide NaN keys (NaN + -inf is NaN).
    if not np.isnan(p.key).any():
        got = _mha(p, np.ones((1, 1, 1, 1), dtype=bool), adapters.additive_mask(p), proj)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg="additive")


# ------------------------------------------------------------------------------- weights

WEIGHT_PROBLEMS = {
    "bias": make_problem(1, 2, 5, 7, 16, 4),
    "no_bias": make_problem(2, 2, 5, 7, 16, 4, bias=False),
    "gqa": make_problem(3, 2, 5, 7, 16, 4, 2),
}


def _einsum_proj(ein):
    def proj(role, x):
        if role == "o":  # x (B, L, H*D) -> (B, L, H, D) against kernel (H, D, E)
            kern = ein["o"].weight
            y = np.einsum("blhd,hde->ble", x.reshape(*x.shape[:2], *kern.shape[:2]), kern)
        else:
            y = np.einsum("ble,ehd->blhd", x, ein[role].weight)  # (B, L, H|K, D)
            y = y if ein[role].bias is None else y + ein[role].bias
            return y.reshape(*y.shape[:2], -1)
        return y if ein["o"].bias is None else y + ein["o"].bias
    return proj


def _conv1d_proj(conv):
    def proj(role, x):
        y = x @ conv[role].weight  # Conv1D: y = x W + b, W (in, out)
        return y if conv[role].bias is None else y + conv[role].bias
    return proj


def _packed_proj(packed, E):
    def proj(role, x):
        if role == "o":
            w, b = packed["out_proj_weight"], packed["out_proj_bias"]
        else:
            i = "qkv".index(role)
            w = packed["in_proj_weight"][i * E:(i + 1) * E]
            b = None if packed["in_proj_bias"] is None else packed["in_proj_bias"][i * E:(i + 1) * E]
        y = x @ w.T
        return y if b is None else y + b
    return proj


def _c_attn_proj(gpt, HD, KD):
    def proj(role, x):
        if role == "o":
            y = x @ gpt["c_proj"].weight
            return y if gpt["c_proj"].bias is None else y + gpt["c_proj"].bias
        y = x @ gpt["c_attn"].weight  # (B, L, HD + 2 KD), split into q, k, v
        y = y if gpt["c_attn"].bias is None else y + gpt["c_attn"].bias
        return np.split(y, [HD, HD + KD], axis=-1)["qkv".index(role)]
    return proj


def _layouts(p):
    w, HD, KD = p.weights, p.H * p.D, p.K * p.D
    out = {"linear": _linear_proj(adapters.to_linear(w)),
           "einsum": _einsum_proj(adapters.to_einsum(w, p.H, p.K)),
           "conv1d": _conv1d_proj(adapters.to_conv1d(w)),
           "conv1d_packed": _c_attn_proj(adapters.to_conv1d_packed(w), HD, KD)}
    if p.K == p.H:
        out["packed"] = _packed_proj(adapters.to_packed(w), p.E)
    return out


@pytest.mark.parametrize("name", WEIGHT_PROBLEMS)
def test_each_layout_reproduces_the_oracle(name):
    p = WEIGHT_PROBLEMS[name]
    want, _ = oracle(p)
    allowed = np.ones((1, 1, 1, 1), dtype=bool)
    for layout, proj in _layouts(p).items():
        np.testing.assert_allclose(_mha(p, allowed, np.zeros(()), proj), want, rtol=1e-10,
                                   atol=1e-12, err_msg=layout)


def test_layout_shapes():
    p = WEIGHT_PROBLEMS["gqa"]  # E 16, H 4, K 2, D 4
    ein = adapters.to_einsum(p.weights, 4, 2)
    assert ein["q"].weight.shape == (16, 4, 4) and ein["k"].weight.shape == (16, 2, 4)
    assert ein["q"].bias.shape == (4, 4) and ein["o"].weight.shape == (4, 4, 16)
    assert adapters.to_linear(p.weights)["k"].weight.shape == (8, 16)
    assert adapters.to_conv1d_packed(p.weights)["c_attn"].weight.shape == (16, 32)
    with pytest.raises(Unsupported, match="GQA"):
        adapters.to_packed(p.weights)
    with pytest.raises(ValueError, match="num_heads"):
        adapters.to_einsum(p.weights, 3)


def _round_trips(p):
    w, H, K = p.weights, p.H, p.K
    yield "linear", adapters.grads_from_linear(adapters.to_linear(w))
    yield "einsum", adapters.grads_from_einsum(adapters.to_einsum(w, H, K))
    yield "conv1d", adapters.grads_from_conv1d(adapters.to_conv1d(w))
    yield "conv1d_packed", adapters.grads_from_conv1d_packed(adapters.to_conv1d_packed(w), H, K)
    if K == H:
        yield "packed", adapters.grads_from_packed(adapters.to_packed(w))


@pytest.mark.parametrize("name", WEIGHT_PROBLEMS)
def test_gradient_names_map_back_exactly(name):
    """A layout is a rearrangement, so mapping the layout's own arrays back must give the
    canonical weights, every name and nothing else."""
    p = WEIGHT_PROBLEMS[name]
    want = {n: a for n, a in p.weights.as_dict().items() if a is not None}
    for layout, got in _round_trips(p):
        assert sorted(got) == sorted(want), layout
        assert set(got) <= set(GRAD_NAMES)
        for n in want:
            np.testing.assert_array_equal(got[n], want[n], err_msg=f"{layout} {n}")


@pytest.mark.parametrize("layout", ["linear", "packed", "einsum", "conv1d_packed"])
def test_gradients_through_a_layout_match_the_oracle(layout):
    """Autograd in the library's layout, mapped back, equals the oracle's canonical gradients."""
    torch = pytest.importorskip("torch")
    p = dataclasses.replace(WEIGHT_PROBLEMS["bias"], mask=Mask(causal=True))
    B, L, S, H, D, E = p.B, p.L, p.S, p.H, p.D, p.E
    t = {"linear": adapters.to_linear, "packed": adapters.to_packed,
         "einsum": lambda w: adapters.to_einsum(w, H),
         "conv1d_packed": adapters.to_conv1d_packed}[layout](p.weights)

    def leaf(a):
        return None if a is None else torch.tensor(np.array(a), requires_grad=True)

    params = {k: (Param(leaf(v.weight), leaf(v.bias)) if isinstance(v, Param) else leaf(v))
              for k, v in t.items()}
    x = {n: torch.tensor(getattr(p, n)) for n in ("query", "key", "value")}

    def proj(role, inp):
        if layout == "linear":
            return torch.nn.functional.linear(inp, params[role].weight, params[role].bias)
        if layout == "packed":
            if role == "o":
                return torch.nn.functional.linear(inp, params["out_proj_weight"],
                                                  params["out_proj_bias"])
            i = "qkv".index(role)
            return torch.nn.functional.linear(inp, params["in_proj_weight"][i * E:(i + 1) * E],
                                              params["in_proj_bias"][i * E:(i + 1) * E])
        if layout == "einsum":
            if role == "o":
                y = torch.einsum("blhd,hde->ble", inp.reshape(B, L, H, D), params["o"].weight)
                return y + params["o"].bias
            y = torch.einsum("ble,ehd->blhd", inp, params[role].weight) + params[role].bias
            return y.reshape(*y.shape[:2], -1)
        if role == "o":
            return inp @ params["c_proj"].weight + params["c_proj"].bias
        y = inp @ params["c_attn"].weight + params["c_attn"].bias
        return y.split(E, dim=-1)["qkv".index(role)]

    q = proj("q", x["query"]).reshape(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
    k = proj("k", x["key"]).reshape(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
    v = proj("v", x["value"]).reshape(B, S, H, D).transpose(1, 2)  # (B, H, S, D)
    heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = proj("o", heads.transpose(1, 2).reshape(B, L, H * D))  # (B, L, E)
    out.backward(torch.tensor(cotangent(p)))

    def grad(a):
        return None if a is None else a.grad.numpy()

    g = {k: (Param(grad(v.weight), grad(v.bias)) if isinstance(v, Param) else grad(v))
         for k, v in params.items()}
    got = {"linear": adapters.grads_from_linear, "packed": adapters.grads_from_packed,
           "einsum": adapters.grads_from_einsum,
           "conv1d_packed": lambda g: adapters.grads_from_conv1d_packed(g, H)}[layout](g)
    want = oracle_grads(p)
    for n in got:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-9, atol=1e-11, err_msg=n)


@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: c.name)
def test_attend_mask_is_the_canonical_mask(case):
    """What the adapter cores hand to ``attend``: the dense bias (-inf where masked), the
    allowed mask and the keys no query reads, each put through the caller's converters."""
    p = case.problem()
    B, H, L, S = p.B, p.H, p.L, p.S
    m = adapters.attend_mask(p, put_float=lambda a: a.astype(np.float32), put_bool=np.copy)
    assert m.bias.dtype == np.float32
    np.testing.assert_array_equal(np.broadcast_to(m.bias, (B, H, L, S)),
                                  p.mask.dense_bias(B, H, L, S).astype(np.float32))
    allowed = p.mask.dense_allowed(B, H, L, S)
    np.testing.assert_array_equal(np.broadcast_to(m.allowed, (B, H, L, S)), allowed)
    dead = ~allowed.any(axis=2)  # (B, H, S)
    if m.dead_keys is None:
        assert not dead.any()
    else:
        np.testing.assert_array_equal(np.broadcast_to(m.dead_keys[..., 0], (B, H, S)), dead)
    assert m.causal_only == (p.mask.kinds == {"causal"}) and m.kinds == p.mask.kinds
    assert adapters.attend_mask(make_problem(0)).bias is None


# --------------------------------------------------------------------------- mask forms

def _dense_from_form(form: adapters.FormMask, name: str, p, true_means: str) -> np.ndarray:
    """What a library computes from a form's parts: the additive (B, H, L, S) mask, with its
    own broadcasting (a 2-D mask over batch and heads, (B*H) split batch-major, ...)."""
    B, H, L, S = p.B, p.H, p.L, p.S
    parts = adapters.form_parts(name)
    out = np.zeros((B, H, L, S))

    def attend(a):
        return a if true_means == "attend" else ~a

    if form.attn is not None:
        a = form.attn
        a = a.reshape(B, H, L, S) if "BHxLS" in name.split("_", 1)[-1] else a
        a = a[:, None] if a.ndim == 3 else a  # (B, L, S) head-free
        out = out + (np.where(attend(a), 0.0, -np.inf) if a.dtype == bool else a)
    if form.key_padding is not None:
        kp = form.key_padding
        kp = np.where(attend(kp), 0.0, -np.inf) if kp.dtype == bool else kp
        out = out + kp[:, None, None, :]  # (B, 1, 1, S)
    if form.kv_lengths is not None:
        out = np.where(np.arange(S) < form.kv_lengths[:, None, None, None], out, -np.inf)
    if form.q_lengths is not None:
        out = np.where((np.arange(L) < form.q_lengths[:, None])[:, None, :, None], out, -np.inf)
    if form.query_mask is not None:
        out = np.where(form.query_mask[:, None, :, None], out, -np.inf)
    if "causal_flag" in parts:
        out = np.where(adapters.causal_allowed(L, S), out, -np.inf)
    if form.window is not None:  # query i attends keys i - left .. i + right
        j_minus_i = np.arange(S)[None, :] - np.arange(L)[:, None]  # (L, S)
        out = np.where((j_minus_i >= -form.window[0]) & (j_minus_i <= form.window[1]), out,
                       -np.inf)
    if form.chunk is not None:  # causal within chunks
        i, j = np.arange(L)[:, None], np.arange(S)[None, :]
        out = np.where((j <= i) & (i // form.chunk == j // form.chunk), out, -np.inf)
    return out


@pytest.mark.parametrize("form_case", mask_forms.CASES, ids=lambda c: c.form)
@pytest.mark.parametrize("true_means", ["attend", "masked"])
def test_form_mask_broadcasts_back_to_the_canonical_mask(form_case, true_means):
    """Each form's parts, broadcast as a library does, give exactly the canonical mask, and
    the attention mask keeps the form's own shape (nothing broadcast is materialised)."""
    p = form_case.problem()
    form = adapters.form_mask(adapters.with_form(p, form_case.form), true_means=true_means)
    expected = p.mask.dense_bias(p.B, p.H, p.L, p.S)  # (B, H, L, S)
    got = np.broadcast_to(_dense_from_form(form, form_case.form, p, true_means), expected.shape)
    np.testing.assert_array_equal(got, expected)
    shapes = {"BHLS": (2, 4, 9, 67), "B1LS": (2, 1, 9, 67), "11LS": (1, 1, 9, 67),
              "B11S": (2, 1, 1, 67), "BHL1": (2, 4, 9, 1), "LS": (9, 67), "BLS": (2, 9, 67),
              "BHxLS": (8, 9, 67)}
    attn = [x for x in adapters.form_parts(form_case.form) if x.split("_")[0] in ("bool", "float")]
    assert (form.attn is None) == (not attn)
    if attn:
        assert form.attn.shape == shapes[attn[0].split("_", 1)[1]]


def test_form_mask_refuses_a_mask_the_form_cannot_express():
    """A mask that varies over heads has no (L, S) form: Unsupported, naming the axis."""
    p = make_problem(0, 2, 5, 7, 16, 4, mask=Mask(allowed=np.random.default_rng(0).random(
        (2, 4, 5, 7)) < 0.7))
    with pytest.raises(Unsupported, match="varies along axis B"):
        adapters.form_mask(p, "bool_LS")
    with pytest.raises(Unsupported, match="no key lengths"):
        adapters.form_mask(p, "kpm_bool")
    with pytest.raises(ValueError, match="form: expected one of"):
        adapters.form_mask(p, "bool_XY")


def test_check_interface_refuses_unknown_mask_forms():
    from implementations.numpy.mha import NumpyMHA
    from suite.plugins.interface import check_interface

    bad = type("Bad", (NumpyMHA,), {"mask_forms": frozenset({"bool_LS", "bool_2d"})})
    with pytest.raises(TypeError, match=r"unknown mask forms \['bool_2d'\]"):
        check_interface(bad)
    check_interface(type("Good", (NumpyMHA,), {"mask_forms": frozenset({"bool_LS"})}))


def _buggy_library(q, k, v, allowed, scale):
    """A 'library' whose query-broadcast path is wrong: a mask with a query axis of 1 is
    applied to the first query row only (as a kernel that misreads a stride of 0 would)."""
    allowed = np.asarray(allowed, dtype=bool)
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if allowed.ndim == 4 and allowed.shape[2] == 1 and L > 1:
        row0 = np.broadcast_to(allowed, (B, H, 1, S))
        allowed = np.concatenate([row0, np.ones((B, H, L - 1, S), bool)], axis=2)
    scores = np.where(allowed, q @ k.transpose(0, 1, 3, 2) * scale, -np.inf)  # (B, H, L, S)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return (scores / scores.sum(-1, keepdims=True)) @ v  # (B, H, L, D)


def _buggy_plugin():
    from implementations.numpy.mha import NumpyCore

    class Buggy(NumpyCore):
        name = "buggy"
        features = frozenset({"valid_lens", "causal", "bool_mask", "cross", "scale"})
        mask_forms = frozenset({"bool_BHLS", "bool_B11S", "bool_LS"})

        def attend(self, q, k, v, mask, scale, need_weights):
            if mask.form_name:
                allowed = mask.form.attn
            elif mask.allowed is not None:
                allowed = mask.allowed  # the full (B, H, L, S) mask, as adapters pass it
            else:
                allowed = np.ones((1, 1, 1, 1), bool)
            return _buggy_library(q, k, v, allowed, scale), None

    return Buggy()


def test_a_library_broadcast_bug_is_caught_by_mask_forms_only():
    """The planted bug passes every masking case (their masks reach the library
    materialised in full) and fails the mask_forms case of the broken broadcast path."""
    from suite.conformance.judge import Outcome, run_case, run_problem

    impl = _buggy_plugin()
    spec_rows = ("nan_padding", "nan_padding_one_query", "fully_masked_valid_lens",
                 "fully_masked_bool_row")
    old = [run_case(impl, "buggy", "cpu", "float64", c) for c in cases.CASES
           if c.family == "masking" and c.name not in spec_rows]  # rows it has no policy for
    assert old and all(o.outcome in ("pass", "unsupported") for o in old), \
        [(o.case, o.outcome, o.reason) for o in old if o.outcome not in ("pass", "unsupported")]
    verdicts = {}
    for c in mask_forms.CASES:
        if c.form in impl.mask_forms:
            out = Outcome("buggy", "cpu", "float64", c.family, c.name, c.seed, "pass")
            verdicts[c.form] = run_problem(impl, out, adapters.with_form(c.problem(), c.form))
    assert verdicts["bool_B11S"].outcome == "fail", verdicts["bool_B11S"].reason
    assert verdicts["bool_BHLS"].outcome == verdicts["bool_LS"].outcome == "pass"


def test_numpy_core_hands_a_grouping_kernel_the_kv_heads_as_they_are():
    """A NumPy plugin that groups the query heads itself (``repeat_kv = False``) gets the K
    kv heads, so its own grouping is what the grouped-query cases judge (#52: NumpyCore
    repeated them whatever ``repeat_kv`` said, and a wrong grouping passed)."""
    from implementations.numpy.mha import NumpyMHA
    from suite.conformance.judge import run_case

    seen = []

    class Grouped(NumpyMHA):
        name, repeat_kv = "grouped", False

        def attend(self, q, k, v, mask, scale, need_weights):
            seen.append(k.shape[1])
            heads = self.heads(q.shape[1], k.shape[1])
            return super().attend(q, k[:, heads], v[:, heads], mask, scale, need_weights)

        def heads(self, H, K):  # query head h reads kv head h // (H // K)
            return np.arange(H) // (H // K)

    class Interleaved(Grouped):  # query head h reads kv head h % K: the wrong grouping
        name = "interleaved"

        def heads(self, H, K):
            return np.arange(H) % K

    (case,) = [c for c in cases.CASES if c.family == "shapes" and c.name == "gqa"]
    assert run_case(Grouped(), "grouped", "cpu", "float64", case).outcome == "pass"
    assert seen and all(K < case.problem_for("float64").H for K in seen), seen
    assert run_case(Interleaved(), "interleaved", "cpu", "float64", case).outcome == "fail"
