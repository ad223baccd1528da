"""TorchModuleCore's weight paths: nested modules, a fused q/k/v layer, 1x1 convolutions on
an NCHW map, and einsum-layout parameters of a multi-query module; each loads the canonical
weights so the module computes the oracle's answer, and maps its gradients back."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from suite.plugins import adapters
from suite.plugins.interface import Unsupported
from suite.spec.oracle import oracle
from suite.spec.oracle_grad import grads as oracle_grads
from suite.spec.problem import make_problem

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from examples.my_attention import MyAttention  # noqa: E402
from examples.my_conv_attention import ConvAttention  # noqa: E402
from implementations.torch.common import Einsum, TorchModuleCore  # noqa: E402


def _run(impl, p, grad=False):
    state = impl.prepare(p, "cpu", "float64", grad=grad)
    return impl.fetch(state, impl.run(state))


def test_rearrange_moves_heads_and_drops_a_single_kv_head():
    w = np.arange(2 * 3 * 4).reshape(2, 12)  # (e, (h d)) with h = 3, d = 4
    hde = adapters.rearrange(w, "e (h d)", "h d e", h=3)
    assert hde.shape == (3, 4, 2) and hde[1, 2, 0] == w[0, 1 * 4 + 2]
    assert np.array_equal(adapters.rearrange(hde, "h d e", "e (h d)"), w)
    single = np.arange(8).reshape(2, 4)  # (e, (h d)) with h = 1
    assert np.array_equal(adapters.rearrange(single, "e (h d)", "e d", h=1), single)
    with pytest.raises(ValueError, match="'h'"):  # three heads cannot be dropped
        adapters.rearrange(w, "e (h d)", "e d", h=3)


class Block(nn.Module):  # the attention nested one level down, as in a transformer block
    def __init__(self, E, H, bias):
        super().__init__()
        self.attn = MyAttention(E, H, bias=bias)

    def forward(self, q, k, v, mask=None):
        return self.attn(q, k, v, mask=mask)


class Nested(TorchModuleCore):
    name = "nested"
    layers = {r: f"attn.{n}" for r, n in zip("qkvo", ("q_proj", "k_proj", "v_proj", "out_proj"))}

    def build(self, p):
        return Block(p.E, p.H, bias=True)

    def call(self, module, query, key, value, mask, need_weights):
        return module(query, key, value)


def test_dotted_paths_load_and_read_back_nested_layers():
    p = make_problem(1, B=2, L=5, S=7, E=12, H=3)
    res = _run(Nested(), p, grad=True)
    assert np.allclose(res.output, oracle(p)[0], atol=1e-10)
    want = oracle_grads(p)
    for name in ("query", "key", "w_q", "w_k", "w_v", "w_o", "b_q", "b_v", "b_o"):
        assert np.allclose(res.grads[name], want[name], atol=1e-9), name


class Conv(TorchModuleCore):
    name = "conv"
    features = frozenset({"grad"})
    image_input = True
    layers = {"qkv": "qkv", "o": "proj"}

    def build(self, p):
        return ConvAttention(p.E, p.H)

    def call(self, module, query, key, value, mask, need_weights):
        assert query.shape[1] == module.qkv.in_channels  # NCHW: channels second
        return module(query), None


@pytest.mark.parametrize("L", [12, 7])  # a 3x4 map and a prime length (1x7)
def test_nchw_module_with_fused_1x1_convolutions_matches_the_oracle(L):
    p = make_problem(2, B=2, L=L, E=8, H=2, self_attention=True)
    assert np.allclose(_run(Conv(), p).output, oracle(p)[0], atol=1e-10)


def test_an_image_module_takes_every_case_in_its_self_attention_form():
    """#42 item 4: image_input without kv_source = "self" left 110 of 172 cases per name
    unsupported as cross-attention; image_input implies it, and an explicit one stays."""
    from suite.plugins.interface import declared, expressible

    assert declared(Conv(), "kv_source") == "self"
    cross = make_problem(2, B=2, L=6, S=6, E=8, H=2)  # distinct key and value
    p = expressible(Conv(), cross)  # not Unsupported: key = value = query
    assert np.array_equal(p.key, p.query) and np.array_equal(p.value, p.query)

    class Shared(Conv):
        kv_source = "shared"

    assert declared(Shared(), "kv_source") == "shared"


def test_fused_qkv_rows_are_q_then_k_then_v():
    """The module reading its fused rows in another order is caught: the rows are fixed."""
    class SwapsQK(ConvAttention):
        def forward(self, x):
            w = self.qkv.weight.data
            self.qkv.weight.data = torch.cat([w[8:16], w[:8], w[16:]])
            return super().forward(x)

    class Wrong(Conv):
        def build(self, p):
            return SwapsQK(p.E, p.H)

    p = make_problem(2, B=2, L=12, E=8, H=2, self_attention=True)
    assert not np.allclose(_run(Wrong(), p).output, oracle(p)[0], atol=1e-3)


def test_nchw_module_takes_self_attention_only_and_gives_no_input_gradients():
    with pytest.raises(Unsupported, match="attends itself"):
        _run(Conv(), make_problem(2, B=2, L=6, E=8, H=2))
    with pytest.raises(Unsupported, match="sum of the query"):
        _run(Conv(), make_problem(2, B=2, L=6, E=8, H=2, self_attention=True), grad=True)


def test_image_layout_is_row_major_over_the_map():
    a = np.arange(2 * 6 * 3).reshape(2, 6, 3)  # (B, L, E)
    img = adapters.to_image(a)
    assert img.shape == (2, 3, 2, 3) and img[1, 2, 1, 0] == a[1, 3, 2]
    assert np.array_equal(adapters.from_image(img), a)


class MultiQueryV2(nn.Module):
    """timm's MultiQueryAttentionV2 layout: bare einsum parameters, one kv head, no biases
    (with the 1/sqrt(d) scale, so the canonical problem applies)."""

    def __init__(self, E, H, D):
        super().__init__()
        self.query_proj = nn.Parameter(torch.randn(H, D, E))
        self.key_proj = nn.Parameter(torch.randn(E, D))
        self.value_proj = nn.Parameter(torch.randn(E, D))
        self.out_proj = nn.Parameter(torch.randn(E, H, D))

    def forward(self, x, m):
        q = torch.einsum("bnd,hkd->bnhk", x, self.query_proj)
        k = torch.einsum("bmd,dk->bmk", m, self.key_proj)
        attn = (torch.einsum("bnhk,bmk->bnhm", q, k) * q.shape[-1] ** -0.5).softmax(-1)
        o = torch.einsum("bnhm,bmv->bnhv", attn, torch.einsum("bmd,dv->bmv", m, self.value_proj))
        return torch.einsum("bnhv,dhv->bnd", o, self.out_proj)


class MQA(TorchModuleCore):
    name = "mqa"
    layers = {"q": Einsum("query_proj", "h d e"), "k": Einsum("key_proj", "e d"),
              "v": Einsum("value_proj", "e d"), "o": Einsum("out_proj", "e h d")}

    def build(self, p):
        return MultiQueryV2(p.E, p.H, p.D)

    def call(self, module, query, key, value, mask, need_weights):
        return module(query, key), None


def test_einsum_parameters_of_a_multi_query_module_load_and_map_gradients_back():
    p = make_problem(3, B=2, L=5, S=6, E=12, H=3, K=1, bias=False)
    p = dataclasses.replace(p, value=p.key)  # the module reads keys and values from one map
    res = _run(MQA(), p, grad=True)
    assert np.allclose(res.output, oracle(p)[0], atol=1e-10)
    want = oracle_grads(p)
    for name in ("w_q", "w_k", "w_v", "w_o", "query"):  # ("key" is the sum through k and v)
        assert np.allclose(res.grads[name], want[name], atol=1e-9), name
    with pytest.raises(Unsupported, match="no bias"):  # bare parameters, no bias path
        _run(MQA(), make_problem(3, B=2, L=5, S=6, E=12, H=3, K=1))


def test_read_weights_reads_nested_fused_layers_back_as_loaded():
    """read_weights follows ``layers`` as load_weights does (dotted paths, a fused qkv): the
    round trip of a nested, fused module holds, and a wrong fused order is caught."""
    import torch

    from implementations.torch.common import TorchModuleCore
    from suite.spec.problem import make_problem

    class Block(torch.nn.Module):
        def __init__(self, E):
            super().__init__()
            self.attn = torch.nn.Module()
            self.attn.qkv = torch.nn.Linear(E, 3 * E)
            self.attn.proj = torch.nn.Linear(E, E)

    class Nested(TorchModuleCore):
        name = "nested"
        layers = {"qkv": "attn.qkv", "o": "attn.proj"}

        def build(self, p):
            return Block(p.E)

    p = make_problem(0, B=1, L=3, E=8, H=2)
    assert Nested().check_wrapper(p) == []

    class Swapped(Nested):
        def load_weights(self, module, problem):
            super().load_weights(module, problem)
            with torch.no_grad():  # q and k rows exchanged: the wrapper's own mistake
                w = module.attn.qkv.weight
                w.copy_(torch.cat([w[8:16], w[:8], w[16:]]))

    wrong = Swapped().check_wrapper(p)
    assert [m.split(":")[0] for m in wrong] == ["w_q", "w_k"], wrong


def test_a_layer_the_module_lacks_is_named_with_its_entry():
    class Wrong(Nested):  # the output projection's name left at the default
        layers = {**Nested.layers, "o": "out_proj"}

    p = make_problem(1, B=2, L=5, S=7, E=12, H=3)
    with pytest.raises(ValueError, match=r"layers\['o'\] = 'out_proj': Block has no such "
                                         r"submodule .*attn\.out_proj"):
        _run(Wrong(), p)


def test_read_only_weights_load_without_torch_warning(recwarn):
    p = make_problem(1, B=2, L=5, S=7, E=12, H=3)
    for a in p.weights.as_dict().values():  # as a cached or replayed problem holds them
        if a is not None:
            a.flags.writeable = False
    res = _run(Nested(), p)
    assert np.allclose(res.output, oracle(p)[0], atol=1e-10)
    assert not [w for w in recwarn if "not writable" in str(w.message)]


def test_torch_nn_loads_read_only_weights_without_a_warning():
    """A problem's cached arrays are read-only; nn.MultiheadAttention's loader copies them
    (torch.as_tensor of one warns once a process that writing would be undefined, a line a
    user's run printed for nothing). In a process of its own: torch warns only once."""
    import subprocess
    import sys
    from pathlib import Path

    code = """
import warnings
import numpy as np
import torch
from implementations.torch.nn import TorchNN
from suite.spec.problem import make_problem
p = make_problem(0, B=1, L=3, E=8, H=2)
for a in vars(p.weights).values():
    if isinstance(a, np.ndarray):
        a.setflags(write=False)
impl = TorchNN()
with warnings.catch_warnings(), torch.no_grad():
    warnings.simplefilter("error")
    impl.load_weights(impl.build(p), p)
print("loaded")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(Path(__file__).resolve().parents[1]))
    assert proc.returncode == 0 and proc.stdout.strip() == "loaded", proc.stderr[-2000:]
