"""The gradient oracle against finite differences of the forward oracle and torch autograd."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from suite.spec.oracle import oracle
from suite.spec.oracle_grad import grads, naive_grads
from suite.spec.problem import Mask, cotangent, make_problem

PROBLEMS = {
    "plain": make_problem(1, 2, 3, 4, 8, 2),
    "gqa_causal_padding": make_problem(2, 2, 4, 4, 8, 4, 2, mask=Mask(
        valid_lens=np.array([4, 2]), causal=True)),
    "bias_bottom_right": make_problem(3, 1, 3, 5, 6, 3, mask=Mask(
        bias=np.linspace(-1, 1, 15).reshape(3, 5), causal=True, causal_align="bottom_right")),
}


def _loss(p) -> float:
    return float((oracle(p)[0] * cotangent(p)).sum())


def _perturbed(p, name, idx, h):
    if name in ("query", "key", "value"):
        arr = getattr(p, name).copy()
        arr[idx] += h
        return dataclasses.replace(p, **{name: arr})
    arr = getattr(p.weights, name).copy()
    arr[idx] += h
    return dataclasses.replace(p, weights=dataclasses.replace(p.weights, **{name: arr}))


@pytest.mark.parametrize("which", sorted(PROBLEMS))
def test_grads_match_central_differences(which):
    p = PROBLEMS[which]
    g = grads(p)
    rng = np.random.default_rng(0)
    h = 1e-6
    for name, dx in g.items():
        assert dx.shape == (getattr(p, name) if name in ("query", "key", "value")
                            else getattr(p.weights, name)).shape
        for _ in range(4):
            idx = tuple(rng.integers(0, n) for n in dx.shape)
            fd = (_loss(_perturbed(p, name, idx, h)) - _loss(_perturbed(p, name, idx, -h))) / (2 * h)
            assert abs(fd - dx[idx]) <= 1e-6 * max(1, abs(fd)), (name, idx, fd, dx[idx])


def test_grads_match_torch_autograd_float64():
    torch = pytest.importorskip("torch")
    p = PROBLEMS["gqa_causal_padding"]
    leaves = {n: torch.tensor(getattr(p, n), requires_grad=True) for n in ("query", "key", "value")}
    leaves.update({n: torch.tensor(a, requires_grad=True) for n, a in p.weights.as_dict().items()})
    B, L, S, H, K, D = p.B, p.L, p.S, p.H, p.K, p.D
    q = (leaves["query"] @ leaves["w_q"] + leaves["b_q"]).view(B, L, H, D).transpose(1, 2)
    k = (leaves["key"] @ leaves["w_k"] + leaves["b_k"]).view(B, S, K, D).transpose(1, 2)
    v = (leaves["value"] @ leaves["w_v"] + leaves["b_v"]).view(B, S, K, D).transpose(1, 2)
    k, v = k.repeat_interleave(H // K, 1), v.repeat_interleave(H // K, 1)
    allowed = torch.tensor(p.mask.dense_allowed(B, H, L, S))
    logits = (q @ k.transpose(-1, -2) * p.effective_scale).masked_fill(~allowed, -torch.inf)
    heads = torch.softmax(logits, -1).nan_to_num(0.0) @ v
    out = heads.transpose(1, 2).reshape(B, L, H * D) @ leaves["w_o"] + leaves["b_o"]
    (out * torch.tensor(cotangent(p))).sum().backward()
    for name, dx in grads(p).items():
        np.testing.assert_allclose(dx, leaves[name].grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)


def test_causality_through_gradients():
    """Under a causal mask, a cotangent on rows <= i gives exactly zero grads for rows > i."""
    p = make_problem(4, 1, 6, 6, 8, 2, mask=Mask(causal=True))
    g = cotangent(p).copy()
    g[:, 3:] = 0
    d = grads(dataclasses.replace(p, grad_output=g))
    for name in ("query", "key", "value"):
        assert np.all(d[name][:, 3:] == 0), name
        assert np.any(d[name][:, :3] != 0), name


def test_naive_grads_are_rounded():
    p = PROBLEMS["plain"]
    ref = grads(p)
    err16 = max(np.abs(naive_grads(p, "float16")[0][n] - ref[n]).max() for n in ref)
    err32 = max(np.abs(naive_grads(p, "float32")[0][n] - ref[n]).max() for n in ref)
    assert 0 < err32 < err16
