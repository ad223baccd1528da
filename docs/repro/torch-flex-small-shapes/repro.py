"""Reproducer: torch.flex (torch 2.13.0+cpu) on case shapes/no_projection_bias, float32 on cpu.

Written by `mha-suite repro`; needs only NumPy and the library. The arrays in inputs.npz
are exactly what the implementation passed to the library: q (B, H, L, D), k and v
(B, H|K, S, D), allowed (True = may attend) and bias (added to the logits), or none.
"""
from pathlib import Path

import numpy as np
import torch
from torch.nn.attention.flex_attention import flex_attention

flex = torch.compile(flex_attention, dynamic=False)


def attend(q, k, v, allowed, bias, scale):
    t = lambda a: torch.from_numpy(a).to(DEVICE, getattr(torch, DTYPE))  # noqa: E731
    kw = {"scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
    if bias is not None:
        B, Hm, L, S = bias.shape
        flat_bias = t(bias).reshape(-1)
        flat_allowed = torch.from_numpy(allowed).to(DEVICE).expand(B, Hm, L, S).reshape(-1)

        def score_mod(score, b, h, q_idx, kv_idx):
            i = ((b * Hm + (h if Hm > 1 else 0)) * L + q_idx) * S + kv_idx
            return torch.where(flat_allowed[i], score + flat_bias[i], float("-inf"))

        kw["score_mod"] = score_mod
    return flex(t(q), t(k), t(v), **kw).to("cpu", torch.float64).numpy()


DTYPE = "float32"  # the arrays are saved in float64 and go to the library in this dtype
DEVICE = "cpu"

data = np.load(Path(__file__).with_name("inputs.npz"))
allowed = data["allowed"] if "allowed" in data else None
bias = data["bias"] if "bias" in data else None
for run in range(2):
    heads = np.asarray(attend(data["q"], data["k"], data["v"], allowed, bias,
                              float(data["scale"])), dtype=np.float64)
    err = np.abs(heads - data["expected"])
    print(f"run {run + 1}: max abs error vs the float64 oracle "
          f"{np.nanmax(err) if not np.isnan(heads).all() else float('nan'):.3g}, "
          f"{int(np.isnan(heads).sum())} NaN of {heads.size} "
          f"(the plain algorithm in float32: {float(data['naive_err']):.3g})")
