"""torch.compile of the eager implementation, and FlexAttention, where they work here.

Compilation happens in ``prepare`` (a warm call, untimed); its seconds go to
``state["compile_s"]``. Compiled callables are cached per shape and dtype, so a
second prepare of the same shape does not recompile.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

import torch

from implementations.torch_common import TorchCore, TorchMask, masked_softmax, zero_dead_values
from implementations.torch_eager import TorchEager


class TorchCompiled(TorchEager):
    """``torch.compile`` of torch.eager's attention core (inductor, static shapes)."""

    name = "torch.compile"
    features = TorchEager.features - {"weights"}

    def __init__(self) -> None:
        self._compiled = torch.compile(self._core)  # shapes become dynamic after a recompile
        self._seen: set = set()

    @staticmethod
    def _core(q, k, v, bias, allowed, dead, scale: float):
        scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, L, S)
        if bias is not None:
            scores = (scores + bias).masked_fill(~allowed, float("-inf"))
        if dead is not None:
            v = v.masked_fill(dead, 0.0)
        return masked_softmax(scores) @ v  # (B, H, L, D)

    def attend(self, q, k, v, mask: TorchMask, scale: float, need_weights: bool):
        dead = mask.dead_keys
        if dead is not None and dead.shape[1] not in (1, v.shape[1]):
            v = zero_dead_values(v, mask)
            dead = None
        return self._compiled(q, k, v, mask.bias, mask.allowed, dead, scale), None

    def after_prepare(self, state: Dict[str, Any]) -> None:
        p = state["p"]
        key = (p.B, p.L, p.S, p.H, p.K, p.D, str(state["tensors"]["query"].dtype),
               tuple(sorted(p.mask.kinds)), state["grad"])
        if key in self._seen:
            state["compile_s"] = 0.0
            return
        start = time.perf_counter()
        self.run(state)  # the first call compiles
        self.synchronize(state)
        state["compile_s"] = time.perf_counter() - start
        self._seen.add(key)


class TorchFlex(TorchCore):
    """FlexAttention (``torch.nn.attention.flex_attention``) with the mask as a score_mod."""

    name = "torch.flex"
    features = frozenset({"valid_lens", "causal", "causal_bottom_right", "bool_mask", "bias",
                          "cross", "gqa", "scale"})
    repeat_kv = False

    def dtypes(self, device: str):
        # On the CPU FlexAttention takes float32/16 and bfloat16 only (measured, torch 2.13).
        return ("float32", "float16", "bfloat16")

    def __init__(self) -> None:
        from torch.nn.attention.flex_attention import flex_attention

        self._flex = torch.compile(flex_attention)
        self._seen: set = set()

    def attend(self, q, k, v, mask: TorchMask, scale: float, need_weights: bool):
        kw: Dict[str, Any] = {"scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
        if mask.bias is not None:
            bias = mask.bias  # (B, H|1, L, S), -inf where masked
            per_head = bias.shape[1] != 1

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + bias[b, h if per_head else 0, q_idx, kv_idx]

            kw["score_mod"] = score_mod
            v = zero_dead_values(v, mask)
        return self._flex(q, k, v, **kw), None

    def after_prepare(self, state: Dict[str, Any]) -> None:
        p = state["p"]
        key = (p.B, p.L, p.S, p.H, p.K, p.D, str(state["tensors"]["query"].dtype),
               tuple(sorted(p.mask.kinds)))
        if key in self._seen:
            state["compile_s"] = 0.0
            return
        start = time.perf_counter()
        self.run(state)
        state["compile_s"] = time.perf_counter() - start
        self._seen.add(key)


def variants() -> List[type]:
    """The compiled variants, where their prerequisites are present.

    Cheap checks only (a real compile takes seconds, too long for every ``list``): inductor
    on the CPU needs a C++ compiler; FlexAttention needs torch >= 2.5. A compile that then
    fails shows as an error of that implementation, not a crash.
    """
    import shutil

    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        return []
    # TorchFlex is not registered yet: on the CPU with torch 2.13, inductor fails to compile
    # (CppCompileError) a score_mod that reads a bias tensor, and NaN padding leaks through.
    return [TorchCompiled]
