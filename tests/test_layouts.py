"""The layouts family: the kernel gets each memory layout, a kernel blind to strides fails
there and only there, and a layout a plugin does not declare is unsupported."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from implementations.torch.common import arrange, arrange_mask, translate_mask
from implementations.torch.eager import TorchEager
from suite.conformance import catalog
from suite.conformance.judge import Outcome
from suite.spec.layouts import LAYOUTS, requested_layout, with_layout
from suite.spec.problem import make_problem
from tests.conftest import PLUGINS


def _run(impl, name: str, dtype: str = "float32") -> Outcome:
    c = catalog.get("layouts", name)
    return c.run(impl, Outcome(impl.name, "cpu", dtype, c.family, c.name, c.seed, "pass"))


@pytest.mark.parametrize("layout", sorted(set(LAYOUTS) - {"expanded"}))
def test_arrange_keeps_the_values_and_gives_the_layout(layout):
    x = torch.randn(2, 3, 5, 4)
    y = arrange(x, layout)
    assert torch.equal(x, y) and y.shape == x.shape
    strided = {"contiguous": y.is_contiguous(),
               "transposed": not y.is_contiguous() and y.stride(-1) == 1 and y.stride(2) == 3 * 4,
               "last_strided": y.stride(-1) == 5,
               "channels_last": y.stride(1) == 1 and y.stride(-1) == 3,
               "sliced": y.storage_offset() > 0 and y.stride(-2) > 4}
    assert strided[layout], (layout, y.stride(), y.storage_offset())


def test_the_kernel_receives_the_layout_the_case_asks_for():
    seen = {}

    class Spy(TorchEager):
        name = "spy"
        layouts = frozenset(LAYOUTS)

        def attend(self, q, k, v, mask, scale, need_weights):
            seen.update(q=q.stride(), k=k.stride(), bias=None if mask.bias is None
                        else mask.bias.stride())
            return super().attend(q, k, v, mask, scale, need_weights)

    assert _run(Spy(), "last_strided+bias").outcome == "pass"
    assert seen["q"][-1] != 1 and seen["k"][-1] != 1 and seen["bias"][-1] != 1
    assert _run(Spy(), "expanded+bias").outcome == "pass"  # one kv head, H = 4
    assert seen["k"][1] == 0 and seen["bias"][1] == 0  # stride-0 heads, kv and mask


def test_a_stride_blind_kernel_fails_every_strided_layout_and_only_those():
    sys.path.insert(0, str(PLUGINS))
    from stride_blind import StrideBlind

    outcomes = {c.name: _run(StrideBlind(), c.name).outcome
                for c in catalog.of_family("layouts")}
    assert {n for n, o in outcomes.items() if o == "pass"} == {
        "contiguous", "contiguous+bias", "contiguous+causal"}, outcomes
    assert all(o == "fail" for n, o in outcomes.items() if not n.startswith("contiguous")), \
        outcomes


def test_a_layout_not_declared_is_unsupported_with_its_name():
    sys.path.insert(0, str(PLUGINS))
    from stride_blind import ContiguousOnly

    out = _run(ContiguousOnly(), "sliced+bias")
    assert out.outcome == "unsupported" and "layout sliced" in out.reason
    assert _run(ContiguousOnly(), "contiguous+bias").outcome == "pass"


def test_a_mask_is_arranged_like_the_inputs_and_broadcast_with_stride_0():
    p = with_layout(make_problem(0, 2, 3, 5, 8, 2, mask=dict_mask()), "expanded")
    m = arrange_mask(translate_mask(p, torch.device("cpu"), torch.float32), p)
    assert m.bias.shape[1] == 2 and m.bias.stride(1) == 0
    assert requested_layout(p) == "expanded" and requested_layout(p.__class__.__mro__[1](
        **{f: getattr(p, f) for f in ("query", "key", "value", "weights", "num_heads")})) is None
    with pytest.raises(ValueError, match="layout: expected one of"):
        with_layout(p, "diagonal")


def dict_mask():
    from suite.spec.problem import Mask
    keep = np.ones((2, 1, 3, 5), bool)
    keep[..., 1] = False
    return Mask(allowed=keep)


def test_a_module_wrapper_declaring_layouts_is_unsupported_not_passed():
    """Only a kernel core (TorchCore.attend) is handed rearranged tensors: a module wrapper
    that declares layouts passed all 15 cases with its inputs never rearranged."""
    from implementations.torch.nn import TorchNN

    class Declares(TorchNN):
        name = "torch.nn+layouts"
        layouts = frozenset(LAYOUTS)

    outcomes = {c.name: _run(Declares(), c.name) for c in catalog.of_family("layouts")}
    passed = {n for n, o in outcomes.items() if o.outcome == "pass"}
    assert passed == {"contiguous", "contiguous+bias", "contiguous+causal"}, passed
    assert all(o.outcome == "unsupported" for n, o in outcomes.items() if n not in passed)
    # (expanded: one kv head, which torch.nn does not declare: "needs gqa" before the layout)
    assert all("module wrapper" in o.reason for n, o in outcomes.items()
               if n not in passed and not n.startswith("expanded"))


def test_a_plugin_that_declares_layouts_and_ignores_the_request_fails():
    """A kernel core whose plugin drops the requested layout (its kernel gets the core's own
    views, the same values) passed all 18 cases: the judge now reads the strides its
    ``attend`` receives. Its own views are the transposed layout, which it does receive."""
    sys.path.insert(0, str(PLUGINS))
    from stride_blind import IgnoresLayout

    outcomes = {c.name: _run(IgnoresLayout(), c.name) for c in catalog.of_family("layouts")}
    passed = {n for n, o in outcomes.items() if o.outcome == "pass"}
    assert passed == {f"{layout}{kind}" for layout in ("contiguous", "transposed")
                      for kind in ("", "+bias", "+causal")}, passed
    assert all(o.outcome == "fail" and "its kernel received" in o.reason
               for n, o in outcomes.items() if n not in passed)
