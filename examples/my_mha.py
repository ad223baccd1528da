"""A whole MHA written from scratch, registered with `mha-suite check --plugin examples/my_mha.py`."""

import numpy as np

from suite.plugins.interface import Implementation, Result


class MyMHA(Implementation):
    name = "mine.mha"
    framework = "numpy"
    features = frozenset({"valid_lens", "causal", "cross"})  # what this code handles

    def dtypes(self, device):
        return ("float32", "float64")

    def prepare(self, problem, device, dtype, *, need_weights=False, grad=False):
        # Untimed: cast inputs and weights once.
        cast = lambda a: None if a is None else a.astype(dtype)  # noqa: E731
        w = {k: cast(v) for k, v in problem.weights.as_dict().items()}
        return problem, w, cast(problem.query), cast(problem.key), cast(problem.value)

    def run(self, state):
        p, w, x_q, x_k, x_v = state
        B, L, S, H, D = p.B, p.L, p.S, p.H, p.D
        bias = lambda b: 0 if b is None else b  # noqa: E731
        q = (x_q @ w["w_q"] + bias(w["b_q"])).reshape(B, L, H, D).transpose(0, 2, 1, 3)
        k = (x_k @ w["w_k"] + bias(w["b_k"])).reshape(B, S, H, D).transpose(0, 2, 1, 3)
        v = (x_v @ w["w_v"] + bias(w["b_v"])).reshape(B, S, H, D).transpose(0, 2, 1, 3)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)  # (B, H, L, S)
        visible = np.ones((B, 1, L, S), dtype=bool)
        if p.mask.valid_lens is not None:
            vl = np.asarray(p.mask.valid_lens).reshape(B, -1)  # (B, 1) or (B, L)
            visible &= (np.arange(S) < vl[:, :, None])[:, None]
        if p.mask.causal:
            visible &= np.arange(S) <= np.arange(L)[:, None]
        scores = np.where(visible, scores, -np.inf)
        top = np.max(scores, axis=-1, keepdims=True)
        e = np.exp(scores - np.where(np.isfinite(top), top, 0))
        total = e.sum(-1, keepdims=True)
        weights = e / np.where(total > 0, total, 1)  # a row with no visible key stays 0
        heads = weights @ np.where(visible.any(2)[..., None], v, 0)  # (B, H, L, D)
        return heads.transpose(0, 2, 1, 3).reshape(B, L, H * D) @ w["w_o"] + bias(w["b_o"])

    def fetch(self, state, out):
        return Result(out.astype(np.float64))
